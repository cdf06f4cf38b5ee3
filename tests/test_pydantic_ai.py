"""PydanticAI agents with durable turns (``tether.integrations.pydantic_ai``).

A real ``pydantic_ai.Agent`` on a ``FunctionModel`` (no network) runs as a
tether agent in in-process replicas over one set of in-memory stores and one
hand-moved clock (``tests.support.scripted``): it streams text, a tool call and
its result; a stateful follow-up gets the conversation as history; a cancel
stops it; and when its producer dies after the tool's result was
checkpointed, a surviving replica takes the turn over and finishes the same
answer without running the tool again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import pytest

from tests.support.scripted import ScriptedCluster
from tests.support.services import import_or_skip

import_or_skip("pydantic_ai", "install the pydantic-ai extra: make install-dev")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel  # noqa: E402

from tether.adapters.agent_dependency_registry import AgentDependencyRegistry  # noqa: E402
from tether.adapters.local_agent_registries_factory import (  # noqa: E402
    LocalAgentRegistriesFactory,
)
from tether.domain.agent_setup import AgentSetup, AgentSetupRetriever  # noqa: E402
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry  # noqa: E402
from tether.domain.chat_message import (  # noqa: E402
    ChatMessage,
    ChatMessageSender,
    ContentPartType,
    ToolCallStatus,
)
from tether.domain.chat_request import ChatRequest, RequestHeaders  # noqa: E402
from tether.domain.message_bus import MessageBus  # noqa: E402
from tether.handlers.chat_handler import ChatHandler  # noqa: E402
from tether.handlers.turn import Turn  # noqa: E402
from tether.integrations.pydantic_ai import PydanticAIChatAgent  # noqa: E402
from tether.runtime.live_buffer import StreamEvent  # noqa: E402
from tether.tools import current_tool_call  # noqa: E402

pytestmark = pytest.mark.cluster(takeover_scan_interval=0.01)

AGENT = "librarian"
WRITER = "note-writer"


class Librarian:
    """The model and the tool of the test agent, reset for every test.

    The model says "Let me look that up.", calls ``lookup`` with the user's
    question, and answers with what the tool returned, in chunks. While
    ``hold`` is set, the answer stops after its first chunk until it is set.
    """

    def __init__(self) -> None:
        self.hold: asyncio.Event | None = None
        self.holding = asyncio.Event()
        self.requests: list[list[ModelMessage]] = []
        self.lookups: list[tuple[str, str]] = []
        """Each execution of the tool: its topic and its idempotency key."""
        self.tool = "lookup"
        """The tool the model calls."""
        self.inside_tool = asyncio.Event()
        self.tool_hold: asyncio.Event | None = None
        """While set, ``send_note`` stays inside its call until it is set."""

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        self.requests.append(list(messages))
        results = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if not results:
            topic = _last_prompt(messages)
            yield "Let me look that up."
            call = DeltaToolCall(
                name=self.tool,
                json_args=json.dumps({"topic": topic}),
                tool_call_id=f"call-{len(self.requests)}",
            )
            yield {0: call}
            return
        yield "The answer"
        if self.hold is not None:
            self.holding.set()
            await self.hold.wait()
        yield " is "
        yield str(results[0].content)
        yield "."


LIBRARIAN = Librarian()


async def _model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    async for chunk in LIBRARIAN.stream(messages, info):
        yield chunk


_agent: Agent[None, str] = Agent(FunctionModel(stream_function=_model))


@_agent.tool_plain
async def lookup(topic: str) -> str:
    """Look a topic up in the library."""
    call = current_tool_call()
    assert call is not None
    LIBRARIAN.lookups.append((topic, call.idempotency_key))
    return f"the book on {topic}"


_writer: Agent[None, str] = Agent(FunctionModel(stream_function=_model))


@_writer.tool_plain(metadata={"on_unknown": "fail"})
async def send_note(topic: str) -> str:
    """Send a note about a topic (a write: never twice)."""
    LIBRARIAN.lookups.append((topic, "note"))
    LIBRARIAN.inside_tool.set()
    if LIBRARIAN.tool_hold is not None:
        await LIBRARIAN.tool_hold.wait()
    return f"a note on {topic}"


class _Agents(ChatAgentClassRegistry):
    registry = {}  # isolated from the process-wide registry


@_Agents.register()
class LibrarianAgent(PydanticAIChatAgent):
    agent_name = AGENT
    agent = _agent


@_Agents.register()
class NoteWriterAgent(PydanticAIChatAgent):
    agent_name = WRITER
    agent = _writer


class _Setups(AgentSetupRetriever):
    by_name: ClassVar[dict[str, AgentSetup]] = {
        name: AgentSetup(agent_identifier=name, agent_name=name) for name in (AGENT, WRITER)
    }

    async def get(self, agent_identifier: str) -> AgentSetup | None:
        return self.by_name.get(agent_identifier)

    async def list(self) -> list[AgentSetup]:
        return list(self.by_name.values())


@pytest.fixture(autouse=True)
def librarian() -> Iterator[Librarian]:
    global LIBRARIAN
    LIBRARIAN = Librarian()
    yield LIBRARIAN


def _replica(cluster: ScriptedCluster) -> ChatHandler:
    """A replica of ``cluster`` that runs the PydanticAI agent, its constructor
    resolved as any project's agent is."""
    registries = LocalAgentRegistriesFactory(_Setups(), _Agents, AgentDependencyRegistry)
    handler = ChatHandler(registries, cluster.stores, cluster.settings, MessageBus(), cluster.clock)
    cluster.replicas.append(handler)
    return handler


