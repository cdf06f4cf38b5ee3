"""``MCPTools`` against a real MCP server behind a real OAuth server, in one process.

What a turn sees: the user's tools, or a notice per server that cannot be used
(unreachable, needing the user's authorization, skipped for want of a store, a
key or a user), and the whole authorization flow through the callback route.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx2
import pytest
from fastapi import FastAPI

from tests.support.mcp.authorization_server import AuthorizationServer
from tests.support.mcp.threaded import ThreadedServer
from tests.support.mcp.whoami_server import WhoamiServer
from tests.support.servers import free_port
from tether.adapters.llm import OfflineChatModel
from tether.adapters.llm.chat_client import ChatClientFactory
from tether.adapters.mcp import (
    ENCRYPTION_KEYS_ENV,
    InMemoryMCPOAuthRepository,
    MCPOAuthCipher,
    MCPOAuthIntegrationStore,
    MCPOAuthSettings,
    generate_encryption_key,
    get_mcp_oauth_token_client,
)
from tether.adapters.mcp.connection import MCPCallError
from tether.adapters.mcp.runtime import MCPOAuthRuntime, use_mcp_oauth_runtime
from tether.api.app import setup_app
from tether.api.routers.mcp import RedactOAuthCallbackFilter, install_mcp_oauth
from tether.domain.agent_registries import AgentRegistriesFactory, CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPartType,
    ToolCallStatus,
)
from tether.domain.chat_request import ChatRequest
from tether.domain.turn_context import TurnContext
from tether.mcp_tools import MCPTools, MCPToolsFactory
from tether.tools import ToolCallContext, running_tool_call

KEY = generate_encryption_key()
CALLBACK = "http://tether.test/mcp/oauth/callback"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[AuthorizationServer, WhoamiServer]]:
    with AuthorizationServer() as auth, WhoamiServer(auth, static_tokens={"svc-key": "svc"}) as mcp:
        yield auth, mcp


@pytest.fixture
def auth(servers: tuple[AuthorizationServer, WhoamiServer]) -> AuthorizationServer:
    return servers[0]


@pytest.fixture
def mcp(servers: tuple[AuthorizationServer, WhoamiServer]) -> WhoamiServer:
    return servers[1]


@pytest.fixture
def store() -> MCPOAuthIntegrationStore:
    return MCPOAuthIntegrationStore(
        InMemoryMCPOAuthRepository(MCPOAuthCipher([KEY])), settings=MCPOAuthSettings()
    )


@pytest.fixture
def runtime(store: MCPOAuthIntegrationStore) -> MCPOAuthRuntime:
    return MCPOAuthRuntime(store, get_mcp_oauth_token_client(), CALLBACK)


@pytest.fixture
async def tether(runtime: MCPOAuthRuntime) -> AsyncIterator[httpx2.AsyncClient]:
    """The callback and integration routes of an app holding ``runtime``'s store."""
    app = _app(runtime.store, runtime.token_client)
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://tether.test") as client:
        yield client


class _NoAgents(AgentRegistriesFactory):
    async def get_setup(self, agent_identifier: str) -> AgentSetup | None:
        return None

    async def list_setups(self) -> list[AgentSetup]:
        return []

    def check_bot_params(self, setup: AgentSetup, bot_params: dict[str, Any] | None) -> None:
        return None

    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        raise AssertionError("no agents here")


def _app(store: MCPOAuthIntegrationStore | None, token_client: Any) -> FastAPI:
    app = setup_app(_NoAgents(), mcp_oauth_store=store, mcp_oauth_token_client=token_client)
    install_mcp_oauth(app)
    return app


def _tools(
    servers: list[dict[str, Any]], runtime: MCPOAuthRuntime | None, user: str = "alice"
) -> MCPTools:
    setup = AgentSetup(
        agent_identifier="agent", agent_name="agent", agent_configuration={"mcp_servers": servers}
    )
    turn = TurnContext(
        tenant="t", requester_uuid=user, session_id=None, message_id="m", agent_identifier="agent"
    )
    with use_mcp_oauth_runtime(runtime):
        return MCPToolsFactory.create(setup, turn)


