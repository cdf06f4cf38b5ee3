"""The token endpoint side of OAuth: code-for-token exchange and refresh (RFC 6749, 7636, 8707).

A ``MCPOAuthTokenClient`` holds no connection between calls (each request opens
and closes its own HTTP client), so it needs no lifecycle and any replica can
use one. Failures say whether they are for good: an authorization server that
refuses a grant (4xx) is permanent, so the refresh token is dropped and the user
is asked again; one that cannot be reached (network, 5xx, 429) is transient,
so the tokens are kept for the next turn.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote_plus

import httpx2

from tether.adapters.mcp.records import MCPOAuthPendingAuthorization, MCPOAuthTokens

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class MCPOAuthTokenError(Exception):
    """The token endpoint did not hand out tokens.

    ``permanent`` is True when the server refused the grant itself (retrying the
    same request cannot succeed); ``error`` is its OAuth error code, if it sent one.
    """

    def __init__(self, message: str, *, permanent: bool, error: str | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.error = error


@dataclass(frozen=True)
class MCPOAuthClient:
    """The OAuth client tether authenticates as at a token endpoint."""

    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    token_endpoint_auth_method: str | None = None

    @classmethod
    def from_client_info(cls, client_info: Mapping[str, Any]) -> MCPOAuthClient:
        """From RFC 7591 client information (``client_id``, ``client_secret``, ...)."""
        method = client_info.get("token_endpoint_auth_method")
        secret = client_info.get("client_secret")
        return cls(
            client_id=str(client_info["client_id"]),
            client_secret=str(secret) if secret else None,
            token_endpoint_auth_method=str(method) if method else None,
        )

    def auth_method(self) -> str:
        """How to authenticate: as registered, else RFC 7591's default for a secret."""
        if self.token_endpoint_auth_method:
            return self.token_endpoint_auth_method
        return "client_secret_basic" if self.client_secret else "none"


class MCPOAuthTokenClient:
    """Exchanges authorization codes and refresh tokens at the stored token endpoint.

    ``transport`` lets tests or deployments route requests (an ``httpx2``
    transport); ``timeout`` bounds each request, in seconds.
    """

    def __init__(
        self,
        *,
        timeout: float = 15.0,
        transport: httpx2.AsyncBaseTransport | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.timeout = timeout
        self.transport = transport
        self.clock = clock

    async def exchange_code(
        self, pending: MCPOAuthPendingAuthorization, code: str, client: MCPOAuthClient
    ) -> MCPOAuthTokens:
        """The tokens for ``code``, proving possession of ``pending.code_verifier``."""
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": pending.redirect_uri,
            "code_verifier": pending.code_verifier,
        }
        if pending.resource:
            form["resource"] = pending.resource
        body = await self._request(pending.token_endpoint, form, client)
        return self._tokens(
            body,
            token_endpoint=pending.token_endpoint,
            client_id=client.client_id,
            resource=pending.resource,
            previous=None,
            requested_scope=pending.scope,
        )

    async def refresh(self, tokens: MCPOAuthTokens, client: MCPOAuthClient) -> MCPOAuthTokens:
        """New tokens for ``tokens.refresh_token``; a rotating server's new refresh
        token replaces the spent one, otherwise the old one is kept."""
        if not tokens.refresh_token or not tokens.token_endpoint:
            raise MCPOAuthTokenError(
                "these tokens cannot be refreshed (no refresh token or token endpoint)",
                permanent=True,
            )
        form = {"grant_type": "refresh_token", "refresh_token": tokens.refresh_token}
        if tokens.resource:
            form["resource"] = tokens.resource
        body = await self._request(tokens.token_endpoint, form, client)
        return self._tokens(
            body,
            token_endpoint=tokens.token_endpoint,
            client_id=client.client_id,
            resource=tokens.resource,
            previous=tokens,
            requested_scope=tokens.scope,
        )

    async def _request(
        self, endpoint: str, form: dict[str, str], client: MCPOAuthClient
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        method = client.auth_method()
        if method == "client_secret_basic" and client.client_secret:
            # RFC 6749 §2.3.1: both parts form-encoded before base64.
            pair = f"{quote_plus(client.client_id)}:{quote_plus(client.client_secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        else:
            form = {**form, "client_id": client.client_id}
            if method == "client_secret_post" and client.client_secret:
                form["client_secret"] = client.client_secret
        try:
            async with httpx2.AsyncClient(
                timeout=self.timeout, transport=self.transport, follow_redirects=False
            ) as http:
                response = await http.post(endpoint, data=form, headers=headers)
        except httpx2.HTTPError as error:
            raise MCPOAuthTokenError(
                f"the token endpoint {endpoint} could not be reached: {error}", permanent=False
            ) from error
        return _parse(endpoint, response)

    def _tokens(
        self,
        body: dict[str, Any],
        *,
        token_endpoint: str,
        client_id: str,
        resource: str | None,
        previous: MCPOAuthTokens | None,
        requested_scope: str | None,
    ) -> MCPOAuthTokens:
        access_token = body.get("access_token")
        token_type = str(body.get("token_type") or "Bearer")
        if not isinstance(access_token, str) or not access_token:
            raise MCPOAuthTokenError("the token response has no access_token", permanent=False)
        if token_type.lower() != "bearer":
            raise MCPOAuthTokenError(
                f"the token endpoint issued a {token_type!r} token; only Bearer is supported",
                permanent=True,
            )
        issued_at = self.clock()
        expires_at = None
        expires_in = body.get("expires_in")
        if expires_in is not None:
            try:
                expires_at = issued_at + timedelta(seconds=float(expires_in))
            except (TypeError, ValueError):
                raise MCPOAuthTokenError(
                    f"the token response has an invalid expires_in {expires_in!r}", permanent=False
                ) from None
        refresh_token = body.get("refresh_token") or (previous.refresh_token if previous else None)
        scope = body.get("scope") or (previous.scope if previous else None) or requested_scope
        return MCPOAuthTokens(
            access_token=access_token,
            token_type="Bearer",
            refresh_token=str(refresh_token) if refresh_token else None,
            scope=str(scope) if scope else None,
            expires_at=expires_at,
            token_endpoint=token_endpoint,
            client_id=client_id,
            resource=resource,
            issued_at=issued_at,
        )


def _parse(endpoint: str, response: httpx2.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and isinstance(body, dict):
        return body
    error = body.get("error") if isinstance(body, dict) else None
    description = body.get("error_description") if isinstance(body, dict) else None
    detail = ": ".join(str(part) for part in (error, description) if part) or response.reason_phrase
    # 4xx is the server deciding about this grant; 429 and 5xx are about the moment.
    permanent = 400 <= response.status_code < 500 and response.status_code != 429
    if response.status_code == 200:
        detail, permanent = "the response is not a JSON object", False
    raise MCPOAuthTokenError(
        f"the token endpoint {endpoint} answered {response.status_code} ({detail})",
        permanent=permanent,
        error=str(error) if error else None,
    )


def get_mcp_oauth_token_client(
    *, timeout: float = 15.0, transport: httpx2.AsyncBaseTransport | None = None
) -> MCPOAuthTokenClient:
    """The token client to pass to ``setup_app(mcp_oauth_token_client=...)``."""
    return MCPOAuthTokenClient(timeout=timeout, transport=transport)
