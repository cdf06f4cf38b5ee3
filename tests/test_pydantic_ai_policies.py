"""Double texting and the tool policies with a PydanticAI agent, as with tether's own.

A real ``pydantic_ai.Agent`` on a ``FunctionModel`` (no network) runs in
in-process replicas over one set of in-memory stores and one hand-moved clock
(``tests.support.scripted``); every request the model gets is kept, so a test
reads the message history a turn gave it.

Double texting (``multitask_strategy``), the new message always sent through
another replica than the producer's: ``reject`` names the running turn;
``interrupt`` cancels it, keeping its partial answer, and ``rollback`` also
takes its question out, and the next turn's model gets a history every model
API takes (no tool call without its result), whether the interrupted turn was
in its answer or inside its tool call; ``enqueue`` runs the queued message
after the first answer, with that answer in its history.

The tool policies (``on_unknown``, declared in the tool's metadata, default
``retry``): the producer dies with a call started and its result not in the
checkpoint, either inside the call or after the tool returned with the
checkpoint of its result held at the store (``tether.testing.interleavings``).
The survivor's takeover (or the client's resume) runs a ``retry`` call again
with the same idempotency key, tells the model a ``fail`` call may or may not
have happened without running it, and ends an ``ask`` call's turn with a
question to the user without asking the model, as tether's own model/tool loop
does (``tests/test_chat_client.py``); the follow-up to that question gets the
refused call answered in its history. And since PydanticAI runs the calls of
one response side by side, where tether's loop runs them one at a time: while
a resumed response asks, none of its other calls runs.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from tests.support.scripted import ScriptedCluster
from tests.support.services import import_or_skip

import_or_skip("pydantic_ai", "install the pydantic-ai extra: make install-dev")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
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
    ContentPartTool,
    ToolCallStatus,
)
from tether.domain.chat_request import ChatRequest, MultitaskStrategy, RequestHeaders  # noqa: E402
from tether.domain.message_bus import MessageBus  # noqa: E402
from tether.handlers.chat_handler import ChatHandler  # noqa: E402
from tether.handlers.errors import ConversationBusyError  # noqa: E402
from tether.handlers.queue import Ticket  # noqa: E402
from tether.handlers.turn import Turn  # noqa: E402
from tether.integrations.pydantic_ai import ON_UNKNOWN_KEY, PydanticAIChatAgent  # noqa: E402
from tether.testing.interleavings import hold  # noqa: E402
from tether.tools import current_tool_call  # noqa: E402

pytestmark = pytest.mark.cluster(takeover_scan_interval=0.01)

AGENT = "front-desk"
UNKNOWN = "may or may not have happened"


@dataclass(frozen=True)
class Run:
    """One execution of a tool: the tool, its topic, its idempotency key and attempt."""

    tool: str
    topic: str
    key: str
    attempt: int


class Desk:
    """The model and the tools of the test agent, reset for every test.

    Asked about a topic (the user's message), the model says "Let me look
    that up." and calls ``tool`` with it (each of ``"a+b"``'s tools, in one
    response); given the results it answers "The answer is RESULT." (the
    first one's) in chunks. ``hold_answer(topic)`` stops that answer
    after its first chunk, and ``hold_tool(topic)`` keeps the first attempt of
    the topic's call inside the tool, each until the event it returns is set.
    """

    def __init__(self) -> None:
        self.tool = "lookup"
        self.requests: list[list[ModelMessage]] = []
        self.runs: list[Run] = []
        self.asked: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        """Set once the model was asked about a topic."""
        self.answering: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        """Set once a held answer stopped after its first chunk."""
        self.inside: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        """Set once a call about the topic is inside its tool."""
        self.entered: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        """Set once a call of the tool is inside it."""
        self._answer_holds: dict[str, asyncio.Event] = {}
        self._tool_holds: dict[str, asyncio.Event] = {}

    def hold_answer(self, topic: str) -> asyncio.Event:
        return self._answer_holds.setdefault(topic, asyncio.Event())

    def hold_tool(self, topic: str) -> asyncio.Event:
        return self._tool_holds.setdefault(topic, asyncio.Event())

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        self.requests.append(list(messages))
        topic = _last_prompt(messages)
        self.asked[topic].set()
        if any(isinstance(p, UserPromptPart) for p in messages[-1].parts):
            yield "Let me look that up."
            tools = self.tool.split("+")
            yield {
                index: DeltaToolCall(
                    name=tool,
                    json_args=json.dumps({"topic": topic}),
                    tool_call_id=f"call-{len(self.requests)}-{index}",
                )
                for index, tool in enumerate(tools)
            }
            return
        results = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        yield "The answer"
        held = self._answer_holds.get(topic)
        if held is not None:
            self.answering[topic].set()
            await held.wait()
        yield " is "
        yield str(results[0].content)
        yield "."

    async def run(self, tool: str, topic: str) -> str:
        call = current_tool_call()
        assert call is not None, "a tool of a tether turn runs with its call's context"
        self.runs.append(Run(tool, topic, call.idempotency_key, call.attempt))
        self.inside[topic].set()
        self.entered[tool].set()
        held = self._tool_holds.get(topic)
        if held is not None and call.attempt == 1:
            await held.wait()
        return f"{tool} done for {topic}"


DESK = Desk()


async def _model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    async for chunk in DESK.stream(messages, info):
        yield chunk


_agent: Agent[None, str] = Agent(FunctionModel(stream_function=_model))


@_agent.tool_plain  # no policy declared: retry
async def lookup(topic: str) -> str:
    """Look a topic up (a read)."""
    return await DESK.run("lookup", topic)


@_agent.tool_plain(metadata={ON_UNKNOWN_KEY: "fail"})
async def send_note(topic: str) -> str:
    """Send a note about a topic (a write: never twice)."""
    return await DESK.run("send_note", topic)


@_agent.tool_plain(metadata={ON_UNKNOWN_KEY: "ask"})
async def book_room(topic: str) -> str:
    """Book a room to talk about a topic (a write the user decides about)."""
    return await DESK.run("book_room", topic)


POLICIES = {"retry": "lookup", "fail": "send_note", "ask": "book_room"}
"""The tool of each policy."""


class _Agents(ChatAgentClassRegistry):
    registry = {}  # isolated from the process-wide registry


@_Agents.register()
class FrontDesk(PydanticAIChatAgent):
    agent_name = AGENT
    agent = _agent


class _Setups(AgentSetupRetriever):
    setups: ClassVar[list[AgentSetup]] = [AgentSetup(agent_identifier=AGENT, agent_name=AGENT)]

    async def get(self, agent_identifier: str) -> AgentSetup | None:
        return next((s for s in self.setups if s.agent_identifier == agent_identifier), None)

    async def list(self) -> list[AgentSetup]:
        return list(self.setups)


@pytest.fixture(autouse=True)
def desk() -> Iterator[Desk]:
    global DESK
    DESK = Desk()
    yield DESK


def _replica(cluster: ScriptedCluster) -> ChatHandler:
    """A replica of ``cluster`` that runs the PydanticAI agent."""
    registries = LocalAgentRegistriesFactory(_Setups(), _Agents, AgentDependencyRegistry)
    handler = ChatHandler(registries, cluster.stores, cluster.settings, MessageBus(), cluster.clock)
    cluster.replicas.append(handler)
    return handler


def _request(text: str | None, strategy: MultitaskStrategy = "reject") -> ChatRequest:
    """A message to the conversation (None: a resume's empty body)."""
    said = [] if text is None else [ChatMessage(sender=ChatMessageSender.USER, content=text)]
    return ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid="u"),
        agent_identifier=AGENT,
        conversation=said,
        stateful=True,
        session_id="s1",
        multitask_strategy=strategy,
    )


