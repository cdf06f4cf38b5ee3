"""MCP OAuth routes: finish an authorization on any replica; list and disconnect yours.

``GET /mcp/oauth/callback`` is where the authorization server sends the
browser back. It finds the pending authorization by ``state`` alone (the
redirect carries nothing else), consumes it (a state works once), exchanges the
code with the stored verifier at the stored token endpoint, stores the tokens
and shows a page saying it worked, or why not.
"""

from __future__ import annotations

import html
import logging
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from tether.adapters.mcp.encryption import MCPOAuthEncryptionNotConfiguredError
from tether.adapters.mcp.runtime import MCPOAuthRuntimeMiddleware
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
_Param = Annotated[str | None, Query(max_length=4096)]
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
    error: _Param = None,
    error_description: _Param = None,
) -> HTMLResponse:
    """Finish an MCP OAuth authorization started on any replica."""
    store, token_client = _oauth(request)
    if store is None or token_client is None:
        return _page(404, "Not available", "This server has no MCP OAuth store configured.")
    if not state:
        return _page(400, "Authorization failed", "The link is missing its state parameter.")
    try:
        pending = await store.consume_pending(state)
    except StoreError as problem:
        logger.warning("MCP OAuth callback: store failed", exc_info=True)
        return _page(503, "Authorization failed", f"The server could not read it: {problem}")
    if pending is None:
        return _page(
            400,
            "Authorization failed",
            "This authorization link is unknown, has expired or was already used. "
            "Ask the agent again for a new link.",
        )
    server = pending.server_name
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
        return _page(502, "Authorization failed", f"{server} refused the exchange: {problem}")
    except MCPOAuthEncryptionNotConfiguredError as problem:
        return _page(500, "Authorization failed", str(problem))
    except StoreError as problem:
        logger.warning("MCP OAuth callback: store failed", exc_info=True)
        return _page(503, "Authorization failed", f"The tokens could not be stored: {problem}")
    return _page(
        200,
        "Connected",
        f"{server} is connected. You can close this window and go back to the conversation.",
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


def install_mcp_oauth(app: FastAPI) -> None:
    """Serve these routes on ``app`` and give its turns the app's MCP OAuth store
    (``MCPOAuthRuntimeMiddleware``). Idempotent; call before the app starts."""
    if getattr(app.state, "mcp_oauth_installed", False):
        return
    app.state.mcp_oauth_installed = True
    app.add_middleware(MCPOAuthRuntimeMiddleware)
    app.include_router(router)
