"""A real, small OAuth 2.1 authorization server for tests, served over HTTP on loopback.

It speaks what an MCP client meets in the wild: RFC 8414 metadata, RFC 7591
dynamic client registration, an authorization endpoint (which approves at once
for the user the "browser" says it is logged in as, the ``x-test-user``
header, and redirects with ``code`` and ``state``), and a token endpoint that
checks PKCE S256, single-use codes, redirect URIs and client secrets, and
rotates refresh tokens. It counts every presentation of every refresh token,
so a test can prove a token was spent once. Its redirects carry RFC 9207
``iss``; ``iss_parameter_supported`` advertises it in the metadata.
``registration_delays`` holds registrations back (the n-th to arrive waits the
n-th delay), so replicas registering at once finish in a known order.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.support.mcp.threaded import ThreadedServer

SCOPE = "whoami"


@dataclass
class Grant:
    """What an access token stands for."""

    subject: str
    client_id: str
    scope: str
    resource: str | None
    expires_at: float


@dataclass
class _Refresh:
    subject: str
    client_id: str
    scope: str
    resource: str | None
    spent: bool = False
    revoked: bool = False


@dataclass
class _Code:
    client_id: str
    redirect_uri: str
    challenge: str
    subject: str
    scope: str
    resource: str | None
    used: bool = False


@dataclass
class AuthorizationServer:
    """Run with ``with AuthorizationServer() as server:``; ``issuer`` is its URL."""

    access_token_lifetime: float = 3600.0
    refresh_delay: float = 0.0
    """Seconds the token endpoint waits before answering a refresh: widens races."""
    registration_delays: list[float] = field(default_factory=list)
    """Seconds each registration waits before answering, in order of arrival."""
    iss_parameter_supported: bool = False
    """Whether the metadata advertises ``authorization_response_iss_parameter_supported``."""
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)
    access_tokens: dict[str, Grant] = field(default_factory=dict)
    refresh_tokens: dict[str, _Refresh] = field(default_factory=dict)
    refresh_presentations: Counter[str] = field(default_factory=Counter)
    issued_secrets: list[str] = field(default_factory=list)
    registrations: int = 0

    def __post_init__(self) -> None:
        self._codes: dict[str, _Code] = {}
        self._lock = threading.Lock()
        app = Starlette(
            routes=[
                Route("/.well-known/oauth-authorization-server", self._metadata),
                Route("/register", self._register, methods=["POST"]),
                Route("/authorize", self._authorize),
                Route("/token", self._token, methods=["POST"]),
            ]
        )
        self._app = app
        self._server = ThreadedServer()

    @property
    def issuer(self) -> str:
        return self._server.base_url

    def __enter__(self) -> AuthorizationServer:
        self._server.start(self._app)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.stop()

    # ------------------------------------------------------------ test hooks

    def verify(self, token: str) -> Grant | None:
        """The live grant of an access token (what the resource server asks)."""
        with self._lock:
            grant = self.access_tokens.get(token)
        if grant is None or grant.expires_at <= time.time():
            return None
        return grant

    def expire_access_tokens(self, subject: str) -> None:
        with self._lock:
            for grant in self.access_tokens.values():
                if grant.subject == subject:
                    grant.expires_at = 0

    def revoke_refresh_tokens(self, subject: str) -> None:
        with self._lock:
            for refresh in self.refresh_tokens.values():
                if refresh.subject == subject:
                    refresh.revoked = True

    def refresh_tokens_of(self, subject: str) -> list[str]:
        with self._lock:
            return [t for t, r in self.refresh_tokens.items() if r.subject == subject]

    def all_secrets(self) -> list[str]:
        """Every credential this server handed out: none may appear at rest in clear."""
        with self._lock:
            return [*self.access_tokens, *self.refresh_tokens, *self.issued_secrets]

    # ------------------------------------------------------------ endpoints

    async def _metadata(self, request: Request) -> Response:
        extra = {"authorization_response_iss_parameter_supported": True}
        return JSONResponse(
            {
                **(extra if self.iss_parameter_supported else {}),
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token",
                "registration_endpoint": f"{self.issuer}/register",
                "scopes_supported": [SCOPE],
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": [
                    "client_secret_post",
                    "client_secret_basic",
                    "none",
                ],
            }
        )

    async def _register(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            delay = self.registration_delays.pop(0) if self.registration_delays else 0.0
        if delay:
            await asyncio.sleep(delay)
        redirect_uris = body.get("redirect_uris")
        if not isinstance(redirect_uris, list) or not redirect_uris:
            return _error(400, "invalid_redirect_uri", "redirect_uris is required")
        method = body.get("token_endpoint_auth_method") or "client_secret_basic"
        client = {
            "client_id": f"client-{secrets.token_hex(6)}",
            "redirect_uris": redirect_uris,
            "token_endpoint_auth_method": method,
            "grant_types": ["authorization_code", "refresh_token"],
            "scope": body.get("scope") or SCOPE,
            "client_id_issued_at": int(time.time()),
        }
        if method != "none":
            client["client_secret"] = f"secret-{secrets.token_hex(16)}"
            client["client_secret_expires_at"] = 0
        with self._lock:
            self.clients[client["client_id"]] = client
            self.registrations += 1
            if "client_secret" in client:
                self.issued_secrets.append(client["client_secret"])
        return JSONResponse(client, status_code=201)

    async def _authorize(self, request: Request) -> Response:
        query = request.query_params
        user = request.headers.get("x-test-user")
        if not user:
            return PlainTextResponse("not logged in at the authorization server", 401)
        client = self.clients.get(query.get("client_id", ""))
        redirect_uri = query.get("redirect_uri", "")
        if client is None or redirect_uri not in client["redirect_uris"]:
            return PlainTextResponse("unknown client or redirect_uri", 400)
        if query.get("response_type") != "code" or query.get("code_challenge_method") != "S256":
            return PlainTextResponse("only response_type=code with PKCE S256", 400)
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._codes[code] = _Code(
                client_id=client["client_id"],
                redirect_uri=redirect_uri,
                challenge=query.get("code_challenge", ""),
                subject=user,
                scope=query.get("scope") or SCOPE,
                resource=query.get("resource"),
            )
        params = {"code": code, "state": query.get("state", ""), "iss": self.issuer}
        return RedirectResponse(f"{redirect_uri}?{urlencode(params)}", status_code=302)

    async def _token(self, request: Request) -> Response:
        form = dict(await request.form())
        client = self._authenticate_client(request, form)
        if client is None:
            return _error(401, "invalid_client", "client authentication failed")
        grant_type = form.get("grant_type")
        if grant_type == "authorization_code":
            return self._exchange_code(client, form)
        if grant_type == "refresh_token":
            token = str(form.get("refresh_token", ""))
            with self._lock:
                self.refresh_presentations[token] += 1
            if self.refresh_delay:
                await asyncio.sleep(self.refresh_delay)
            return self._refresh(client, token)
        return _error(400, "unsupported_grant_type", str(grant_type))

    def _authenticate_client(self, request: Request, form: dict[str, Any]) -> dict[str, Any] | None:
        client_id, secret = form.get("client_id"), form.get("client_secret")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            decoded = base64.b64decode(header[6:]).decode()
            raw_id, _, raw_secret = decoded.partition(":")
            client_id, secret = unquote_plus(raw_id), unquote_plus(raw_secret)
        client = self.clients.get(str(client_id))
        if client is None:
            return None
        if client["token_endpoint_auth_method"] != "none" and secret != client.get("client_secret"):
            return None
        return client

    def _exchange_code(self, client: dict[str, Any], form: dict[str, Any]) -> Response:
        with self._lock:
            code = self._codes.get(str(form.get("code")))
            if code is None or code.used:
                return _error(400, "invalid_grant", "unknown or used code")
            code.used = True
        if code.client_id != client["client_id"] or code.redirect_uri != form.get("redirect_uri"):
            return _error(400, "invalid_grant", "code issued to another client or redirect")
        verifier = str(form.get("code_verifier", ""))
        digest = hashlib.sha256(verifier.encode()).digest()
        if base64.urlsafe_b64encode(digest).decode().rstrip("=") != code.challenge:
            return _error(400, "invalid_grant", "PKCE verification failed")
        return self._issue(code.subject, client["client_id"], code.scope, code.resource)

    def _refresh(self, client: dict[str, Any], token: str) -> Response:
        with self._lock:
            refresh = self.refresh_tokens.get(token)
            if refresh is None or refresh.client_id != client["client_id"]:
                return _error(400, "invalid_grant", "unknown refresh token")
            if refresh.spent or refresh.revoked:
                return _error(400, "invalid_grant", "refresh token already used or revoked")
            refresh.spent = True
        return self._issue(refresh.subject, refresh.client_id, refresh.scope, refresh.resource)

    def _issue(self, subject: str, client_id: str, scope: str, resource: str | None) -> Response:
        access, refresh = f"at-{secrets.token_urlsafe(24)}", f"rt-{secrets.token_urlsafe(24)}"
        lifetime = self.access_token_lifetime
        with self._lock:
            self.access_tokens[access] = Grant(
                subject, client_id, scope, resource, time.time() + lifetime
            )
            self.refresh_tokens[refresh] = _Refresh(subject, client_id, scope, resource)
        return JSONResponse(
            {
                "access_token": access,
                "token_type": "bearer",
                "expires_in": lifetime,
                "refresh_token": refresh,
                "scope": scope,
            },
            headers={"Cache-Control": "no-store"},
        )


def _error(status: int, error: str, description: str) -> Response:
    return JSONResponse({"error": error, "error_description": description}, status_code=status)