async def _ask(replica: ChatHandler, text: str, strategy: MultitaskStrategy = "reject") -> Turn:
    return await replica.start_turn(_request(text, strategy))


async def _reached(event: asyncio.Event) -> None:
    async with asyncio.timeout(10):
        await event.wait()


async def _transcript(cluster: ScriptedCluster) -> list[ChatMessage]:
    return await cluster.transcript("s1")


def _shape(transcript: list[ChatMessage]) -> list[tuple[str, str]]:
    return [(m.sender.value, m.content) for m in transcript]


def _tools(message: ChatMessage) -> list[ContentPartTool]:
    return [p.tool for p in message.content_parts or [] if p.tool is not None]


def _last_prompt(messages: list[ModelMessage]) -> str:
    return _prompts(messages)[-1]


def _prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(p.content)
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    ]


def _first_request_about(desk: Desk, topic: str) -> list[ModelMessage]:
    return next(r for r in desk.requests if _last_prompt(r) == topic)


def _unanswered_calls(history: list[ModelMessage]) -> list[str]:
    """The tool calls of ``history`` not answered right after their response
    (every model API refuses such a history)."""
    unanswered: list[str] = []
    for position, message in enumerate(history):
        if not isinstance(message, ModelResponse):
            continue
        following = history[position + 1] if position + 1 < len(history) else None
        answered = {
            p.tool_call_id
            for p in (following.parts if isinstance(following, ModelRequest) else [])
            if isinstance(p, ToolReturnPart | RetryPromptPart)
        }
        unanswered += [
            p.tool_call_id
            for p in message.parts
            if isinstance(p, ToolCallPart) and p.tool_call_id not in answered
        ]
    return unanswered


