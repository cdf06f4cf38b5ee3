"""MCP OAuth routes: finish an authorization on any replica; list and disconnect yours.

``GET /mcp/oauth/callback`` is where the authorization server sends the
browser back. It refuses malformed parameters (400), finds the pending
authorization by ``state`` alone (the redirect carries nothing else), consumes
it (a state works once), checks the RFC 9207 ``iss``, exchanges the code with
the stored verifier at the stored token endpoint, stores the tokens and shows a
page saying it worked, or why not in plain words (the details go to the log,
under the reference the page shows).

The ``code`` and ``state`` of a callback are credentials for a moment:
``install_mcp_oauth`` also puts a filter on uvicorn's access log that redacts them.
"""

from __future__ import annotations

import html
import logging
import re
import secrets
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import unquote, unquote_plus

from fastapi import APIRouter, FastAPI, Path, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from tether.adapters.mcp.encryption import MCPOAuthEncryptionNotConfiguredError
from tether.adapters.mcp.runtime import CALLBACK_PATH, MCPOAuthRuntimeMiddleware
from tether.adapters.mcp.store import MCPOAuthIntegrationStore
from tether.adapters.mcp.token_client import MCPOAuthTokenClient, MCPOAuthTokenError
from tether.api.forms import ErrorBody
from tether.api.identity import AUTH_RESPONSES, AUTHENTICATED, request_identity
from tether.api.ids import ID_PATTERN, MAX_ID_LENGTH, TenantQuery
from tether.domain.chat_conversation_store import normalize_owner
from tether.domain.store_errors import StoreError
from tether.handlers.errors import NotImplementedByStoreError, TurnNotFoundError

logger = logging.getLogger(__name__)

# The callback is reached by a browser redirect, which carries no identity: it is
# authorized by its single-use ``state``. The integration routes act for the
# requester and authenticate like the chat routes.
router = APIRouter(tags=["mcp"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    **{code: {"model": ErrorBody} for code in (404, 501)},
}
# Lengths and characters are checked in the handler, so that anything malformed is
# a 400 page like every other refusal (never a 422, never a store's error).
_Param = Annotated[str | None, Query()]
_STATE = re.compile(r"[A-Za-z0-9._~-]+")
"""RFC 3986 unreserved characters: our states are ``secrets.token_urlsafe``."""
_PRINTABLE = re.compile(r"[\x20-\x7e]+")
"""RFC 6749 VSCHAR: what a code (and an error code, an issuer) may hold."""
_TEXT = re.compile(r"[^\x00-\x1f\x7f]+")
"""Anything but control characters: a description is shown to the user, escaped."""
_PATTERNS = {"state": _STATE, "error_description": _TEXT}
_LIMITS = {"state": 512, "code": 4096, "iss": 2048, "error": 256}
_MAX_TEXT = 4096
ServerPath = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="MCP server")
]


class MCPIntegrationSummary(BaseModel):
    """One of your MCP server connections; never its tokens."""

    server_name: str
    status: str
    """``connected`` (tokens granted) or ``pending`` (waiting for the browser)."""
    scopes: list[str]
    expires_at: datetime | None = None
    """When the access token expires (it is refreshed before use)."""
    refreshable: bool = False
    pending_expires_at: datetime | None = None
    authorization_url: str | None = None


class MCPIntegrationList(BaseModel):
    integrations: list[MCPIntegrationSummary]


