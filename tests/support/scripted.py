"""Replicas in one process whose agents the test drives step by step.

A ``ScriptedCluster`` runs several ``ChatHandler``s ("replicas") over one set of
in-memory stores with one hand-moved clock. Their heartbeat, flush and
checkpoint timers are set far out, so nothing happens unless the test makes it
happen: an agent says the next chunk when the test says so, a heartbeat batch
runs when the test calls ``beat()``, a producer reads dead when the test moves
the clock. Interleavings are then staged with ``tether.testing.interleavings``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from tether.adapters.memory import (
    InMemoryChangeChannel,
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.agent_dependency import ResumableAgentDependency
from tether.domain.agent_registries import AgentRegistriesFactory, CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
)
from tether.domain.chat_request import ChatRequest, MultitaskStrategy, RequestHeaders
from tether.domain.chat_stream_supervision_store import PresenceLock
from tether.domain.message_bus import MessageBus
from tether.domain.turn_context import TurnContext
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.queue import Ticket
from tether.handlers.turn import Turn
from tether.runtime.presence import ReplicaPresence
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings
from tether.testing.contracts import ManualClock
from tether.tools import current_turn_id

Settled = Callable[[], Awaitable[None]]
"""Waits until the turn showed what its agent yielded (``Turn.settled``)."""


async def _nothing() -> None:
    return None


AGENT = "scripted"
FAR = 10_000.0
"""Seconds: timers this far out never fire during a test."""

SETTINGS = TetherSettings(
    heartbeat_interval=FAR,
    recording_flush_interval=FAR,
    checkpoint_interval=FAR,
    finished_turn_grace=FAR,
    drain_grace=0.0,
    max_turn_events=1_000,
)


@dataclass
class Script:
    """What one producer of one turn does, step by step, as the test says."""

    steps: asyncio.Queue[tuple[str, str]] = field(default_factory=asyncio.Queue)
    inputs: list[list[ChatMessage]] = field(default_factory=list)
    """The conversation the agent was given."""
    turn_ids: list[str | None] = field(default_factory=list)
    """The turn the agent's task ran for (``tether.tools.current_turn_id``)."""
    said: list[str] = field(default_factory=list)
    """Each cumulative text the agent yielded."""
    started: asyncio.Event = field(default_factory=asyncio.Event)
    settled: Settled = field(default=lambda: _nothing())
    """Waits until the turn showed what the agent yielded (set by the agent)."""
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def spoken(self, count: int = 1) -> None:
        """Wait until the agent has yielded ``count`` messages in all (and the turn
        has shown the last of them in its live buffer: recorded it first, or
        held it back, or stopped)."""
        async with asyncio.timeout(10):
            async with self._progress:
                await self._progress.wait_for(lambda: len(self.said) >= count)
            await self.settled()

    def say(self, text: str) -> None:
        self.steps.put_nowait(("say", text))

    def call_tool(self, name: str) -> None:
        """The agent shows a call of tool ``name`` running (and stays inside it)."""
        self.steps.put_nowait(("tool", name))

    def checkpoint(self) -> None:
        """The agent asks for a checkpoint (as after a completed tool call)."""
        self.steps.put_nowait(("checkpoint", ""))

    def finish(self) -> None:
        self.steps.put_nowait(("finish", ""))

    def fail(self, why: str) -> None:
        """The agent raises (the turn ends errored)."""
        self.steps.put_nowait(("fail", why))


class Scripts:
    """One script per producer of a turn: ``of(message_id, 0)`` is the first
    producer's, ``of(message_id, 1)`` the first resumer's, and so on."""

    def __init__(self) -> None:
        self._scripts: dict[tuple[str, int], Script] = {}
        self._producers: dict[str, int] = {}

    def of(self, message_id: str, producer: int = 0) -> Script:
        return self._scripts.setdefault((message_id, producer), Script())

    def next_producer(self, message_id: str) -> Script:
        number = self._producers.get(message_id, 0)
        self._producers[message_id] = number + 1
        return self.of(message_id, number)


class Notebook(ResumableAgentDependency):
    """The agent's checkpointed state: what it has said so far."""

    state_key: ClassVar[str] = "notebook"

    def __init__(self) -> None:
        self.text = ""

    async def dump(self) -> dict[str, Any]:
        return {"text": self.text}

    async def load(self, state: dict[str, Any], *, resuming_turn: bool) -> None:
        self.text = str(state.get("text", "")) if resuming_turn else ""