def _returns(history: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in history for p in m.parts if isinstance(p, ToolReturnPart)]


def _texts(history: list[ModelMessage]) -> list[str]:
    return [
        p.content
        for m in history
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, TextPart)
    ]


def _answer(topic: str, tool: str = "lookup") -> str:
    return f"Let me look that up.\n\nThe answer is {tool} done for {topic}."


# ------------------------------------------------------------------ double texting


async def _running(cluster: ScriptedCluster, desk: Desk, cut: str) -> tuple[ChatHandler, Turn]:
    """A turn about rivers on a replica, stopped in its answer after the tool's
    result (``cut="answer"``) or inside its tool call (``cut="tool"``), what it
    showed recorded (what a cancel from another replica keeps)."""
    held = desk.hold_answer("rivers") if cut == "answer" else desk.hold_tool("rivers")
    reached = desk.answering["rivers"] if cut == "answer" else desk.inside["rivers"]
    a = _replica(cluster)
    turn = await _ask(a, "rivers")
    await _reached(reached)
    await turn.settled()
    assert a.flusher is not None
    await a.flusher.flush()
    assert not held.is_set()
    return a, turn


async def test_reject_names_the_running_turn_which_goes_on(
    cluster: ScriptedCluster, desk: Desk
) -> None:
    _, first = await _running(cluster, desk, "answer")
    with pytest.raises(ConversationBusyError) as busy:
        await _ask(_replica(cluster), "lakes")
    assert busy.value.message_id == first.message_id
    desk.hold_answer("rivers").set()
    assert await cluster.ended(first) == "done"
    assert _shape(await _transcript(cluster)) == [("user", "rivers"), ("bot", _answer("rivers"))]
    assert "lakes" not in desk.asked