@router.get("/mcp/oauth/callback", response_class=HTMLResponse)
async def oauth_callback(
    request: Request,
    state: _Param = None,
    code: _Param = None,
    iss: _Param = None,
    error: _Param = None,
    error_description: _Param = None,
) -> HTMLResponse:
    """Finish an MCP OAuth authorization started on any replica."""
    store, token_client = _oauth(request)
    if store is None or token_client is None:
        return _page(404, "Not available", "This server has no MCP OAuth store configured.")
    if not state:
        return _page(400, "Authorization failed", "The link is missing its state parameter.")
    malformed = _malformed(
        state=state, code=code, iss=iss, error=error, error_description=error_description
    )
    if malformed is not None:
        # Refused before any lookup: nothing a store cannot hold reaches it, and a
        # mangled redirect does not use up the user's link.
        return _page(400, "Authorization failed", f"The link is malformed ({malformed}).")
    reference = secrets.token_hex(6)
    try:
        pending = await store.consume_pending(state)
    except StoreError:
        logger.warning("MCP OAuth callback [%s]: the store failed", reference, exc_info=True)
        return _page(503, "Authorization failed", _try_again(reference))
    if pending is None:
        return _page(
            400,
            "Authorization failed",
            "This authorization link is unknown, has expired or was already used. "
            "Ask the agent again for a new link.",
        )
    server = pending.server_name
    # RFC 9207: the response must come from the authorization server the user was
    # sent to (a mix-up attack sends it elsewhere).
    if iss is not None and pending.issuer is not None and iss != pending.issuer:
        logger.warning(
            "MCP OAuth callback [%s]: %r answered with issuer %r, not %r",
            reference, server, iss, pending.issuer,
        )  # fmt: skip
        return _page(
            400, "Authorization failed", f"The response did not come from {server}'s issuer."
        )
    if iss is None and pending.iss_parameter_supported:
        return _page(400, "Authorization failed", f"The response names no issuer for {server}.")
    if error:
        detail = f"{error}: {error_description}" if error_description else error
        return _page(400, "Authorization failed", f"{server} did not grant access ({detail}).")
    if not code:
        return _page(400, "Authorization failed", "The authorization server sent no code.")
    try:
        client = await store.client_for(pending.tenant, server, pending.client_id or "")
        tokens = await token_client.exchange_code(pending, code, client)
        await store.complete_authorization(pending, tokens)
    except MCPOAuthTokenError as problem:
        # The detail (endpoint, the server's own words) is for the operator's log.
        logger.warning(
            "MCP OAuth callback [%s]: the code exchange with %r failed: %s",
            reference, server, problem,
        )  # fmt: skip
        return _page(
            502,
            "Authorization failed",
            f"{server} did not complete the connection. Ask the agent again for a new link. "
            f"(Reference: {reference})",
        )
    except MCPOAuthEncryptionNotConfiguredError as problem:
        logger.error("MCP OAuth callback [%s]: %s", reference, problem)
        return _page(500, "Authorization failed", _try_again(reference))
    except StoreError:
        logger.warning("MCP OAuth callback [%s]: the store failed", reference, exc_info=True)
        return _page(503, "Authorization failed", _try_again(reference))
    return _page(
        200,
        "Connected",
        f"{server} is connected. You can close this window and go back to the conversation.",
    )


def _malformed(**values: str | None) -> str | None:
    """What is wrong with the callback's parameters, or None (absent ones are fine)."""
    for name, value in values.items():
        if value is None:
            continue
        pattern = _PATTERNS.get(name, _PRINTABLE)
        limit = _LIMITS.get(name, _MAX_TEXT)
        if len(value) > limit or not pattern.fullmatch(value):
            return f"invalid {name}"
    return None


def _try_again(reference: str) -> str:
    return (
        "The connection could not be completed because of a problem on this server. "
        f"Ask the agent again for a new link. (Reference: {reference})"
    )


@router.get(
    "/mcp/integrations",
    response_model=MCPIntegrationList,
    responses=_ERRORS,
    dependencies=AUTHENTICATED,
)
async def list_integrations(tenant: TenantQuery, request: Request) -> MCPIntegrationList:
    """Your MCP server connections in this tenant: connected or pending, scopes, expiry."""
    store = _required_store(request)
    requester = normalize_owner(request_identity(request).requester_uuid)
    records = await store.list_user_integrations(tenant, requester)
    summaries = []
    for record in records:
        tokens, pending = record.tokens, record.pending
        scope = (tokens.scope if tokens else None) or (pending.scope if pending else None)
        summaries.append(
            MCPIntegrationSummary(
                server_name=record.server_name,
                status="connected" if tokens is not None else "pending",
                scopes=scope.split() if scope else [],
                expires_at=tokens.expires_at if tokens else None,
                refreshable=bool(tokens and tokens.refresh_token),
                pending_expires_at=pending.expires_at if pending else None,
                authorization_url=pending.auth_url if pending and not tokens else None,
            )
        )
    return MCPIntegrationList(integrations=summaries)


