"""What an authenticator is: the interface, its errors, and the checks every one makes.

An ``Authenticator`` turns one HTTP request into the identity the runtime acts
on; ``tether.api.auth`` has the two that ship with tether and chooses one.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

from fastapi import Request

from tether.api.ids import ID_PATTERN, MAX_ID_LENGTH
from tether.domain.chat_request import RequestHeaders
from tether.handlers.errors import TurnRequestError

_VALID_ID = re.compile(ID_PATTERN)


class AuthenticationError(TurnRequestError):
    """No credentials, or credentials that do not verify: 401 with a Bearer challenge."""

    status_code = 401
    code = "UNAUTHENTICATED"

    def __init__(self, message: str, *, token_given: bool = True) -> None:
        super().__init__(message)
        # RFC 6750 §3: a request without a token gets the bare challenge; one
        # whose token was refused is told so, for clients that refresh on it.
        self.challenge = 'Bearer realm="tether"'
        if token_given:
            self.challenge += ', error="invalid_token"'


class TenantNotAllowedError(TurnRequestError):
    """The verified identity may not act in the requested tenant."""

    status_code = 403
    code = "TENANT_NOT_ALLOWED"


class InvalidIdentityError(TurnRequestError):
    """Identity headers that no honest gateway sets (an id no store key can hold)."""

    status_code = 400
    code = "INVALID_IDENTITY"


class Authenticator(ABC):
    """Turns one HTTP request into the ``RequestHeaders`` the runtime acts on.

    ``authenticate`` runs on the event loop for every chat and conversation
    request (probes and the API docs are never authenticated), so it must not
    block on I/O: an authenticator that fetches keys over the network keeps
    them fresh in the background. It raises ``AuthenticationError`` (401) when
    the request proves no identity, ``TenantNotAllowedError`` (403) when the
    identity may not use the ``tenant`` it asks for, and may raise any other
    ``TurnRequestError`` for a malformed request. Whatever it returns is the
    requester for ownership checks: stores trust it completely.
    """

    @abstractmethod
    def authenticate(self, request: Request) -> RequestHeaders:
        """The identity of ``request``, or an error as above."""

    async def prepare(self, request: Request) -> None:
        """What ``authenticate`` needs from the network for this request (a
        key set), fetched before it runs; the async authentication dependency
        awaits it. Default: nothing."""
        return None


def check_tenant(request: Request, tenants: list[str] | None, refusal: str) -> None:
    """403 when ``tenants`` is a list (None: no limit) without the requested tenant.

    A route without a ``tenant`` parameter acts in no tenant, so passes."""
    tenant = request.query_params.get("tenant")
    if tenants is not None and tenant is not None and tenant not in tenants:
        raise TenantNotAllowedError(refusal)


def is_valid_id(value: str) -> bool:
    """Whether ``value`` can be a requester id (what a store key can hold)."""
    return len(value) <= MAX_ID_LENGTH and _VALID_ID.fullmatch(value) is not None
