"""Who is asking: the identity of one request, as the app's authenticator sees it.

``setup_app`` puts an ``Authenticator`` on ``app.state.authenticator`` (identity
headers from a trusted gateway unless told otherwise) and makes ``authenticate``
a dependency of every chat and conversation route, so a request that proves no
identity is refused before the route runs. Routes then call
``request_identity(request)``, which hands back that same identity.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request

from tether.api.auth import Authenticator, HeaderAuthenticator
from tether.api.forms import ErrorBody, ValidationErrorBody
from tether.domain.chat_request import RequestHeaders

_STATE_KEY = "tether_identity"


def _authenticator(request: Request) -> Authenticator:
    # An app assembled without setup_app has no authenticator: the seed's
    # behaviour, identity headers, is the only safe reading of that.
    authenticator: Authenticator | None = getattr(request.app.state, "authenticator", None)
    return authenticator or HeaderAuthenticator()


def request_identity(request: Request) -> RequestHeaders:
    """The requester of ``request``, authenticated once and remembered for the request.

    Raises the authenticator's errors (401, 403, 400) when called on a route
    that does not depend on ``authenticate``, so no route can skip the check.
    """
    identity = request.scope.get(_STATE_KEY)
    if isinstance(identity, RequestHeaders):
        return identity
    identity = _authenticator(request).authenticate(request)
    request.scope[_STATE_KEY] = identity
    return identity


async def authenticate(request: Request) -> RequestHeaders:
    """The FastAPI dependency: authenticate before the route's own checks.

    Async on purpose: a sync dependency would be sent to the thread pool for
    what is a header parse or a signature check. What the authenticator must
    fetch first (a JWKS URL's keys) is awaited here, off the event loop.
    """
    if not isinstance(request.scope.get(_STATE_KEY), RequestHeaders):
        await _authenticator(request).prepare(request)
    return request_identity(request)


AUTHENTICATED: list[Any] = [Depends(authenticate)]
"""``dependencies=`` for a router whose routes act for a requester."""

AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Malformed request or identity"},
    401: {"model": ErrorBody, "description": "No valid bearer token (with --auth jwt)"},
    403: {"model": ErrorBody, "description": "Not the owner, or a tenant the token excludes"},
    # Replaces FastAPI's default 422 schema: tether.api.validation_errors answers it.
    422: {"model": ValidationErrorBody, "description": "The request did not validate"},
}
"""What ``authenticate`` can answer, for the OpenAPI schema of those routers."""