@router.delete(
    "/mcp/integrations/{server_name}",
    status_code=204,
    responses=_ERRORS,
    dependencies=AUTHENTICATED,
)
async def delete_integration(
    tenant: TenantQuery,
    server_name: ServerPath,
    request: Request,
) -> Response:
    """Disconnect one MCP server: its tokens (and any pending link) are forgotten."""
    store = _required_store(request)
    requester = normalize_owner(request_identity(request).requester_uuid)
    if not await store.delete_user_integration(tenant, requester, server_name):
        raise TurnNotFoundError(f"no MCP integration {server_name!r}")
    return Response(status_code=204)


def _oauth(request: Request) -> tuple[MCPOAuthIntegrationStore | None, MCPOAuthTokenClient | None]:
    state = request.app.state
    return getattr(state, "mcp_oauth_store", None), getattr(state, "mcp_oauth_token_client", None)


def _required_store(request: Request) -> MCPOAuthIntegrationStore:
    store, _ = _oauth(request)
    if store is None:
        raise NotImplementedByStoreError("this server runs without an MCP OAuth store")
    return store


def _page(status: int, title: str, message: str) -> HTMLResponse:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(message)}</p></body></html>"
    )
    # The page may carry a server's error text: never cache it, never frame it.
    headers = {"Cache-Control": "no-store", "X-Frame-Options": "DENY"}
    return HTMLResponse(body, status_code=status, headers=headers)


class RedactOAuthCallbackFilter(logging.Filter):
    """Replaces the values of ``code`` and ``state`` in logged callback URLs.

    uvicorn's access log records each request's path with its query string, and
    a callback's code and state are what completes a user's authorization. The
    query string is logged as sent, and a parameter's name may be
    percent-encoded (``%63ode=`` is ``code=`` to the route): each name is
    decoded the way the route decodes it before it is compared.
    """

    _QUERY = re.compile(r"\?([^\s\"]*)")
    _SECRETS = frozenset({"code", "state"})

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(self.redact(arg) for arg in record.args)
        elif isinstance(record.msg, str):
            record.msg = self.redact(record.msg)
        return True

    def redact(self, value: object) -> object:
        if isinstance(value, str) and CALLBACK_PATH in unquote(value):
            return self._QUERY.sub(self._redacted_query, value)
        return value

    def _redacted_query(self, match: re.Match[str]) -> str:
        pairs = match.group(1).split("&")
        return "?" + "&".join(self._redacted_pair(pair) for pair in pairs)

    def _redacted_pair(self, pair: str) -> str:
        name, equals, _ = pair.partition("=")
        # As the route reads it (``parse_qsl``): "+" is a space, %XX a byte.
        if equals and unquote_plus(name) in self._SECRETS:
            return f"{name}=[redacted]"
        return pair


ACCESS_LOGGERS = ("uvicorn.access",)
"""The loggers ``install_mcp_oauth`` puts ``RedactOAuthCallbackFilter`` on."""


def install_access_log_redaction() -> None:
    """Put ``RedactOAuthCallbackFilter`` on the access loggers, once (a logging
    configuration applied later keeps it: ``dictConfig`` keeps a logger's filters)."""
    for name in ACCESS_LOGGERS:
        access = logging.getLogger(name)
        if not any(isinstance(f, RedactOAuthCallbackFilter) for f in access.filters):
            access.addFilter(RedactOAuthCallbackFilter())


def install_mcp_oauth(app: FastAPI) -> None:
    """Serve these routes on ``app``, give its turns the app's MCP OAuth store
    (``MCPOAuthRuntimeMiddleware``) and keep callback secrets out of the access
    log. Idempotent; call before the app starts."""
    install_access_log_redaction()
    if getattr(app.state, "mcp_oauth_installed", False):
        return
    app.state.mcp_oauth_installed = True
    app.add_middleware(MCPOAuthRuntimeMiddleware)
    app.include_router(router)
