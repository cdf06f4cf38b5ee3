"""MCP on the user's behalf, end to end: two real replicas sharing one store, a real
MCP server behind a real OAuth authorization server, the test playing the browser.

The agent on replica 1 meets the 401 and answers with an authorization link; the
browser follows it to the authorization server and is redirected to replica 2's
callback; the next turn on replica 1 calls the tool as the user. Then: tokens
expire and both replicas refresh at once (the refresh token is spent once), a
refresh refused for good asks the user again, states are single-use and expire,
another user of the tenant is not served by the first one's grant, and nothing
at rest holds a credential in clear.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx2
import pytest

from tests.support.clusters import ReplicaBackend
from tests.support.mcp.authorization_server import AuthorizationServer
from tests.support.mcp.project import make_mcp_project
from tests.support.mcp.raw_rows import raw_store_bytes
from tests.support.mcp.whoami_server import WhoamiServer
from tests.support.replicas import Replicas
from tests.support.servers import ServerProcess, free_port
from tests.support.services import import_or_skip
from tether.adapters.mcp import generate_encryption_key

TENANT = "acme"
PENDING_TTL = 4.0


KEY = generate_encryption_key()
"""The replicas' one MCP encryption key."""

pytestmark = [
    pytest.mark.processes,
    pytest.mark.parametrize(
        "replica_backend", ["file", "sqlite", "postgres"], indirect=True, scope="module"
    ),
    pytest.mark.replica_cluster(
        env={
            "TETHER_MCP_ENCRYPTION_KEYS": KEY,
            # Behind a load balancer every replica gives the same callback URL; here
            # it is replica 2's, so the browser's redirect lands there.
            "TETHER_MCP_REDIRECT_URI": "{two}/mcp/oauth/callback",
            "TETHER_MCP_PENDING_TTL": str(PENDING_TTL),
        }
    ),
]


@dataclass(frozen=True)
class Servers:
    """The OAuth authorization server and the MCP server behind it."""

    auth: AuthorizationServer
    mcp: WhoamiServer


@pytest.fixture(scope="module")
def servers(replica_backend: ReplicaBackend) -> Iterator[Servers]:
    """Fresh ones for each backend's replicas (they remember every grant)."""
    with AuthorizationServer() as auth, WhoamiServer(auth, static_tokens={"svc-key": "svc"}) as mcp:
        yield Servers(auth, mcp)


@pytest.fixture(scope="module")
def replica_project(replica_backend: ReplicaBackend, servers: Servers, replica_root: Path) -> Path:
    """The replicas' project: agents ``who`` (the MCP server as the user, and
    one that is down) and ``service`` (the MCP server with a static key)."""
    if replica_backend.name != "file":
        import_or_skip(f"tether.adapters.{replica_backend.name}.mcp_repository")
    return make_mcp_project(
        replica_root / "project",
        {
            "who": [
                {"name": "whoami", "url": servers.mcp.url, "auth": {"type": "oauth"}},
                {"name": "down", "url": f"http://127.0.0.1:{free_port()}/mcp", "timeout": 5},
            ],
            "service": [
                {
                    "name": "whoami",
                    "url": servers.mcp.url,
                    "auth": {"type": "header", "value": "Bearer svc-key"},
                }
            ],
        },
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=60) as client:
        yield client