class ScriptedAgent(StreamableChatAgent):
    agent_name = AGENT

    def __init__(self, script: Script, notebook: Notebook, settled: Settled) -> None:
        self.script = script
        self.notebook = notebook
        script.settled = settled

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        self.script.inputs.append(list(conversation))
        self.script.turn_ids.append(current_turn_id())
        self.script.started.set()
        while True:
            kind, text = await self.script.steps.get()
            if kind == "finish":
                return
            if kind == "fail":
                raise RuntimeError(text)
            if kind == "checkpoint":
                await self.notebook.request_checkpoint()
                continue
            if kind == "tool":
                self.script.said.append(self.notebook.text)
                async with self.script._progress:
                    self.script._progress.notify_all()
                yield _calling(self.notebook.text, text)
                continue
            self.notebook.text += text
            self.script.said.append(self.notebook.text)
            async with self.script._progress:
                self.script._progress.notify_all()
            # The turn takes what we yield before it asks for more (before the
            # test wakes), and shows it once recorded: a test woken by
            # ``spoken``, which waits for that, finds it in the live buffer.
            yield ChatMessage(sender=ChatMessageSender.BOT, content=self.notebook.text)


class ScriptedRegistries(AgentRegistriesFactory):
    def __init__(self, scripts: Scripts) -> None:
        self.scripts = scripts
        self.setup = AgentSetup(agent_identifier=AGENT, agent_name=AGENT)
        self.local_turn: Callable[[str], Turn | None] = lambda message_id: None
        """The replica's turn of a message id (``ChatHandler.local_turn``)."""

    async def get_setup(self, agent_identifier: str) -> AgentSetup | None:
        return self.setup if agent_identifier == AGENT else None

    async def list_setups(self) -> list[AgentSetup]:
        return [self.setup]

    def check_bot_params(self, setup: AgentSetup, bot_params: dict[str, Any] | None) -> None:
        return None

    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        notebook = Notebook()
        producing = self.local_turn(turn.message_id)

        async def settled() -> None:
            if producing is not None:
                await producing.settled()

        agent = ScriptedAgent(self.scripts.next_producer(turn.message_id), notebook, settled)
        return CreatedAgent(agent=agent, setup=setup, dependencies=[notebook])


def _calling(text: str, tool: str) -> ChatMessage:
    """The answer so far, with a call of ``tool`` shown running."""
    return ChatMessage(
        sender=ChatMessageSender.BOT,
        content=text,
        content_parts=[
            ContentPart(type=ContentPartType.TEXT, text=text),
            ContentPart(
                type=ContentPartType.TOOL,
                tool=ContentPartTool(tool_call_id=f"call-{tool}", name=tool),
            ),
        ],
    )


def question(text: str) -> ChatMessage:
    return ChatMessage(sender=ChatMessageSender.USER, content=text)


class PresenceRegistry:
    """The presence locks of in-process replicas (what ``flock`` or an advisory
    lock is between processes): a replica's lock is held from ``present``
    until its shutdown, which is how a scripted replica dies."""

    def __init__(self) -> None:
        self.held: set[str] = set()

    def lock(self) -> PresenceLock:
        return _RegisteredLock(self)


class _RegisteredLock(PresenceLock):
    def __init__(self, registry: PresenceRegistry) -> None:
        self._registry = registry
        self._replica_id: str | None = None

    async def hold(self, replica_id: str) -> None:
        self._registry.held.add(replica_id)
        self._replica_id = replica_id

    async def find_free(self, replica_ids: Collection[str]) -> set[str]:
        return {r for r in replica_ids if r not in self._registry.held}

    async def is_held(self) -> bool:
        return self._replica_id in self._registry.held

    async def release(self) -> None:
        self._registry.held.discard(self._replica_id or "")