async def _ask(
    replica: ChatHandler, session: str, text: str, agent: str = AGENT, **extra: Any
) -> Turn:
    request = ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid="u"),
        agent_identifier=agent,
        conversation=[ChatMessage(sender=ChatMessageSender.USER, content=text)],
        stateful=True,
        session_id=session,
        **extra,
    )
    return await replica.start_turn(request)


async def _events(turn: Turn) -> list[ChatMessage]:
    """Every message the turn's readers were shown, once it ended."""
    shown: list[ChatMessage] = []
    async with asyncio.timeout(10):
        async for event in turn.buffer.follow(0):
            if isinstance(event, StreamEvent):
                shown.append(event.message)
    return shown


def _bots(transcript: list[ChatMessage]) -> list[ChatMessage]:
    return [m for m in transcript if m.sender is ChatMessageSender.BOT]


def _last_prompt(messages: list[ModelMessage]) -> str:
    prompts = [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    ]
    return str(prompts[-1])


ANSWER = "Let me look that up.\n\nThe answer is the book on rivers."


async def test_a_turn_streams_its_text_tool_call_and_result(
    cluster: ScriptedCluster, librarian: Librarian
) -> None:
    turn = await _ask(_replica(cluster), "s1", "rivers")
    shown = await _events(turn)
    assert await cluster.ended(turn) == "done"

    # The text grows chunk by chunk; the call is shown running, then completed.
    contents = [m.content for m in shown]
    assert "Let me look that up." in contents
    assert "Let me look that up.\n\nThe answer" in contents
    assert contents[-1] == ANSWER
    statuses = [p.tool.status for m in shown for p in m.content_parts or [] if p.tool]
    assert ToolCallStatus.RUNNING in statuses
    final = shown[-1].content_parts or []
    assert [p.type for p in final] == [
        ContentPartType.TEXT,
        ContentPartType.TOOL,
        ContentPartType.TEXT,
    ]
    tool = final[1].tool
    assert tool is not None
    assert (tool.name, tool.params, tool.status) == (
        "lookup",
        {"topic": "rivers"},
        ToolCallStatus.COMPLETED,
    )
    assert tool.response == "the book on rivers"
    assert librarian.lookups == [("rivers", f"{turn.message_id}:0")]
    assert [m.content for m in _bots(await cluster.transcript("s1"))] == [ANSWER]


