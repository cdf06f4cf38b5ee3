"""Authenticators: how the server learns who is asking, from one HTTP request.

Two ship with tether. ``HeaderAuthenticator`` (the default) trusts identity
headers set by a gateway in front of the server, as the seed's SDK does.
``JWTAuthenticator`` verifies a bearer token itself and ignores those headers, so
a client that forges ``requester-uuid`` gains nothing (design §5, invariant 8).
The interface and its errors are ``tether.api.authenticator``'s, the JWT one
``tether.api.jwt_auth``'s; this module has them all, and ``build_authenticator``
chooses one from ``tether serve``'s options.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from fastapi import Request

from tether.api.authenticator import (
    AuthenticationError,
    Authenticator,
    InvalidIdentityError,
    TenantNotAllowedError,
    check_tenant,
    is_valid_id,
)
from tether.api.jwt_auth import JWTAuthenticator
from tether.domain.chat_request import RequestHeaders

__all__ = [
    "IDENTITY_HEADERS",
    "AuthMode",
    "AuthenticationError",
    "Authenticator",
    "HeaderAuthenticator",
    "InvalidIdentityError",
    "JWTAuthenticator",
    "TenantNotAllowedError",
    "build_authenticator",
]


IDENTITY_HEADERS = ("requester-uuid", "user-tenants", "user-roles")
"""The headers a trusted gateway sets for ``HeaderAuthenticator``."""


class HeaderAuthenticator(Authenticator):
    """Identity from headers set by a trusted gateway: ``requester-uuid``,
    ``user-roles`` and ``user-tenants`` (comma-separated), ``Authorization``
    passed through to agents.

    Nothing is verified, so the server must only be reachable through a gateway
    that strips these headers from clients and sets them itself. A requester
    id that is not a valid id (control characters, separators, longer than
    256 characters) is a 400, and so is any of the three headers given more
    than once. ``user-tenants``, when the gateway sets it, limits the tenants
    as the seed's SDK does: a request whose ``tenant`` is not in it is 403 (an
    empty header allows none); without the header the gateway alone decides.
    """

    def authenticate(self, request: Request) -> RequestHeaders:
        headers = request.headers
        for name in IDENTITY_HEADERS:
            # One value per header: with two, the gateway's and the client's
            # could both arrive, and which one wins would depend on the order.
            if len(headers.getlist(name)) > 1:
                raise InvalidIdentityError(f"the {name} header is given more than once")
        requester = headers.get("requester-uuid")
        if requester is not None and requester != "" and not is_valid_id(requester):
            raise InvalidIdentityError("the requester-uuid header is not a valid id")
        tenants = _split(headers.get("user-tenants"))
        check_tenant(request, tenants, "the user-tenants header does not allow this tenant")
        return RequestHeaders(
            requester_uuid=requester,
            user_roles=_split(headers.get("user-roles")),
            user_tenants=tenants,
            authorization=headers.get("authorization"),
        )


class AuthMode(StrEnum):
    """What ``tether serve --auth`` accepts."""

    HEADERS = "headers"
    JWT = "jwt"


def build_authenticator(
    mode: AuthMode | str,
    *,
    secret: str | None = None,
    public_key_file: Path | None = None,
    jwks_file: Path | None = None,
    jwks_url: str | None = None,
    audience: str | None = None,
    issuer: str | None = None,
    requester_claim: str = "sub",
    roles_claim: str = "roles",
    tenants_claim: str = "tenants",
    default_tenants: Sequence[str] = (),
) -> Authenticator:
    """The authenticator ``tether serve`` options describe; ValueError says what is wrong.

    With ``jwt`` exactly one key source is needed. JWT options without ``jwt``
    are refused rather than ignored: an operator who set a secret and forgot
    ``--auth jwt`` would otherwise run a server that trusts any header.
    """
    sources = {
        "--jwt-secret": secret,
        "--jwt-public-key": public_key_file,
        "--jwt-jwks": jwks_file,
        "--jwt-jwks-url": jwks_url,
    }
    given = [name for name, value in sources.items() if value is not None]
    if AuthMode(mode) is AuthMode.HEADERS:
        extras = {
            "--jwt-audience": audience,
            "--jwt-issuer": issuer,
            "--jwt-default-tenants": ",".join(default_tenants) or None,
        }
        stray = given + [name for name, value in extras.items() if value is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} only apply with --auth jwt")
        return HeaderAuthenticator()
    if len(given) != 1:
        raise ValueError(
            "--auth jwt needs exactly one of --jwt-secret, --jwt-public-key, --jwt-jwks, "
            "--jwt-jwks-url" + (f" (got {', '.join(given)})" if given else "")
        )
    options: dict[str, Any] = {
        "audience": audience,
        "issuer": issuer,
        "requester_claim": requester_claim,
        "roles_claim": roles_claim,
        "tenants_claim": tenants_claim,
        "default_tenants": default_tenants,
    }
    if secret is not None:
        return JWTAuthenticator.from_secret(secret, **options)
    if public_key_file is not None:
        return JWTAuthenticator.from_public_key_file(public_key_file, **options)
    if jwks_url is not None:
        return JWTAuthenticator.from_jwks_url(jwks_url, **options)
    assert jwks_file is not None
    return JWTAuthenticator.from_jwks_file(jwks_file, **options)


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]