class ScriptedCluster:
    """Replicas (``ChatHandler``s) over one set of in-memory stores and one clock."""

    def __init__(
        self,
        *,
        conversation: bool = True,
        push: bool = True,
        stores: TurnStores | None = None,
        **settings: Any,
    ) -> None:
        self.clock = ManualClock()
        self.scripts = Scripts()
        # With ``push`` the stores announce changes (as PostgreSQL and Redis do);
        # without it a producer hears of a cancel only at its next fenced write.
        channel = InMemoryChangeChannel() if push else None
        # ``stores``: a real backend's, opened by the test (the replicas' clock
        # is still this manual one, which stamps and judges their heartbeats).
        self.stores = stores or TurnStores(
            agent_state=InMemoryChatAgentStateStore(),
            recording=InMemoryChatStreamRecordingStore(channel),
            supervision=InMemoryChatStreamSupervisionStore(channel),
            conversation=InMemoryChatConversationStore(clock=self.clock) if conversation else None,
        )
        self.settings = replace(SETTINGS, **settings)
        self.replicas: list[ChatHandler] = []
        self.presence = PresenceRegistry()

    def replica(self) -> ChatHandler:
        registries = ScriptedRegistries(self.scripts)
        handler = ChatHandler(registries, self.stores, self.settings, MessageBus(), self.clock)
        registries.local_turn = handler.local_turn
        self.replicas.append(handler)
        return handler

    async def present(self, replica: ChatHandler) -> ChatHandler:
        """Give ``replica`` a presence lock, held until it shuts down (dies)."""
        replica.presence = ReplicaPresence(self.presence.lock())
        # No ``keep_every``: a test calls ``keep()`` when it wants the check.
        await replica.presence.start(on_change=replica._producer_changed)
        return replica

    async def start(
        self,
        replica: ChatHandler,
        session: str,
        text: str = "What is the question?",
        *,
        resume: str | None = None,
        strategy: MultitaskStrategy = "reject",
    ) -> Turn:
        """Start (or with ``resume``, resume) a stateful turn of ``session``;
        ``strategy`` says what it does to a turn occupying the conversation."""
        request = ChatRequest(
            tenant="t",
            request_headers=RequestHeaders(requester_uuid="u"),
            agent_identifier=AGENT,
            conversation=[] if resume else [question(text)],
            stateful=True,
            session_id=session,
            multitask_strategy=strategy,
        )
        return await replica.start_turn(request, resume_message_id=resume)

    async def enqueue(self, replica: ChatHandler, session: str, text: str) -> Ticket:
        """Send ``text`` to ``session`` with ``multitask_strategy="enqueue"``
        through ``replica``; the conversation is busy, so the turn waits."""
        queued = await replica.queue.submit(enqueued(session, text))
        assert isinstance(queued, Ticket), "the conversation was busy: the turn should wait"
        return queued

    def answer(self, message_id: str, text: str, producer: int = 0) -> None:
        """What turn ``message_id``'s agent (its ``producer``-th) will say when
        it runs (given ahead)."""
        script = self.scripts.of(message_id, producer)
        script.say(text)
        script.finish()

    def kill_by_silence(self) -> None:
        """Every producer reads dead: its heartbeat is older than the threshold."""
        self.clock.advance(self.settings.dead_after + 1)

    async def ended(self, turn: Turn) -> str:
        """The verdict local readers heard, once the turn's task is over."""
        assert turn.task is not None
        async with asyncio.timeout(10):
            await asyncio.wait([turn.task])
        assert turn.buffer.end is not None
        return turn.buffer.end.reason

    async def transcript(self, session: str) -> list[ChatMessage]:
        assert self.stores.conversation is not None
        return await self.stores.conversation.get_transcript("t", "u", session)

    async def aclose(self) -> None:
        for replica in self.replicas:
            await replica.shutdown()


def dies_after_its_last_write(replica: ChatHandler) -> None:
    """``replica`` starts nothing after its turns' last writes, as when it is
    killed right after them."""

    async def nothing(*args: object) -> None:
        return None

    replica.queue.start_passed_on = nothing  # type: ignore[method-assign,assignment]
    replica.queue.kick = nothing  # type: ignore[method-assign,assignment]


def enqueued(session: str, text: str) -> ChatRequest:
    """A stateful request of ``session`` with ``multitask_strategy="enqueue"``."""
    return ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid="u"),
        agent_identifier=AGENT,
        conversation=[question(text)],
        stateful=True,
        session_id=session,
        multitask_strategy="enqueue",
    )
