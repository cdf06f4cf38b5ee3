"""One configured MCP server, for one user in one turn: credentials, calls, authorization.

The rules an agent relies on live here: a server needing the user's OAuth
authorization is used with the user's own tokens only (refreshed first when
stale; a 401 on tokens believed good forces one refresh, then a new
authorization); without a store, or without a signed-in user, such a server is
skipped; an authorization that has to start produces a link, reusing the live
one if the user already has it.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import httpx2
from mcp import Client

from tether.adapters.mcp.config import HeaderAuth, MCPServerConfig, OAuthAuth
from tether.adapters.mcp.connection import (
    MCPServerUnavailableError,
    MCPUnauthorizedError,
    run_on_server,
)
from tether.adapters.mcp.discovery import (
    AuthorizationServer,
    Challenge,
    MCPOAuthDiscoveryError,
    authorization_url,
    discover,
    pkce_pair,
    register_client,
)
from tether.adapters.mcp.encryption import MCPOAuthEncryptionNotConfiguredError
from tether.adapters.mcp.records import MCPOAuthPendingAuthorization, MCPOAuthTokens
from tether.adapters.mcp.runtime import MCPOAuthRuntime
from tether.adapters.mcp.store import MCPOAuthIntegrationStore
from tether.adapters.mcp.token_client import MCPOAuthTokenClient

_T = TypeVar("_T")
# A link about to lapse is not worth showing: make a new one instead.
_REUSE_MARGIN = timedelta(seconds=60)


class MCPAuthorizationRequiredError(Exception):
    """The user has to grant access in a browser first: open ``url``."""

    def __init__(self, server: str, url: str) -> None:
        super().__init__(f"MCP server {server!r} needs the user's authorization: {url}")
        self.server = server
        self.url = url


class MCPServerSkippedError(Exception):
    """The server cannot be used on this tether server as configured (no store, no
    encryption key, no signed-in user); ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ServerSession:
    """Runs operations on ``server`` as ``user_uuid`` of ``tenant``."""

    def __init__(
        self,
        server: MCPServerConfig,
        *,
        tenant: str,
        user_uuid: str,
        runtime: MCPOAuthRuntime | None,
    ) -> None:
        self.server = server
        self.tenant = tenant
        self.user_uuid = user_uuid
        self.runtime = runtime

    async def run(self, operation: Callable[[Client], Awaitable[_T]]) -> _T:
        """Run ``operation`` with the right credentials; raises
        ``MCPAuthorizationRequiredError``, ``MCPServerSkippedError`` or
        ``MCPServerUnavailableError`` when it cannot."""
        auth = self.server.auth
        if isinstance(auth, HeaderAuth):
            try:
                return await run_on_server(self.server, {auth.name: auth.value}, operation)
            except MCPUnauthorizedError as error:
                raise MCPServerUnavailableError("it refused the configured credentials") from error
        if not isinstance(auth, OAuthAuth):
            try:
                return await run_on_server(self.server, {}, operation)
            except MCPUnauthorizedError as error:
                raise MCPServerUnavailableError(
                    "it requires authorization, and the agent setup configures none for it"
                ) from error
        return await self._run_as_user(operation)

    async def _run_as_user(self, operation: Callable[[Client], Awaitable[_T]]) -> _T:
        store, token_client = self._oauth()
        tokens = await store.fresh_tokens(
            self.tenant, self.user_uuid, self.server.name, token_client
        )
        if tokens is None:
            reusable = await self._reusable_pending()
            if reusable is not None:
                raise MCPAuthorizationRequiredError(self.server.name, reusable.auth_url)
        try:
            return await run_on_server(self.server, _bearer(tokens), operation)
        except MCPUnauthorizedError as error:
            challenge = error.challenge
        if tokens is not None:
            # Refused although we thought them good (revoked, expired early): one
            # forced refresh, which a replica that already refreshed turns into a read.
            tokens = await store.fresh_tokens(
                self.tenant,
                self.user_uuid,
                self.server.name,
                token_client,
                rejected_access_token=tokens.access_token,
            )
            if tokens is not None:
                try:
                    return await run_on_server(self.server, _bearer(tokens), operation)
                except MCPUnauthorizedError as error:
                    challenge = error.challenge
        raise MCPAuthorizationRequiredError(self.server.name, await self._authorize(challenge))

    def _oauth(self) -> tuple[MCPOAuthIntegrationStore, MCPOAuthTokenClient]:
        runtime = self.runtime
        if runtime is None or runtime.store is None or runtime.token_client is None:
            raise MCPServerSkippedError(
                "it needs your authorization, but this tether server has no MCP OAuth store "
                "configured"
            )
        if not self.user_uuid:
            raise MCPServerSkippedError(
                "it acts on a user's behalf, and this request names no user"
            )
        return runtime.store, runtime.token_client

    async def _reusable_pending(self) -> MCPOAuthPendingAuthorization | None:
        store, _ = self._oauth()
        record = await store.get_user_integration(self.tenant, self.user_uuid, self.server.name)
        pending = None if record is None else record.pending
        if pending is None or self.runtime is None:
            return None
        if pending.redirect_uri != self.runtime.redirect_uri:
            return None
        if pending.expires_at - _REUSE_MARGIN <= store.clock():
            return None
        return pending

    async def _authorize(self, challenge: Challenge) -> str:
        """Start an authorization (or reuse the live one); returns the user's link."""
        store, _ = self._oauth()
        assert self.runtime is not None and isinstance(self.server.auth, OAuthAuth)
        problem = store.credentials_problem()
        if problem is not None:
            raise MCPServerSkippedError(f"it needs your authorization, but {problem}")
        redirect_uri = self.runtime.redirect_uri
        if not redirect_uri:
            raise MCPServerSkippedError(
                "it needs your authorization, but no callback URL is known; set "
                "TETHER_MCP_REDIRECT_URI"
            )
        reusable = await self._reusable_pending()
        if reusable is not None:
            return reusable.auth_url
        try:
            async with httpx2.AsyncClient(
                timeout=self.server.timeout, follow_redirects=False
            ) as http:
                found = await discover(http, self.server.url, challenge)
                scope = self._scope(found, challenge)
                client_id = await self._client_id(http, found, redirect_uri, scope)
        except MCPOAuthDiscoveryError as error:
            raise MCPServerUnavailableError(
                f"its authorization could not start: {error}"
            ) from error
        verifier, code_challenge = pkce_pair()
        state = secrets.token_urlsafe(32)
        url = authorization_url(
            found,
            client_id=client_id,
            redirect_uri=redirect_uri,
            state=state,
            code_challenge=code_challenge,
            scope=scope,
        )
        pending = MCPOAuthPendingAuthorization(
            state=state,
            tenant=self.tenant,
            server_name=self.server.name,
            user_uuid=self.user_uuid,
            auth_url=url,
            code_verifier=verifier,
            token_endpoint=found.token_endpoint,
            redirect_uri=redirect_uri,
            expires_at=store.pending_expiry(),
            resource=found.resource,
            client_id=client_id,
            scope=scope,
            issuer=found.issuer_identifier or found.issuer,
            iss_parameter_supported=found.iss_parameter_supported,
        )
        try:
            await store.begin_authorization(pending)
        except MCPOAuthEncryptionNotConfiguredError as error:
            raise MCPServerSkippedError(f"it needs your authorization, but {error}") from error
        return url

    def _scope(self, found: AuthorizationServer, challenge: Challenge) -> str | None:
        assert isinstance(self.server.auth, OAuthAuth)
        if self.server.auth.scopes:
            return " ".join(self.server.auth.scopes)
        if challenge.scope:
            return challenge.scope
        return " ".join(found.resource_scopes) if found.resource_scopes else None

    async def _client_id(
        self,
        http: httpx2.AsyncClient,
        found: AuthorizationServer,
        redirect_uri: str,
        scope: str | None,
    ) -> str:
        """The OAuth client to authorize: the configured one, the one registered for
        this tenant and callback URL earlier, or a new registration (kept for the
        tenant beside the others; of replicas registering at once, one is kept)."""
        store, _ = self._oauth()
        auth = self.server.auth
        assert isinstance(auth, OAuthAuth)
        if auth.client_id:
            # Stored too, so the callback (which has no agent setup) finds the secret.
            info: dict[str, Any] = {
                "client_id": auth.client_id,
                "issuer": found.issuer,
                "redirect_uris": [redirect_uri],
                "source": "agent_setup",
            }
            if auth.client_secret:
                info["client_secret"] = auth.client_secret
            if auth.token_endpoint_auth_method:
                info["token_endpoint_auth_method"] = auth.token_endpoint_auth_method
            await store.remember_client(self.tenant, self.server.name, info)
            return auth.client_id

        async def register() -> dict[str, Any]:
            registered = await register_client(
                http, found, redirect_uri=redirect_uri, scope=scope, client_name=auth.client_name
            )
            registered["source"] = "dynamic_registration"
            return registered

        client = await store.registered_client(
            self.tenant,
            self.server.name,
            issuer=found.issuer,
            redirect_uri=redirect_uri,
            register=register,
        )
        return str(client["client_id"])


def _bearer(tokens: MCPOAuthTokens | None) -> dict[str, str]:
    return {} if tokens is None else {"Authorization": f"Bearer {tokens.access_token}"}
