"""JWT keys read from the identity provider's JWKS URL, cached, and refreshed when it rotates them.

PyJWT's ``PyJWKClient`` does the fetching and the caching: the key set is
kept for ``lifespan`` seconds, and a token naming a key id the cached set does
not hold refreshes it at once (a rotation), at most once per ``cooldown``
seconds, so tokens with made-up key ids cannot make the server hammer the
provider. Its fetch is blocking (``urllib``), so it runs in a worker thread,
from the async authentication dependency (``tether.api.identity``), never on
the event loop; the lookup of the request is then handed to the synchronous
``Authenticator.authenticate``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import jwt
from starlette.requests import Request

from tether.handlers.errors import TurnRequestError

DEFAULT_LIFESPAN = 300.0
"""Seconds the fetched key set is used before it is fetched again."""
DEFAULT_COOLDOWN = 30.0
"""Seconds after a fetch before an unknown key id may fetch the set again."""
DEFAULT_TIMEOUT = 5.0
"""Seconds one fetch of the key set may take."""
RETRY_AFTER_SECONDS = 5
_SCOPE_KEY = "tether.jwks_key"
"""Where the key looked up for the request's token waits for ``authenticate``."""


class KeysUnavailableError(TurnRequestError):
    """503: the identity provider's key set could not be fetched (and none is cached)."""

    status_code = 503
    code = "IDENTITY_PROVIDER_UNAVAILABLE"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}


class RemoteKeys:
    """The signing keys published at a JWKS URL (see the module)."""

    def __init__(
        self,
        url: str,
        *,
        lifespan: float = DEFAULT_LIFESPAN,
        cooldown: float = DEFAULT_COOLDOWN,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        try:
            self._client = jwt.PyJWKClient(
                url,
                cache_jwk_set=True,
                lifespan=lifespan,
                timeout=timeout,
                cooldown_duration=cooldown,
            )
        except jwt.PyJWKClientError as error:
            raise ValueError(f"not a usable JWKS URL: {error}") from error
        self.url = url

    async def look_up(self, request: Request, header: dict[str, Any]) -> None:
        """Find the key the token's ``kid`` names, fetching the set if needed,
        and keep it for ``key_of(request)``. Raises ``KeysUnavailableError``
        when the set cannot be fetched, and returns without a key when the set
        has none by that id (``key_of`` then refuses the token)."""
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            return
        try:
            key = await asyncio.to_thread(self._client.get_signing_key, kid)
        except jwt.PyJWKClientConnectionError as error:
            raise KeysUnavailableError(
                "the identity provider's keys cannot be fetched right now; retry shortly"
            ) from error
        except jwt.PyJWKSetError as error:
            raise KeysUnavailableError(
                f"the identity provider's key set holds no usable key: {error}"
            ) from error
        except jwt.PyJWKClientError:
            return  # no key by that id, even after a refresh the cooldown allowed
        request.scope[_SCOPE_KEY] = key

    @staticmethod
    def key_of(request: Request) -> jwt.PyJWK | None:
        """The key ``look_up`` found for this request's token, if any."""
        key = request.scope.get(_SCOPE_KEY)
        return key if isinstance(key, jwt.PyJWK) else None