def _oauth(mcp: WhoamiServer, **auth: Any) -> dict[str, Any]:
    return {"name": "who", "url": mcp.url, "auth": {"type": "oauth", **auth}}


async def _redirect(tools: MCPTools, user: str, callback: str = CALLBACK) -> dict[str, str]:
    """Follow the link as ``user`` at the authorization server: the callback's parameters."""
    [notice] = [n for n in tools.notices if n.kind == "authorization_required"]
    assert notice.url is not None
    async with httpx2.AsyncClient() as browser:
        redirect = await browser.get(notice.url, headers={"x-test-user": user})
    assert redirect.status_code == 302
    location = urlsplit(redirect.headers["location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == callback
    return dict(parse_qsl(location.query))


async def _authorize(
    tools: MCPTools, tether: httpx2.AsyncClient, user: str, callback: str = CALLBACK
) -> httpx2.Response:
    params = await _redirect(tools, user, callback)
    return await tether.get("/mcp/oauth/callback", params=params)


def _link_params(tools: MCPTools) -> dict[str, str]:
    [notice] = [n for n in tools.notices if n.kind == "authorization_required"]
    assert notice.url is not None
    return dict(parse_qsl(urlsplit(notice.url).query))


def _clients_of(auth: AuthorizationServer, user: str) -> set[str]:
    """The clients the live access tokens of ``user`` were issued to."""
    live = [g for g in list(auth.access_tokens.values()) if g.expires_at > time.time()]
    return {g.client_id for g in live if g.subject == user}


def test_server_configuration_is_checked_and_names_the_agent() -> None:
    for servers, problem in (
        ("nope", "must be a list"),
        ([{"name": "a", "url": "ftp://x"}], "http"),
        ([{"name": "a b", "url": "http://x"}], "name"),
        ([{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}], "repeated: a"),
        ([{"name": "a", "url": "http://x", "auth": {"type": "magic"}}], "auth"),
    ):
        setup = AgentSetup(
            agent_identifier="helper", agent_name="x", agent_configuration={"mcp_servers": servers}
        )
        turn = TurnContext(
            tenant="t",
            requester_uuid="u",
            session_id=None,
            message_id="m",
            agent_identifier="helper",
        )
        with pytest.raises(ValueError, match="helper") as raised:
            MCPToolsFactory.create(setup, turn)
        assert problem in str(raised.value)


async def test_an_unreachable_server_is_reported_and_the_others_still_serve(
    mcp: WhoamiServer, runtime: MCPOAuthRuntime
) -> None:
    down = {"name": "down", "url": f"http://127.0.0.1:{free_port()}/mcp", "timeout": 5}
    static = {"name": "svc", "url": mcp.url, "auth": {"type": "header", "value": "Bearer svc-key"}}
    tools = _tools([down, static], runtime)
    offered = await tools.tools()
    assert sorted(tool.name for tool in offered) == [
        f"svc__{name}" for name in ("boom", "look", "put", "send", "whoami")
    ]
    [notice] = tools.notices
    assert (notice.server, notice.kind) == ("down", "unavailable")
    assert "could not be reached" in notice.reason
    answer = tools.annotate(ChatMessage(sender=ChatMessageSender.BOT, content="Hello."))
    assert answer.content.startswith("The MCP server down is unavailable right now")
    assert answer.content.endswith("\n\nHello.")
    parts = answer.content_parts or []
    assert [p.type for p in parts] == [ContentPartType.TEXT, ContentPartType.CONTEXT]
    assert parts[1].context == {"mcp_unavailable": {"server": "down", "reason": notice.reason}}
    prompt = tools.system_prompt("Base.")
    assert prompt is not None and prompt.startswith("Base.") and "- down is unavailable" in prompt


async def test_a_static_header_server_is_used_with_its_header(mcp: WhoamiServer) -> None:
    static = {"name": "svc", "url": mcp.url, "auth": {"type": "header", "value": "Bearer svc-key"}}
    tools = _tools([static], None)
    by_name = {tool.name: tool for tool in await tools.tools()}
    assert await by_name["svc__whoami"].invoke({}) == "you are svc"
    with pytest.raises(MCPCallError, match="boom went the tool"):
        await by_name["svc__boom"].invoke({})
    wrong = _tools([{**static, "auth": {"type": "header", "value": "Bearer nope"}}], None)
    assert await wrong.tools() == []
    assert "refused the configured credentials" in wrong.notices[0].reason
    bare = _tools([{"name": "svc", "url": mcp.url}], None)
    assert await bare.tools() == []
    assert "requires authorization" in bare.notices[0].reason


async def test_tool_names_carry_the_prefix_and_the_allow_list_applies(mcp: WhoamiServer) -> None:
    static = {"name": "svc", "url": mcp.url, "auth": {"type": "header", "value": "Bearer svc-key"}}
    tools = _tools([{**static, "tool_prefix": "", "tools": ["whoami"]}], None)
    [tool] = await tools.tools()
    assert tool.name == "whoami" and tool.remote_name == "whoami"
    assert tool.spec().parameters["type"] == "object"
    assert tool.description.startswith("Say who the caller is")


async def test_without_a_store_servers_needing_authorization_are_skipped(
    mcp: WhoamiServer,
) -> None:
    tools = _tools([_oauth(mcp)], None)
    assert await tools.tools() == []
    [notice] = tools.notices
    assert notice.kind == "skipped" and "no MCP OAuth store" in notice.reason
    answer = tools.annotate(ChatMessage(sender=ChatMessageSender.BOT, content="Hi."))
    assert answer.content.startswith("The tools of who are not available")


async def test_an_anonymous_requester_is_not_authorized_on_anyones_behalf(
    mcp: WhoamiServer, runtime: MCPOAuthRuntime
) -> None:
    tools = _tools([_oauth(mcp)], runtime, user="")
    assert await tools.tools() == []
    assert "names no user" in tools.notices[0].reason


async def test_without_an_encryption_key_no_authorization_starts(
    auth: AuthorizationServer, mcp: WhoamiServer
) -> None:
    keyless = MCPOAuthIntegrationStore(InMemoryMCPOAuthRepository(MCPOAuthCipher()))
    registrations = auth.registrations
    tools = _tools([_oauth(mcp)], MCPOAuthRuntime(keyless, get_mcp_oauth_token_client(), CALLBACK))
    assert await tools.tools() == []
    [notice] = tools.notices
    assert notice.kind == "skipped" and ENCRYPTION_KEYS_ENV in notice.reason
    assert auth.registrations == registrations, "no client registered for nothing"


async def test_the_whole_flow_in_one_process(
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    runtime: MCPOAuthRuntime,
    tether: httpx2.AsyncClient,
) -> None:
    registrations = auth.registrations
    first = _tools([_oauth(mcp)], runtime)
    assert await first.tools() == []
    [link] = first.content_parts()
    assert link.context is not None and link.context["mcp_authorization"]["server"] == "who"
    again = _tools([_oauth(mcp)], runtime)
    await again.tools()
    assert again.notices == first.notices, "the live link is offered again, not a new one"
    assert auth.registrations == registrations + 1

    listed = await tether.get("/mcp/integrations?tenant=t", headers={"requester-uuid": "alice"})
    [pending] = listed.json()["integrations"]
    assert (
        pending["status"] == "pending"
        and pending["authorization_url"] == link.context["mcp_authorization"]["url"]
    )

    page = await _authorize(first, tether, "alice")
    assert page.status_code == 200 and "who is connected" in page.text
    assert page.headers["cache-control"] == "no-store"

    connected = _tools([_oauth(mcp)], runtime)
    [whoami] = [tool for tool in await connected.tools() if tool.name == "who__whoami"]
    assert connected.notices == []
    assert await whoami.invoke({}) == "you are alice"
    listed = await tether.get("/mcp/integrations?tenant=t", headers={"requester-uuid": "alice"})
    [integration] = listed.json()["integrations"]
    assert integration["status"] == "connected" and integration["authorization_url"] is None
    assert not any(secret in listed.text for secret in auth.all_secrets())

    bob = _tools([_oauth(mcp)], runtime, user="bob")
    assert await bob.tools() == []
    assert bob.notices[0].kind == "authorization_required"


async def test_the_callback_says_why_it_failed(
    mcp: WhoamiServer,
    runtime: MCPOAuthRuntime,
    tether: httpx2.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tools = _tools([_oauth(mcp)], runtime)
    await tools.tools()
    assert tools.notices[0].url is not None
    state = dict(part.split("=", 1) for part in urlsplit(tools.notices[0].url).query.split("&"))[
        "state"
    ]
    denied = await tether.get(
        "/mcp/oauth/callback",
        params={"state": state, "error": "access_denied", "error_description": "user said no"},
    )
    assert (
        denied.status_code == 400
        and "did not grant access (access_denied: user said no)" in denied.text
    )
    replay = await tether.get("/mcp/oauth/callback", params={"state": state, "code": "x"})
    assert replay.status_code == 400 and "already used" in replay.text

    tools = _tools([_oauth(mcp)], runtime)
    await tools.tools()
    assert tools.notices[0].url is not None
    state = dict(part.split("=", 1) for part in urlsplit(tools.notices[0].url).query.split("&"))[
        "state"
    ]
    with caplog.at_level(logging.WARNING, logger="tether.api.routers.mcp"):
        forged = await tether.get("/mcp/oauth/callback", params={"state": state, "code": "forged"})
    # A plain page with a reference; the endpoint and the server's words go to the log.
    assert forged.status_code == 502 and "who did not complete the connection" in forged.text
    assert "/token" not in forged.text and "invalid_grant" not in forged.text
    assert "unknown or used code" not in forged.text
    [reference] = re.findall(r"Reference: ([0-9a-f]+)", forged.text)
    [logged] = [r.getMessage() for r in caplog.records if reference in r.getMessage()]
    assert "invalid_grant" in logged and "/token" in logged


async def test_a_server_without_a_store_answers_the_callback_plainly() -> None:
    app = _app(None, None)
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://tether.test"
    ) as client:
        page = await client.get("/mcp/oauth/callback", params={"state": "s", "code": "c"})
        assert page.status_code == 404 and "no MCP OAuth store" in page.text
        listed = await client.get("/mcp/integrations?tenant=t", headers={"requester-uuid": "a"})
        assert listed.status_code == 501


async def test_a_token_refused_before_its_expiry_is_refreshed_once(
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    runtime: MCPOAuthRuntime,
    tether: httpx2.AsyncClient,
) -> None:
    tools = _tools([_oauth(mcp)], runtime, user="rosa")
    await tools.tools()
    await _authorize(tools, tether, "rosa")
    [refresh_token] = auth.refresh_tokens_of("rosa")
    auth.expire_access_tokens("rosa")  # revoked early: our stored expiry is still ahead
    again = _tools([_oauth(mcp)], runtime, user="rosa")
    [whoami] = [tool for tool in await again.tools() if tool.name == "who__whoami"]
    assert await whoami.invoke({}) == "you are rosa"
    assert auth.refresh_presentations[refresh_token] == 1


async def test_a_call_refused_for_good_asks_for_authorization_and_the_answer_shows_it(
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    runtime: MCPOAuthRuntime,
    tether: httpx2.AsyncClient,
) -> None:
    tools = _tools([_oauth(mcp)], runtime, user="ivan")
    await tools.tools()
    await _authorize(tools, tether, "ivan")
    turn = _tools([_oauth(mcp)], runtime, user="ivan")
    [whoami] = [tool for tool in await turn.tools() if tool.name == "who__whoami"]
    auth.expire_access_tokens("ivan")
    auth.revoke_refresh_tokens("ivan")
    with pytest.raises(MCPCallError, match="needs the user's authorization"):
        await whoami.invoke({})
    [notice] = turn.notices
    assert notice.kind == "authorization_required" and notice.url
    answer = turn.annotate(ChatMessage(sender=ChatMessageSender.BOT, content="Sorry."))
    assert notice.url in answer.content


# ---------------------------------------------------------------- clients per callback URL

OTHER_CALLBACK = "http://localhost.tether.test/mcp/oauth/callback"


async def _connect(
    runtime: MCPOAuthRuntime, mcp: WhoamiServer, tether: httpx2.AsyncClient, user: str
) -> None:
    tools = _tools([_oauth(mcp)], runtime, user=user)
    assert await tools.tools() == []
    page = await _authorize(tools, tether, user, runtime.redirect_uri or CALLBACK)
    assert page.status_code == 200 and "who is connected" in page.text, page.text


async def test_a_second_callback_url_keeps_the_first_client_and_its_users_tokens(
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    store: MCPOAuthIntegrationStore,
    tether: httpx2.AsyncClient,
) -> None:
    """One replica reached as 127.0.0.1 and another as localhost (no
    TETHER_MCP_REDIRECT_URI): each callback URL gets its client, kept side by side,
    and every user's tokens are refreshed as the client they were issued to."""
    first = MCPOAuthRuntime(store, get_mcp_oauth_token_client(), CALLBACK)
    second = MCPOAuthRuntime(store, get_mcp_oauth_token_client(), OTHER_CALLBACK)
    registrations = auth.registrations
    await _connect(first, mcp, tether, "hana")
    await _connect(second, mcp, tether, "omar")
    assert auth.registrations == registrations + 2, "one client per callback URL"
    [hanas_client], [omars_client] = _clients_of(auth, "hana"), _clients_of(auth, "omar")
    assert hanas_client != omars_client

    for user, runtime, client in (("hana", first, hanas_client), ("omar", second, omars_client)):
        [refresh_token] = auth.refresh_tokens_of(user)
        auth.expire_access_tokens(user)  # refused early: a refresh is forced
        turn = _tools([_oauth(mcp)], runtime, user=user)
        [whoami] = [tool for tool in await turn.tools() if tool.name == "who__whoami"]
        assert turn.notices == [], f"{user} is not asked to log in again"
        assert await whoami.invoke({}) == f"you are {user}"
        assert auth.refresh_presentations[refresh_token] == 1
        assert _clients_of(auth, user) == {client}, "refreshed as the client it was issued to"

    # More users under either URL: the clients kept are used, none is registered.
    await _connect(first, mcp, tether, "ines")
    await _connect(second, mcp, tether, "pavel")
    assert auth.registrations == registrations + 2
    assert _clients_of(auth, "ines") == {hanas_client}
    assert _clients_of(auth, "pavel") == {omars_client}
    record = await store.get_client_info("t", "who")
    assert record is not None
    assert record.client_info["client_id"] == hanas_client
    [other] = record.client_info["other_clients"]
    assert other["client_id"] == omars_client and other["redirect_uris"] == [OTHER_CALLBACK]


async def test_first_turns_registering_at_once_keep_one_client_and_both_connect(
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    store: MCPOAuthIntegrationStore,
    tether: httpx2.AsyncClient,
) -> None:
    """Two replicas (two runtimes over one store) meet the 401 together and both
    register; the one that finishes last uses the client of the one that finished
    first, so both users' callbacks work."""
    one = MCPOAuthRuntime(store, get_mcp_oauth_token_client(), CALLBACK)
    two = MCPOAuthRuntime(store, get_mcp_oauth_token_client(), CALLBACK)
    quick, slow = _tools([_oauth(mcp)], one, user="uma"), _tools([_oauth(mcp)], two, user="vic")
    auth.registration_delays = [0.2, 0.8]
    try:
        await asyncio.gather(quick.tools(), slow.tools())
    finally:
        auth.registration_delays = []
    client_ids = {_link_params(quick)["client_id"], _link_params(slow)["client_id"]}
    assert len(client_ids) == 1, "both links name the one client kept"
    for tools, user in ((quick, "uma"), (slow, "vic")):
        page = await _authorize(tools, tether, user)
        assert page.status_code == 200 and "who is connected" in page.text, page.text
        assert _clients_of(auth, user) == client_ids
    record = await store.get_client_info("t", "who")
    assert record is not None and record.client_info["client_id"] in client_ids
    assert "other_clients" not in record.client_info


async def test_a_client_configured_in_the_setup_is_stored_beside_the_others(
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    store: MCPOAuthIntegrationStore,
    tether: httpx2.AsyncClient,
) -> None:
    runtime = MCPOAuthRuntime(store, get_mcp_oauth_token_client(), CALLBACK)
    await _connect(runtime, mcp, tether, "wim")
    [registered] = _clients_of(auth, "wim")
    configured = {
        "client_id": "configured-client",
        "client_secret": "configured-secret",
        "redirect_uris": [CALLBACK],
        "token_endpoint_auth_method": "client_secret_post",
        "grant_types": ["authorization_code", "refresh_token"],
    }
    auth.clients["configured-client"] = configured
    server = _oauth(mcp, client_id="configured-client", client_secret="configured-secret")
    tools = _tools([server], runtime, user="xia")
    assert await tools.tools() == []
    assert _link_params(tools)["client_id"] == "configured-client"
    page = await _authorize(tools, tether, "xia")
    assert page.status_code == 200, page.text
    assert _clients_of(auth, "xia") == {"configured-client"}
    # wim's tokens, issued to the registered client, still refresh as that client.
    [refresh_token] = auth.refresh_tokens_of("wim")
    auth.expire_access_tokens("wim")
    turn = _tools([_oauth(mcp)], runtime, user="wim")
    [whoami] = [tool for tool in await turn.tools() if tool.name == "who__whoami"]
    assert await whoami.invoke({}) == "you are wim"
    assert auth.refresh_presentations[refresh_token] == 1
    assert _clients_of(auth, "wim") == {registered}


# ---------------------------------------------------------------- RFC 9207 iss


@pytest.mark.parametrize("advertised", [True, False])
async def test_a_response_from_another_issuer_is_refused(
    advertised: bool,
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    runtime: MCPOAuthRuntime,
    tether: httpx2.AsyncClient,
) -> None:
    auth.iss_parameter_supported = advertised
    try:
        for user in ("yara", "zeno"):
            tools = _tools([_oauth(mcp)], runtime, user=f"{user}-{advertised}")
            await tools.tools()
            params = await _redirect(tools, f"{user}-{advertised}")
            assert params["iss"] == auth.issuer
            if user == "yara":
                params["iss"] = "https://mix-up.example"
                page = await tether.get("/mcp/oauth/callback", params=params)
                assert page.status_code == 400 and "issuer" in page.text, page.text
            else:
                del params["iss"]
                page = await tether.get("/mcp/oauth/callback", params=params)
                if advertised:
                    assert page.status_code == 400 and "issuer" in page.text, page.text
                else:
                    assert page.status_code == 200, "iss is optional when not advertised"
        tools = _tools([_oauth(mcp)], runtime, user=f"right-{advertised}")
        await tools.tools()
        page = await _authorize(tools, tether, f"right-{advertised}")
        assert page.status_code == 200, page.text
    finally:
        auth.iss_parameter_supported = False


# ---------------------------------------------------------------- malformed callbacks


async def test_every_malformed_state_or_code_is_a_plain_400_and_keeps_the_link(
    mcp: WhoamiServer, runtime: MCPOAuthRuntime, tether: httpx2.AsyncClient
) -> None:
    for state in ("a\x00b", "s" * 5000, "état", "a b", "<script>", "a\nb"):
        page = await tether.get("/mcp/oauth/callback", params={"state": state, "code": "c"})
        assert page.status_code == 400, (state[:20], page.status_code)
        assert page.headers["content-type"].startswith("text/html")
    tools = _tools([_oauth(mcp)], runtime, user="mo")
    await tools.tools()
    params = await _redirect(tools, "mo")
    for code in ("c\x00d", "c" * 5000, "c\u00e9", "c\td"):
        page = await tether.get("/mcp/oauth/callback", params={**params, "code": code})
        assert page.status_code == 400, (code[:20], page.status_code)
    for name in ("iss", "error"):
        page = await tether.get("/mcp/oauth/callback", params={**params, name: "x\x00"})
        assert page.status_code == 400
    page = await tether.get("/mcp/oauth/callback", params=params)
    assert page.status_code == 200, "a refused malformed request did not use up the link"


# ---------------------------------------------------------------- short-lived tokens


async def test_short_lived_tokens_are_not_refreshed_before_every_request(
    auth: AuthorizationServer,
    mcp: WhoamiServer,
    runtime: MCPOAuthRuntime,
    tether: httpx2.AsyncClient,
) -> None:
    """8 s tokens with the default 30 s margin: refreshed once past half their
    lifetime, not before every request."""
    store = runtime.store
    assert store is not None and store.settings.refresh_margin == 30
    auth.access_token_lifetime = 8.0
    try:
        await _connect(runtime, mcp, tether, "lena")
        [refresh_token] = auth.refresh_tokens_of("lena")
        record = await store.get_user_integration("t", "lena", "who")
        assert record is not None and record.tokens is not None
        issued_at = record.tokens.issued_at
        assert issued_at is not None
        for _ in range(2):
            turn = _tools([_oauth(mcp)], runtime, user="lena")
            [whoami] = [tool for tool in await turn.tools() if tool.name == "who__whoami"]
            assert await whoami.invoke({}) == "you are lena"
        assert auth.refresh_presentations[refresh_token] == 0
        # Past half the lifetime: refreshed once, ahead of the expiry.
        await asyncio.sleep(max(0.0, (issued_at - store.clock()).total_seconds() + 4.2))
        turn = _tools([_oauth(mcp)], runtime, user="lena")
        [whoami] = [tool for tool in await turn.tools() if tool.name == "who__whoami"]
        assert await whoami.invoke({}) == "you are lena"
        assert auth.refresh_presentations[refresh_token] == 1
    finally:
        auth.access_token_lifetime = 3600.0


# ---------------------------------------------------------------- secrets in logs


async def test_the_access_log_never_holds_a_callbacks_code_or_state(
    store: MCPOAuthIntegrationStore,
) -> None:
    access = logging.getLogger("uvicorn.access")
    for installed in [f for f in access.filters if isinstance(f, RedactOAuthCallbackFilter)]:
        access.removeFilter(installed)  # put there by an earlier app: this one must add it
    app = _app(store, get_mcp_oauth_token_client())
    lines: list[str] = []

    class _Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    served = ThreadedServer()
    served.start(app, access_log=True)
    capture = _Capture()
    logging.getLogger("uvicorn.access").addHandler(capture)
    try:
        async with httpx2.AsyncClient(base_url=served.base_url) as client:
            page = await client.get(
                "/mcp/oauth/callback",
                params={"state": "STATE-SECRET-1", "code": "CODE-SECRET-2", "iss": "x"},
            )
            assert page.status_code == 400
            # Names percent-encoded, which the route decodes: %63ode is code.
            encoded = await client.get(
                "/mcp/oauth/callback?%73tate=STATE-SECRET-3&%63ode=CODE-SECRET-4&co%64e=CODE-5"
            )
            assert encoded.status_code == 400
            # Not a probe: probes are not logged at INFO.
            await client.get("/openapi.json", params={"code": "not-a-callback"})
    finally:
        served.stop()  # joins the server's thread: every line is logged by now
        logging.getLogger("uvicorn.access").removeHandler(capture)
    callback, encoded_callback = [line for line in lines if "/mcp/oauth/callback" in line]
    assert "STATE-SECRET-1" not in callback and "CODE-SECRET-2" not in callback
    assert "state=[redacted]" in callback and "code=[redacted]" in callback
    for secret in ("STATE-SECRET-3", "CODE-SECRET-4", "CODE-5"):
        assert secret not in encoded_callback
    assert "%63ode=[redacted]" in encoded_callback
    assert "iss=x" in callback and "400" in callback
    assert any("code=not-a-callback" in line for line in lines), "other routes are left alone"


async def test_an_authorization_link_is_not_logged(
    mcp: WhoamiServer, runtime: MCPOAuthRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        tools = _tools([_oauth(mcp)], runtime, user="noel")
        await tools.tools()
    state = _link_params(tools)["state"]
    assert caplog.records and not any(state in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- the offline model


async def test_the_offline_model_calls_the_mcp_tool_its_setup_names(mcp: WhoamiServer) -> None:
    static = {"name": "svc", "url": mcp.url, "auth": {"type": "header", "value": "Bearer svc-key"}}
    setup = AgentSetup(
        agent_identifier="agent",
        agent_name="agent",
        agent_configuration={
            "mcp_servers": [static],
            "llm": {"call_tool": {"name": "svc__whoami", "arguments": {}}},
        },
    )
    turn = TurnContext(
        tenant="t", requester_uuid="u", session_id=None, message_id="m", agent_identifier="agent"
    )
    tools = MCPToolsFactory.create(setup, turn)
    chat_client = ChatClientFactory.create(setup, turn)
    conversation = [ChatMessage(sender=ChatMessageSender.USER, content="Hi")]
    answers = [m async for m in chat_client.stream(conversation, tools=await tools.tools())]
    final = answers[-1]
    [part] = [p for p in final.content_parts or [] if p.tool is not None]
    assert part.tool is not None
    assert (part.tool.name, part.tool.status, part.tool.response) == (
        "svc__whoami",
        ToolCallStatus.COMPLETED,
        "you are svc",
    )
    assert "The svc__whoami tool returned you are svc." in final.content
    # Not offered (say, the server is waiting for the user's authorization): no call.
    unused = ChatClientFactory.create(setup, turn)
    answers = [m async for m in unused.stream(conversation, tools=[])]
    assert not [p for p in answers[-1].content_parts or [] if p.tool is not None]
    with pytest.raises(ValueError, match="call_tool"):
        OfflineChatModel.from_options({"call_tool": {"arguments": {}}})


async def test_the_servers_hints_set_what_a_resume_does_and_calls_carry_the_idempotency_key(
    mcp: WhoamiServer,
) -> None:
    """A tool the server marks read-only or idempotent runs again when a
    resume cannot tell whether its call happened; any other does not
    (``on_unknown``). Each call carries the call's idempotency key and
    attempt in its ``_meta``, so the server can refuse a repeat too. Before,
    the hints were read under the SDK's old attribute names, which it no
    longer has: listing a server's tools with hints failed."""
    static = {"name": "svc", "url": mcp.url, "auth": {"type": "header", "value": "Bearer svc-key"}}
    tools = _tools([{**static, "tool_prefix": "", "tools": ["look", "put", "send"]}], None)
    by_name = {tool.name: tool for tool in await tools.tools()}
    assert {name: tool.on_unknown for name, tool in by_name.items()} == {
        "look": "retry",
        "put": "retry",
        "send": "fail",
    }
    mcp.metas.clear()
    context = ToolCallContext(
        idempotency_key="turn-1:3", call_index=3, attempt=2, tool_call_id="call-9"
    )
    with running_tool_call(context):
        assert await by_name["send"].invoke({}) == "send done"
    assert await by_name["look"].invoke({}) == "look done"  # outside any call: no key
    [(sent, meta), (looked, bare)] = mcp.metas
    assert sent == "send" and looked == "look"
    assert meta.get("tether/idempotency_key") == "turn-1:3"
    assert meta.get("tether/attempt") == 2
    assert "tether/idempotency_key" not in bare
