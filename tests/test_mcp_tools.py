"""``MCPTools`` against a real MCP server behind a real OAuth server, in one process.

What a turn sees: the user's tools, or a notice per server that cannot be used
(unreachable, needing the user's authorization, skipped for want of a store, a
key or a user), and the whole authorization flow through the callback route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
from fastapi import FastAPI

from tests.support.mcp.authorization_server import AuthorizationServer
from tests.support.mcp.whoami_server import WhoamiServer
from tests.support.servers import free_port
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
from tether.api.routers.mcp import install_mcp_oauth
from tether.domain.agent_registries import AgentRegistriesFactory, CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_message import ChatMessage, ChatMessageSender, ContentPartType
from tether.domain.chat_request import ChatRequest
from tether.domain.turn_context import TurnContext
from tether.mcp_tools import MCPTools, MCPToolsFactory

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


async def _authorize(tools: MCPTools, tether: httpx2.AsyncClient, user: str) -> httpx2.Response:
    [notice] = [n for n in tools.notices if n.kind == "authorization_required"]
    assert notice.url is not None
    async with httpx2.AsyncClient() as browser:
        redirect = await browser.get(notice.url, headers={"x-test-user": user})
    assert redirect.status_code == 302
    location = urlsplit(redirect.headers["location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    return await tether.get(f"{location.path}?{location.query}")


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
    assert sorted(tool.name for tool in offered) == ["svc__boom", "svc__whoami"]
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
    mcp: WhoamiServer, runtime: MCPOAuthRuntime, tether: httpx2.AsyncClient
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
    forged = await tether.get("/mcp/oauth/callback", params={"state": state, "code": "forged"})
    assert forged.status_code == 502 and "refused the exchange" in forged.text
    assert "invalid_grant" in forged.text


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
