"""Which tenants a request may act in: denied unless the identity names the tenant.

With JWT a token names its tenants (the ``tenants`` claim); a token without
the claim gets the configured default tenants, and without a default, none.
With identity headers, ``user-tenants`` limits the tenants when the gateway
sets it, as the seed's SDK does.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

import jwt
import pytest
from starlette.requests import Request

from tests.support.inprocess import build, client_of, turn
from tether.adapters.memory import InMemoryChatConversationStore
from tether.api.auth import (
    HeaderAuthenticator,
    JWTAuthenticator,
    TenantNotAllowedError,
    build_authenticator,
)
from tether.runtime.turn_stores import TurnStores
from tether.testing.contracts import ManualClock

SECRET = "tenant-limit-tests-shared-secret-0123456789"


def _request(headers: dict[str, str], tenant: str | None = "t") -> Request:
    query = urlencode({"tenant": tenant}) if tenant is not None else ""
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/conversations",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "query_string": query.encode(),
        }
    )


def _bearer(**claims: Any) -> dict[str, str]:
    payload = {"sub": "alice", "exp": int(time.time()) + 300, **claims}
    return {"Authorization": f"Bearer {jwt.encode(payload, SECRET, algorithm='HS256')}"}


def test_a_token_without_a_tenants_claim_may_use_no_tenant() -> None:
    auth = JWTAuthenticator.from_secret(SECRET)
    with pytest.raises(TenantNotAllowedError) as refused:
        auth.authenticate(_request(_bearer(), tenant="t"))
    assert refused.value.status_code == 403
    # A route that names no tenant acts in none: nothing to refuse.
    assert auth.authenticate(_request(_bearer(), tenant=None)).requester_uuid == "alice"


def test_a_token_without_a_tenants_claim_may_use_the_configured_default_tenants() -> None:
    auth = JWTAuthenticator.from_secret(SECRET, default_tenants=["t", "u"])
    assert auth.authenticate(_request(_bearer(), tenant="u")).user_tenants == ["t", "u"]
    with pytest.raises(TenantNotAllowedError):
        auth.authenticate(_request(_bearer(), tenant="other"))
    # A token that names its tenants gets exactly those, not the default.
    with pytest.raises(TenantNotAllowedError):
        auth.authenticate(_request(_bearer(tenants=["x"]), tenant="t"))
    assert auth.authenticate(_request(_bearer(tenants=["x"]), tenant="x")).user_tenants == ["x"]


def test_serve_options_set_default_tenants_only_with_jwt() -> None:
    auth = build_authenticator("jwt", secret=SECRET, default_tenants=["t"])
    assert auth.authenticate(_request(_bearer(), tenant="t")).user_tenants == ["t"]
    with pytest.raises(ValueError, match="only apply with --auth jwt"):
        build_authenticator("headers", default_tenants=["t"])


def test_the_user_tenants_header_limits_the_tenant_when_present() -> None:
    auth = HeaderAuthenticator()
    limited = {"requester-uuid": "alice", "user-tenants": "t, u"}
    assert auth.authenticate(_request(limited, tenant="u")).user_tenants == ["t", "u"]
    with pytest.raises(TenantNotAllowedError) as refused:
        auth.authenticate(_request(limited, tenant="other"))
    assert refused.value.status_code == 403
    with pytest.raises(TenantNotAllowedError):
        auth.authenticate(_request({"requester-uuid": "alice", "user-tenants": ""}, tenant="t"))
    # Without the header the gateway alone decides.
    assert (
        auth.authenticate(_request({"requester-uuid": "alice"}, tenant="any")).user_tenants is None
    )


async def test_a_request_outside_the_identitys_tenants_is_403_on_every_route() -> None:
    clock = ManualClock()
    stores = TurnStores(conversation=InMemoryChatConversationStore(clock=clock))
    for authenticator, outside, inside in (
        (JWTAuthenticator.from_secret(SECRET), _bearer(), _bearer(tenants=["t"])),
        (
            HeaderAuthenticator(),
            {"requester-uuid": "alice", "user-tenants": "u"},
            {"requester-uuid": "alice", "user-tenants": "t"},
        ),
    ):
        app = build(stores, clock=clock, authenticator=authenticator)
        async with client_of(app) as client:
            refused = [
                await client.get("/conversations?tenant=t", headers=outside),
                await client.post("/chat/response?tenant=t", headers=outside, json=turn("hi")),
                await client.get("/chat/stream/status?tenant=t&session_id=s", headers=outside),
                await client.delete("/chat/stream/m?tenant=t", headers=outside),
                await client.delete("/conversations/s?tenant=t", headers=outside),
            ]
            allowed = await client.post("/chat/response?tenant=t", headers=inside, json=turn("hi"))
        for response in refused:
            assert response.status_code == 403, (authenticator, response.text)
            assert response.json()["code"] == "TENANT_NOT_ALLOWED"
        assert allowed.status_code == 201, allowed.text
