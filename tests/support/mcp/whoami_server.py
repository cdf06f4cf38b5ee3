"""A real MCP server (the ``mcp`` SDK's server side) with a tool that says who called it.

It is a resource server in front of ``AuthorizationServer``: bearer tokens are
checked against the grants that server issued (expiry, scope, and that they
were issued for this very resource), a request without one gets the SDK's 401
with an RFC 9728 ``resource_metadata`` challenge, and the SDK serves the
protected resource metadata. A second tool, ``boom``, always fails. Three
more say what they may do twice (``look`` only reads, ``put`` is
idempotent, ``send`` is destructive) and record the ``_meta`` of each call.
``static_tokens`` maps fixed tokens (for the static-header configuration) to
the subject they stand for.
"""

from __future__ import annotations

from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from tests.support.mcp.authorization_server import SCOPE, AuthorizationServer
from tests.support.mcp.threaded import ThreadedServer


class _Verifier:
    def __init__(self, owner: WhoamiServer) -> None:
        self.owner = owner

    async def verify_token(self, token: str) -> AccessToken | None:
        subject = self.owner.static_tokens.get(token)
        if subject is not None:
            return AccessToken(
                token=token, client_id="static", scopes=[SCOPE], subject=subject,
                resource=self.owner.url,
            )  # fmt: skip
        grant = self.owner.authorization_server.verify(token)
        if grant is None:
            return None
        return AccessToken(
            token=token,
            client_id=grant.client_id,
            scopes=grant.scope.split(),
            subject=grant.subject,
            resource=grant.resource,
            expires_at=int(grant.expires_at),
        )


class WhoamiServer:
    """Run with ``with WhoamiServer(authorization_server) as server:``; ``url`` is the endpoint."""

    def __init__(
        self,
        authorization_server: AuthorizationServer,
        *,
        static_tokens: dict[str, str] | None = None,
    ) -> None:
        self.authorization_server = authorization_server
        self.static_tokens = static_tokens or {}
        self.calls: list[str | None] = []
        self.metas: list[tuple[str, dict[str, Any]]] = []
        """(tool, the call's ``_meta``) of every call of look, put and send."""
        self._server = ThreadedServer()

    @property
    def url(self) -> str:
        return f"{self._server.base_url}/mcp"

    def __enter__(self) -> WhoamiServer:
        server = MCPServer(
            "whoami",
            token_verifier=_Verifier(self),
            auth=AuthSettings(
                issuer_url=self.authorization_server.issuer,  # type: ignore[arg-type]
                resource_server_url=self.url,  # type: ignore[arg-type]
                validate_token_resource=True,
                required_scopes=[SCOPE],
            ),
            log_level="WARNING",
        )

        @server.tool()
        async def whoami() -> str:
            """Say who the caller is (the subject of their token)."""
            token = get_access_token()
            subject = token.subject if token else None
            self.calls.append(subject)
            return f"you are {subject}"

        @server.tool()
        async def boom() -> str:
            """Always fails."""
            raise ToolError("boom went the tool")

        def record(tool: str, ctx: Context) -> str:
            meta = ctx.request_context.meta
            fields = meta.model_dump() if hasattr(meta, "model_dump") else dict(meta or {})
            self.metas.append((tool, fields))
            return f"{tool} done"

        @server.tool(annotations=ToolAnnotations(read_only_hint=True))
        async def look(ctx: Context) -> str:
            """Only reads."""
            return record("look", ctx)

        @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
        async def put(ctx: Context) -> str:
            """Writes; twice is as once."""
            return record("put", ctx)

        @server.tool(annotations=ToolAnnotations(destructive_hint=True))
        async def send(ctx: Context) -> str:
            """Writes; twice is twice."""
            return record("send", ctx)

        app = server.streamable_http_app(stateless_http=True, json_response=True)
        # The SDK's app runs its session manager in its lifespan.
        self._server.start(app, lifespan="on")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.stop()