async def _turn(
    http: httpx2.AsyncClient,
    replica: ServerProcess,
    user: str,
    agent: str = "who",
    tenant: str = TENANT,
) -> dict[str, Any]:
    response = await http.post(
        f"{replica.url}/chat/response",
        params={"tenant": tenant},
        headers={"requester-uuid": user},
        json={
            "agent_identifier": agent,
            "conversation": [{"sender": "user", "content": "Who am I?"}],
        },
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _contexts(message: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [
        part["context"][key]
        for part in message.get("content_parts") or []
        if part["type"] == "context" and key in (part.get("context") or {})
    ]


def _link(message: dict[str, Any]) -> str:
    links = _contexts(message, "mcp_authorization")
    assert [link["server"] for link in links] == ["whoami"], message
    url = str(links[0]["url"])
    assert url in message["content"], "the user reads the link too"
    return url


def _tool_responses(message: dict[str, Any]) -> list[Any]:
    return [
        part["tool"]["response"]
        for part in message.get("content_parts") or []
        if part["type"] == "tool" and part["tool"]["status"] == "completed"
    ]


async def _browser(http: httpx2.AsyncClient, link: str, user: str) -> str:
    """Follow the link as ``user`` logged in at the authorization server; the redirect."""
    response = await http.get(link, headers={"x-test-user": user})
    assert response.status_code == 302, response.text
    return str(response.headers["location"])


async def _connect(http: httpx2.AsyncClient, replicas: Replicas, user: str) -> None:
    link = _link(await _turn(http, replicas.one, user))
    page = await http.get(await _browser(http, link, user))
    assert page.status_code == 200 and "Connected" in page.text, page.text


async def test_authorize_on_one_replica_callback_on_the_other_then_act_as_the_user(
    replicas: Replicas, servers: Servers, http: httpx2.AsyncClient
) -> None:
    first = await _turn(http, replicas.one, "alice")
    link = _link(first)
    assert _tool_responses(first) == []
    down = _contexts(first, "mcp_unavailable")
    assert [notice["server"] for notice in down] == ["down"], "unreachable: reported, turn goes on"
    assert first["content"].endswith("Answer: no tools to ask.")

    callback = await _browser(http, link, "alice")
    assert callback.startswith(f"{replicas.two.url}/mcp/oauth/callback?"), callback
    page = await http.get(callback)
    assert page.status_code == 200 and "whoami is connected" in page.text

    second = await _turn(http, replicas.one, "alice")
    assert _tool_responses(second) == ["you are alice"]
    assert _contexts(second, "mcp_authorization") == []
    assert servers.mcp.calls[-1] == "alice"

    listed = await http.get(
        f"{replicas.two.url}/mcp/integrations",
        params={"tenant": TENANT},
        headers={"requester-uuid": "alice"},
    )
    assert listed.status_code == 200
    [integration] = listed.json()["integrations"]
    assert integration["server_name"] == "whoami"
    assert integration["status"] == "connected"
    assert integration["scopes"] == ["whoami"]
    assert integration["expires_at"] and integration["refreshable"] is True
    assert not any(secret in listed.text for secret in servers.auth.all_secrets())

    # The callback already used is refused, on either replica.
    for replica in (replicas.two, replicas.one):
        path = urlsplit(callback)
        again = await http.get(f"{replica.url}{path.path}?{path.query}")
        assert again.status_code == 400 and "already used" in again.text


async def test_the_rows_hold_no_credential_in_clear(
    replicas: Replicas, servers: Servers, replica_backend: ReplicaBackend, http: httpx2.AsyncClient
) -> None:
    await _connect(http, replicas, "olga")
    stored = raw_store_bytes(replica_backend.store_url)
    assert b"olga" in stored, "the rows are there"
    leaked = [secret for secret in servers.auth.all_secrets() if secret.encode() in stored]
    assert leaked == []


async def test_a_second_user_of_the_tenant_is_not_served_by_the_first_users_grant(
    replicas: Replicas, servers: Servers, http: httpx2.AsyncClient
) -> None:
    await _connect(http, replicas, "bart")
    answer = await _turn(http, replicas.one, "bea")
    assert _tool_responses(answer) == []
    _link(answer)
    assert "bea" not in servers.mcp.calls
    mine = await http.get(
        f"{replicas.one.url}/mcp/integrations",
        params={"tenant": TENANT},
        headers={"requester-uuid": "bea"},
    )
    assert [i["status"] for i in mine.json()["integrations"]] == ["pending"]


async def test_an_expired_state_is_refused(replicas: Replicas, http: httpx2.AsyncClient) -> None:
    link = _link(await _turn(http, replicas.one, "eve"))
    callback = await _browser(http, link, "eve")
    await asyncio.sleep(PENDING_TTL + 0.5)
    page = await http.get(callback)
    assert page.status_code == 400 and "expired" in page.text
    again = await _turn(http, replicas.one, "eve")
    assert _tool_responses(again) == []
    assert _link(again) != link, "a new authorization starts"


async def test_a_state_nobody_issued_is_refused(
    replicas: Replicas, http: httpx2.AsyncClient
) -> None:
    page = await http.get(
        f"{replicas.two.url}/mcp/oauth/callback", params={"state": "forged", "code": "x"}
    )
    assert page.status_code == 400 and "unknown" in page.text
    missing = await http.get(f"{replicas.two.url}/mcp/oauth/callback")
    assert missing.status_code == 400


async def test_expired_tokens_are_refreshed_once_across_two_replicas(
    replicas: Replicas, servers: Servers, http: httpx2.AsyncClient
) -> None:
    servers.auth.access_token_lifetime = 1.0
    try:
        await _connect(http, replicas, "carol")
    finally:
        servers.auth.access_token_lifetime = 3600.0
    [refresh_token] = servers.auth.refresh_tokens_of("carol")
    await asyncio.sleep(1.5)  # the access token is now expired for everyone
    servers.auth.refresh_delay = 0.5  # both replicas arrive while the first refresh runs
    try:
        answers = await asyncio.gather(
            *(_turn(http, replica, "carol") for replica in (replicas.one, replicas.two) * 3)
        )
    finally:
        servers.auth.refresh_delay = 0.0
    assert [_tool_responses(answer) for answer in answers] == [["you are carol"]] * 6
    assert servers.auth.refresh_presentations[refresh_token] == 1
    assert (
        sum(servers.auth.refresh_presentations[t] for t in servers.auth.refresh_tokens_of("carol"))
        == 1
    )


async def test_a_refresh_refused_for_good_asks_the_user_again(
    replicas: Replicas, servers: Servers, http: httpx2.AsyncClient
) -> None:
    await _connect(http, replicas, "rita")
    servers.auth.expire_access_tokens("rita")
    servers.auth.revoke_refresh_tokens("rita")
    answer = await _turn(http, replicas.two, "rita")
    assert _tool_responses(answer) == []
    _link(answer)
    listed = await http.get(
        f"{replicas.one.url}/mcp/integrations",
        params={"tenant": TENANT},
        headers={"requester-uuid": "rita"},
    )
    assert [i["status"] for i in listed.json()["integrations"]] == ["pending"]


async def test_disconnecting_forgets_the_grant(
    replicas: Replicas, http: httpx2.AsyncClient
) -> None:
    await _connect(http, replicas, "dan")
    gone = await http.delete(
        f"{replicas.two.url}/mcp/integrations/whoami",
        params={"tenant": TENANT},
        headers={"requester-uuid": "dan"},
    )
    assert gone.status_code == 204
    answer = await _turn(http, replicas.one, "dan")
    assert _tool_responses(answer) == []
    _link(answer)
    again = await http.delete(
        f"{replicas.two.url}/mcp/integrations/nothing",
        params={"tenant": TENANT},
        headers={"requester-uuid": "dan"},
    )
    assert again.status_code == 404


async def test_a_static_header_server_needs_no_user_authorization(
    replicas: Replicas, http: httpx2.AsyncClient
) -> None:
    answer = await _turn(http, replicas.one, "anyone", agent="service")
    assert _tool_responses(answer) == ["you are svc"]


async def test_a_request_cannot_add_an_mcp_server(
    replicas: Replicas, http: httpx2.AsyncClient
) -> None:
    response = await http.post(
        f"{replicas.one.url}/chat/response",
        params={"tenant": TENANT},
        headers={"requester-uuid": "mallory"},
        json={
            "agent_identifier": "service",
            "conversation": [{"sender": "user", "content": "Who am I?"}],
            "bot_params": {"mcp_servers": [{"name": "evil", "url": "http://127.0.0.1:1/mcp"}]},
        },
    )
    assert response.status_code == 400
    assert response.json()["code"] == "BOT_PARAMS_REJECTED"


async def test_first_turns_on_two_replicas_at_once_keep_one_client_and_both_connect(
    replicas: Replicas, servers: Servers, replica_backend: ReplicaBackend, http: httpx2.AsyncClient
) -> None:
    """A new tenant's first turns meet the 401 on both replicas together and both
    register a client; the later one uses the one stored first, so both connect."""
    tenant = f"race-{urlsplit(replica_backend.store_url).scheme}"
    servers.auth.registration_delays = [0.3, 1.2]
    try:
        answers = await asyncio.gather(
            _turn(http, replicas.one, "quinn", tenant=tenant),
            _turn(http, replicas.two, "ravi", tenant=tenant),
        )
    finally:
        servers.auth.registration_delays = []
    links = [_link(answer) for answer in answers]
    client_ids = {dict(parse_qsl(urlsplit(link).query))["client_id"] for link in links}
    assert len(client_ids) == 1, "both links name the one client kept"
    for link, user in zip(links, ("quinn", "ravi"), strict=True):
        page = await http.get(await _browser(http, link, user))
        assert page.status_code == 200 and "Connected" in page.text, page.text
    for replica, user in ((replicas.two, "quinn"), (replicas.one, "ravi")):
        answer = await _turn(http, replica, user, tenant=tenant)
        assert _tool_responses(answer) == [f"you are {user}"]


async def test_a_malformed_state_or_code_is_a_400_on_every_backend(
    replicas: Replicas, http: httpx2.AsyncClient
) -> None:
    callback = f"{replicas.two.url}/mcp/oauth/callback"
    for state in ("a\x00b", "\x00", "s" * 5000, "état", "a'b"):
        page = await http.get(callback, params={"state": state, "code": "c"})
        assert page.status_code == 400, (repr(state[:10]), page.status_code, page.text[:300])
        assert "text/html" in page.headers["content-type"]
    link = _link(await _turn(http, replicas.one, "nul"))
    params = dict(parse_qsl(urlsplit(await _browser(http, link, "nul")).query))
    for code in ("c\x00", "c" * 5000):
        page = await http.get(callback, params={**params, "code": code})
        assert page.status_code == 400, (repr(code[:10]), page.status_code)
    page = await http.get(callback, params=params)
    assert page.status_code == 200 and "Connected" in page.text, "the link still works"
