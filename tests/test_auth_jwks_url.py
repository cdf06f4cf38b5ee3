"""JWT keys from the identity provider's JWKS URL (``tether.api.jwks``, PyJWT's ``PyJWKClient``).

A real HTTP server in a thread publishes the key set and counts its fetches;
requests go through the app's authentication dependency, as every chat and
conversation route's do.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.support.inprocess import build, client_of
from tether.adapters.memory import InMemoryChatConversationStore
from tether.api.auth import AuthMode, JWTAuthenticator, build_authenticator
from tether.api.jwks import RemoteKeys
from tether.runtime.turn_stores import TurnStores


class _Provider:
    """The identity provider's JWKS endpoint: a key set the test changes."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches = 0
        self.up = True
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if not provider.up:
                    self.send_error(503)
                    return
                provider.fetches += 1
                body = json.dumps({"keys": provider.published()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/jwks.json"

    def published(self) -> list[dict[str, Any]]:
        return [
            {**RSAAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": kid, "alg": "RS256"}
            for kid, key in self.keys.items()
        ]

    def rotate(self, kid: str) -> rsa.RSAPrivateKey:
        """Publish only a new key ``kid``."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.keys = {kid: key}
        return key


@pytest.fixture
def provider() -> Iterator[_Provider]:
    served = _Provider()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.server.shutdown()
        served.server.server_close()
        thread.join()


def _token(key: rsa.RSAPrivateKey, kid: str | None) -> dict[str, str]:
    claims = {"sub": "alice", "exp": int(time.time()) + 300, "tenants": ["t"]}
    token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid} if kid else None)
    return {"Authorization": f"Bearer {token}"}


def _app(authenticator: JWTAuthenticator) -> Any:
    return build(
        TurnStores(conversation=InMemoryChatConversationStore()), authenticator=authenticator
    )


async def test_tokens_verify_with_the_published_keys_fetched_once_and_cached(
    provider: _Provider,
) -> None:
    key = provider.rotate("k1")
    app = _app(JWTAuthenticator.from_jwks_url(provider.url))
    async with client_of(app) as client:
        for _ in range(5):
            answer = await client.get("/conversations?tenant=t", headers=_token(key, "k1"))
            assert answer.status_code == 200, answer.text
        assert provider.fetches == 1
        forged = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        refused = await client.get("/conversations?tenant=t", headers=_token(forged, "k1"))
        assert refused.status_code == 401
        no_kid = await client.get("/conversations?tenant=t", headers=_token(key, None))
        assert no_kid.status_code == 401 and "kid" in no_kid.json()["message"]


async def test_a_rotated_key_is_fetched_when_a_token_first_names_it(provider: _Provider) -> None:
    old = provider.rotate("k1")
    authenticator = JWTAuthenticator(
        [], remote=RemoteKeys(provider.url, cooldown=0.0)
    )  # no cooldown: the rotation is seen at once
    async with client_of(_app(authenticator)) as client:
        assert (
            await client.get("/conversations?tenant=t", headers=_token(old, "k1"))
        ).status_code == 200
        new = provider.rotate("k2")
        answer = await client.get("/conversations?tenant=t", headers=_token(new, "k2"))
        assert answer.status_code == 200, answer.text
        assert provider.fetches == 2
        # The old key is no longer published: once the set is fetched again, it is refused.
        assert (
            await client.get("/conversations?tenant=t", headers=_token(old, "k1"))
        ).status_code == 401


async def test_made_up_key_ids_fetch_the_set_at_most_once_per_cooldown(provider: _Provider) -> None:
    key = provider.rotate("k1")
    app = _app(JWTAuthenticator.from_jwks_url(provider.url))  # the default 30 s cooldown
    async with client_of(app) as client:
        assert (
            await client.get("/conversations?tenant=t", headers=_token(key, "k1"))
        ).status_code == 200
        for n in range(10):
            made_up = await client.get("/conversations?tenant=t", headers=_token(key, f"x{n}"))
            assert made_up.status_code == 401
    assert provider.fetches == 1


async def test_an_unreachable_provider_is_a_503_with_retry_after(provider: _Provider) -> None:
    key = provider.rotate("k1")
    provider.up = False
    async with client_of(_app(JWTAuthenticator.from_jwks_url(provider.url))) as client:
        answer = await client.get("/conversations?tenant=t", headers=_token(key, "k1"))
    assert answer.status_code == 503
    assert answer.json()["code"] == "IDENTITY_PROVIDER_UNAVAILABLE"
    assert answer.headers["retry-after"] == "5"


def test_the_serve_options_take_a_jwks_url_as_one_key_source(provider: _Provider) -> None:
    built = build_authenticator(AuthMode.JWT, jwks_url=provider.url)
    assert isinstance(built, JWTAuthenticator) and built.remote is not None
    with pytest.raises(ValueError, match="exactly one"):
        build_authenticator(AuthMode.JWT, jwks_url=provider.url, secret="s" * 40)
    with pytest.raises(ValueError, match="only apply with --auth jwt"):
        build_authenticator(AuthMode.HEADERS, jwks_url=provider.url)
    with pytest.raises(ValueError, match="JWKS URL"):
        JWTAuthenticator.from_jwks_url("file:///etc/passwd")