@pytest.mark.parametrize("cut", ["answer", "tool"])
async def test_interrupt_keeps_the_partial_answer_and_the_next_turn_continues_from_it(
    cluster: ScriptedCluster, desk: Desk, cut: str
) -> None:
    _, first = await _running(cluster, desk, cut)
    second = await _ask(_replica(cluster), "lakes", "interrupt")
    assert await cluster.ended(second) == "done"
    assert await cluster.ended(first) == "cancelled"

    transcript = await _transcript(cluster)
    kept = "Let me look that up.\n\nThe answer" if cut == "answer" else "Let me look that up."
    assert _shape(transcript) == [
        ("user", "rivers"),
        ("bot", kept),
        ("user", "lakes"),
        ("bot", _answer("lakes")),
    ]
    # The next turn's model read the interrupted exchange, every call answered.
    history = _first_request_about(desk, "lakes")
    assert _prompts(history) == ["rivers", "lakes"]
    assert _unanswered_calls(history) == []
    [earlier] = _returns(history)
    if cut == "answer":
        assert (earlier.content, earlier.outcome) == ("lookup done for rivers", "success")
        assert _texts(history) == ["Let me look that up.", "The answer"]
    else:
        # Cut off inside the call: answered as such, as the kept answer shows it.
        assert earlier.outcome == "failed" and UNKNOWN in str(earlier.content)
        [tool] = _tools(transcript[1])
        assert tool.status is ToolCallStatus.ERROR and UNKNOWN in str(tool.response)
        assert _texts(history) == ["Let me look that up."]
    assert [run.topic for run in desk.runs] == ["rivers", "lakes"]


@pytest.mark.parametrize("cut", ["answer", "tool"])
async def test_rollback_takes_the_interrupted_exchange_out_of_the_next_turns_history(
    cluster: ScriptedCluster, desk: Desk, cut: str
) -> None:
    _, first = await _running(cluster, desk, cut)
    second = await _ask(_replica(cluster), "lakes", "rollback")
    assert await cluster.ended(second) == "done"
    assert await cluster.ended(first) == "cancelled"

    assert _shape(await _transcript(cluster)) == [("user", "lakes"), ("bot", _answer("lakes"))]
    history = _first_request_about(desk, "lakes")
    assert _prompts(history) == ["lakes"]
    assert [m for m in history if isinstance(m, ModelResponse)] == []
    assert _returns(history) == []


@pytest.mark.parametrize("cut", ["answer", "tool"])
async def test_enqueue_runs_the_queued_message_with_the_first_answer_in_its_history(
    cluster: ScriptedCluster, desk: Desk, cut: str
) -> None:
    a, first = await _running(cluster, desk, cut)
    b = _replica(cluster)
    ticket = await b.queue.submit(_request("lakes", "enqueue"))
    assert isinstance(ticket, Ticket) and ticket.position == 1
    assert "lakes" not in desk.asked, "it waits for the turn before it"

    (desk.hold_answer if cut == "answer" else desk.hold_tool)("rivers").set()
    assert await cluster.ended(first) == "done"
    await _reached(desk.asked["lakes"])
    [queued] = [t for r in (a, b) if (t := r.local_turn(ticket.message_id)) is not None]
    assert await cluster.ended(queued) == "done"

    assert _shape(await _transcript(cluster)) == [
        ("user", "rivers"),
        ("bot", _answer("rivers")),
        ("user", "lakes"),
        ("bot", _answer("lakes")),
    ]
    history = _first_request_about(desk, "lakes")
    assert _prompts(history) == ["rivers", "lakes"]
    assert _unanswered_calls(history) == []
    assert [(r.content, r.outcome) for r in _returns(history)] == [
        ("lookup done for rivers", "success")
    ]
    assert _texts(history) == ["Let me look that up.", "The answer is lookup done for rivers."]
    # Each turn's call ran once, with its own turn's key.
    assert [(r.topic, r.key, r.attempt) for r in desk.runs] == [
        ("rivers", f"{first.message_id}:0", 1),
        ("lakes", f"{ticket.message_id}:0", 1),
    ]


# ------------------------------------------------------------------ tool policies


def _settles_a_call(*args: Any, **kwargs: Any) -> bool:
    """A checkpoint write (``save_fenced``) that records a call's outcome."""
    state = args[3]
    records = (state.get("pydantic_ai") or {}).get("tools") or {}
    return any(record.get("outcome") is not None for record in records.values())