async def test_a_stateful_follow_up_gets_the_conversation_as_history(
    cluster: ScriptedCluster, librarian: Librarian
) -> None:
    replica = _replica(cluster)
    assert await cluster.ended(await _ask(replica, "s1", "rivers")) == "done"
    second = await _ask(replica, "s1", "lakes")
    assert await cluster.ended(second) == "done"

    # The follow-up's first request: the earlier exchange (its call answered),
    # then the new question once.
    request = librarian.requests[2]
    prompts = [
        p.content
        for m in request
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    ]
    assert prompts == ["rivers", "lakes"]
    returns = [p for m in request for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [r.content for r in returns] == ["the book on rivers"]
    bots = [m.content for m in _bots(await cluster.transcript("s1"))]
    assert bots == [ANSWER, ANSWER.replace("rivers", "lakes")]


async def test_a_cancel_stops_the_run(cluster: ScriptedCluster, librarian: Librarian) -> None:
    librarian.hold = asyncio.Event()  # never set: the answer stops after "The answer"
    replica = _replica(cluster)
    turn = await _ask(replica, "s1", "rivers")
    async with asyncio.timeout(10):
        await librarian.holding.wait()
    await replica.cancel("t", "u", "s1", turn.message_id)
    assert await cluster.ended(turn) == "cancelled"
    bots = _bots(await cluster.transcript("s1"))
    assert bots[-1].content.startswith("Let me look that up.")
    assert "is the book" not in bots[-1].content
    assert len(librarian.lookups) == 1


async def test_a_dead_producer_s_turn_is_finished_by_a_survivor_without_a_second_tool_call(
    cluster: ScriptedCluster, librarian: Librarian
) -> None:
    librarian.hold = asyncio.Event()
    a, b = _replica(cluster), _replica(cluster)
    turn = await _ask(a, "s1", "rivers")
    # The tool ran and its result was checkpointed; the answer is being
    # streamed when the producer dies.
    async with asyncio.timeout(10):
        await librarian.holding.wait()
    await turn.settled()
    assert len(librarian.lookups) == 1
    await a.shutdown()
    cluster.kill_by_silence()

    librarian.hold = None
    assert await b.takeovers.scan() == 1
    resumed = b.local_turn(turn.message_id)
    assert resumed is not None
    shown = await _events(resumed)
    assert await cluster.ended(resumed) == "done"

    # The tool ran once, with the one key; the resume asked the model only for
    # the answer after it (its request ends with the tool's result), and the
    # answer is the crash-free one.
    assert librarian.lookups == [("rivers", f"{turn.message_id}:0")]
    resumed_request = librarian.requests[-1]
    assert any(isinstance(p, ToolReturnPart) for p in resumed_request[-1].parts)
    assert len(librarian.requests) == 3
    assert [m.content for m in _bots(await cluster.transcript("s1"))] == [ANSWER]
    # What the takeover showed first is the checkpointed answer, the call completed.
    first = shown[0].content_parts or []
    assert [p.tool.status for p in first if p.tool] == [ToolCallStatus.COMPLETED]
    assert all(m.content.startswith("Let me look that up.") for m in shown)


async def test_a_writing_tool_cut_off_in_its_call_is_not_run_again(
    cluster: ScriptedCluster, librarian: Librarian
) -> None:
    librarian.tool, librarian.tool_hold = "send_note", asyncio.Event()
    a, b = _replica(cluster), _replica(cluster)
    turn = await _ask(a, "s1", "rivers", agent=WRITER)
    async with asyncio.timeout(10):
        await librarian.inside_tool.wait()  # started (checkpointed), never settled
    await a.shutdown()
    cluster.kill_by_silence()

    assert await b.takeovers.scan() == 1
    resumed = b.local_turn(turn.message_id)
    assert resumed is not None
    assert await cluster.ended(resumed) == "done"
    # on_unknown="fail": not run again; the model is told it may or may not have happened.
    assert librarian.lookups == [("rivers", "note")]
    told = [p for p in librarian.requests[-1][-1].parts if isinstance(p, ToolReturnPart)]
    assert [r.outcome for r in told] == ["failed"]
    assert "may or may not have happened" in str(told[0].content)
    (answer,) = _bots(await cluster.transcript("s1"))
    tools = [p.tool for p in answer.content_parts or [] if p.tool]
    assert [t.status for t in tools] == [ToolCallStatus.ERROR]


async def test_a_drained_producer_s_turn_is_finished_by_a_survivor_as_one_answer(
    cluster: ScriptedCluster, librarian: Librarian
) -> None:
    """A drain cancels the run in the middle of a response and checkpoints it
    as it hands the turn off. PydanticAI keeps the response it was streaming
    in its own history when the stream is cut off: that unfinished response
    must not reach the checkpoint, or the survivor takes it for a finished
    one and the answer comes back in two pieces (found by ``tether
    crash-test --agent pydantic-writer``, its rolling-deploy rounds)."""
    librarian.hold = asyncio.Event()
    a, b = _replica(cluster), _replica(cluster)
    turn = await _ask(a, "s1", "rivers")
    async with asyncio.timeout(10):
        await librarian.holding.wait()  # "The answer" is being streamed
    await a.drain()

    librarian.hold = None
    assert await b.takeovers.scan() == 1
    resumed = b.local_turn(turn.message_id)
    assert resumed is not None
    assert await cluster.ended(resumed) == "done"

    # The tool ran once; the answer after it was asked for again, from the
    # history that ends with the tool's result, and is the crash-free one.
    assert librarian.lookups == [("rivers", f"{turn.message_id}:0")]
    assert any(isinstance(p, ToolReturnPart) for p in librarian.requests[-1][-1].parts)
    (answer,) = _bots(await cluster.transcript("s1"))
    assert answer.content == ANSWER
    assert [p.type for p in answer.content_parts or []] == [
        ContentPartType.TEXT,
        ContentPartType.TOOL,
        ContentPartType.TEXT,
    ]