async def _cut_off(
    cluster: ScriptedCluster, desk: Desk, policy: str, where: str
) -> tuple[Turn, ChatHandler]:
    """A turn about rivers whose producer dies with its call of the ``policy``
    tool started (checkpointed) and its result not in the checkpoint: inside
    the call (``where="inside"``), or after the tool returned, the checkpoint
    of its result held at the store (``"returned"``). The turn, and a
    surviving replica; the producer reads dead."""
    desk.tool = POLICIES[policy]
    assert cluster.stores.agent_state is not None
    a, survivor = _replica(cluster), _replica(cluster)
    if where == "inside":
        desk.hold_tool("rivers")
        turn = await _ask(a, "rivers")
        await _reached(desk.inside["rivers"])
    else:
        settling = hold(cluster.stores.agent_state, "save_fenced", when=_settles_a_call)
        turn = await _ask(a, "rivers")
        await settling.reached()  # the tool returned; its result is not saved
    await a.shutdown()
    cluster.kill_by_silence()
    assert [(r.key, r.attempt) for r in desk.runs] == [(f"{turn.message_id}:0", 1)]
    return turn, survivor


async def _taken_over(turn: Turn, survivor: ChatHandler, how: str) -> Turn:
    """The turn, taken over by ``survivor``: by its takeover scan, or by the client's resume."""
    if how == "takeover":
        assert await survivor.takeovers.scan() == 1
        resumed = survivor.local_turn(turn.message_id)
        assert resumed is not None
        return resumed
    return await survivor.start_turn(_request(None), resume_message_id=turn.message_id)


@pytest.mark.parametrize("where", ["inside", "returned"])
@pytest.mark.parametrize("how", ["takeover", "resume"])
async def test_a_retry_call_cut_off_runs_again_with_the_same_idempotency_key(
    cluster: ScriptedCluster, desk: Desk, where: str, how: str
) -> None:
    turn, survivor = await _cut_off(cluster, desk, "retry", where)
    resumed = await _taken_over(turn, survivor, how)
    assert await cluster.ended(resumed) == "done"

    key = f"{turn.message_id}:0"
    assert desk.runs == [Run("lookup", "rivers", key, 1), Run("lookup", "rivers", key, 2)]
    # The model was not asked for its finished response again: only for the answer after.
    assert len(desk.requests) == 2
    [answer] = [m for m in await _transcript(cluster) if m.sender is ChatMessageSender.BOT]
    assert answer.content == _answer("rivers")
    [tool] = _tools(answer)
    assert (tool.status, tool.response) == (ToolCallStatus.COMPLETED, "lookup done for rivers")


@pytest.mark.parametrize("where", ["inside", "returned"])
async def test_a_fail_call_cut_off_is_not_run_again_and_the_model_is_told(
    cluster: ScriptedCluster, desk: Desk, where: str
) -> None:
    turn, survivor = await _cut_off(cluster, desk, "fail", where)
    resumed = await _taken_over(turn, survivor, "takeover")
    assert await cluster.ended(resumed) == "done"

    assert desk.runs == [Run("send_note", "rivers", f"{turn.message_id}:0", 1)]
    told = _returns(desk.requests[-1])
    assert [r.outcome for r in told] == ["failed"] and UNKNOWN in str(told[0].content)
    assert _unanswered_calls(desk.requests[-1]) == []
    [answer] = [m for m in await _transcript(cluster) if m.sender is ChatMessageSender.BOT]
    [tool] = _tools(answer)
    assert tool.status is ToolCallStatus.ERROR and UNKNOWN in str(tool.response)
    assert UNKNOWN in answer.content  # the model's answer says what it was told


@pytest.mark.parametrize("where", ["inside", "returned"])
@pytest.mark.parametrize("how", ["takeover", "resume"])
async def test_an_ask_call_cut_off_ends_the_turn_with_a_question_and_the_reply_continues(
    cluster: ScriptedCluster, desk: Desk, where: str, how: str
) -> None:
    turn, survivor = await _cut_off(cluster, desk, "ask", where)
    resumed = await _taken_over(turn, survivor, how)
    assert await cluster.ended(resumed) == "done"

    assert desk.runs == [Run("book_room", "rivers", f"{turn.message_id}:0", 1)]
    assert len(desk.requests) == 1, "the model is not asked to go on"
    [answer] = [m for m in await _transcript(cluster) if m.sender is ChatMessageSender.BOT]
    [tool] = _tools(answer)
    assert tool.status is ToolCallStatus.ERROR and UNKNOWN in str(tool.response)
    assert answer.content.startswith("Let me look that up.")
    assert answer.content.endswith("Should I run it again, or check first?")

    # The user's reply: a new turn, whose model reads the refused call answered
    # as such and the question, and whose own call runs under its own key.
    reply = await _ask(survivor, "yes, book it")
    assert await cluster.ended(reply) == "done"
    history = _first_request_about(desk, "yes, book it")
    assert _unanswered_calls(history) == []
    [refused] = _returns(history)
    assert refused.outcome == "failed" and UNKNOWN in str(refused.content)
    assert _texts(history)[-1].endswith("Should I run it again, or check first?")
    assert desk.runs[-1] == Run("book_room", "yes, book it", f"{reply.message_id}:0", 1)


def _ledger(state: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """A checkpoint's tool ledger: each call's tool and attempts started."""
    records = (state.get("pydantic_ai") or {}).get("tools") or {}
    return {call_id: (r["name"], r["started"]) for call_id, r in records.items()}


@pytest.mark.parametrize("other", ["never started", "cut off"])
async def test_while_a_call_asks_no_other_call_of_its_response_runs(
    cluster: ScriptedCluster, desk: Desk, other: str
) -> None:
    """The model asked for two calls in one response, and PydanticAI runs them
    side by side; the producer died inside the ``ask`` call. The resume asks
    the user, and the other call does not run meanwhile: one that never
    started is shown not run, one cut off too is shown of unknown outcome
    (where tether's own loop, one call at a time, stops at the call that
    asks). Before, the other call ran again beside the question (a write
    that had never started ran while the turn asked whether to go on), and
    one still running when the question ended the run was shown not run."""
    second = "send_note" if other == "never started" else "lookup"
    desk.tool = f"book_room+{second}"
    agent_state = cluster.stores.agent_state
    assert agent_state is not None
    a, survivor = _replica(cluster), _replica(cluster)
    desk.hold_tool("rivers")
    if other == "never started":
        # Its start's checkpoint never lands: the kill comes before it runs.
        starting = hold(
            agent_state,
            "save_fenced",
            when=lambda *args: ("send_note", 1) in _ledger(args[3]).values(),
        )
        turn = await _ask(a, "rivers")
        await _reached(desk.entered["book_room"])
        await starting.reached()
    else:
        turn = await _ask(a, "rivers")
        await _reached(desk.entered["book_room"])
        await _reached(desk.entered["lookup"])
    await a.shutdown()
    cluster.kill_by_silence()
    saved = _ledger(await agent_state.load("t", "u", "s1"))
    started = {"book_room": 1, second: 0 if other == "never started" else 1}
    assert sorted(saved.values()) == sorted((t, n) for t, n in started.items() if n)

    resumed = await _taken_over(turn, survivor, "takeover")
    assert await cluster.ended(resumed) == "done"
    assert [(r.tool, r.attempt) for r in desk.runs] == [
        (tool, 1) for tool, n in started.items() if n
    ], "nothing ran again, and nothing ran for the first time"
    assert len(desk.requests) == 1, "the model is not asked to go on"
    [answer] = [m for m in await _transcript(cluster) if m.sender is ChatMessageSender.BOT]
    assert answer.content.endswith("Should I run it again, or check first?")
    shown = {t.name: (t.status, str(t.response)) for t in _tools(answer)}
    assert shown["book_room"][0] is ToolCallStatus.ERROR and UNKNOWN in shown["book_room"][1]
    assert shown[second][0] is ToolCallStatus.ERROR
    if other == "never started":
        assert shown[second][1].startswith("Not run")
    else:
        assert UNKNOWN in shown[second][1]
