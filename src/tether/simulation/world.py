"""The simulated deployment: replicas over one set of stores, one virtual clock.

Each replica is a ``ChatHandler`` as a server builds it. They share the
stores (in memory, or one SQLite file), the virtual clock and nothing else.
Every task a replica starts (a client's request to it, its turns, its
background work) runs in a context naming it (``gate.REPLICA``), which the
loop's task factory reads to know whose tasks to stop when it is killed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import random
import tempfile
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.adapters.memory import (
    InMemoryChangeChannel,
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.message_bus import MessageBus
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.takeover import AutomaticTakeover
from tether.metrics import TetherMetrics
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings
from tether.simulation.agent import SimRegistries
from tether.simulation.gate import OPERATION, REPLICA, Gate
from tether.simulation.model import Model
from tether.simulation.virtual_loop import VirtualClock, VirtualTimeLoop, still

SETTINGS = TetherSettings(
    heartbeat_interval=1.0,
    dead_after=3.0,
    recording_flush_interval=0.5,
    checkpoint_interval=5.0,
    follower_poll_interval=0.5,
    follower_push_fallback_interval=1.0,
    takeover=True,
    presence=False,
    takeover_limit=3,
    takeover_scan_interval=0.25,
    finished_turn_grace=2.0,
    drain_grace=0.0,
    max_turn_events=1_000,
    # The reference model knows no fair limits: none refuses an operation.
    max_turns_per_requester=0,
    max_turns_per_tenant=0,
    max_queued_turns=0,
)
"""The timing contract's values, but a short grace: finished turns are
cleaned up within a history, which is a race of its own."""
_NOT_GATED = {"open", "aclose"}


@dataclass
class Replica:
    """One replica process: its handler and the tasks it runs."""

    name: str
    handler: ChatHandler
    tasks: dict[asyncio.Task[Any], None] = field(default_factory=dict)
    """Its running tasks in the order they started (a dict, not a set, whose
    order is their addresses'): a kill cancels them in the same order on every
    run of a seed."""
    dead: bool = False
    paused: bool = False

    def run(self, work: Coroutine[Any, Any, Any], operation: str = "") -> asyncio.Task[Any]:
        """Run ``work`` as this replica's (a request it serves, named ``operation``)."""
        context = contextvars.copy_context()
        context.run(REPLICA.set, self.name)
        context.run(OPERATION.set, operation)
        return asyncio.get_running_loop().create_task(work, context=context)


class World:
    """Stores, replicas, the gate and the model of one history."""

    def __init__(self, loop: VirtualTimeLoop, seed: int, *, store: str, replicas: int) -> None:
        self.loop = loop
        self.clock = VirtualClock(loop)
        self.rng = random.Random(seed)
        self.model = Model()
        self.gate = Gate(self.model.observe)
        self.store_kind = store
        self.replica_count = replicas
        self.replicas: list[Replica] = []
        self.settings = SETTINGS
        self._stack = AsyncExitStack()
        self._born = 0
        self.stores = TurnStores()
        self.metrics = TetherMetrics()
        """One registry for every replica of the history: nobody reads them."""
        self.known_turns: list[tuple[str, str]] = []
        """(session, turn) of every turn a client was answered for, in order."""
        self.readings: list[Any] = []
        """What each reader saw (``operations.Reading``)."""
        loop.set_task_factory(self._task_factory)  # type: ignore[arg-type]

    # ------------------------------------------------------------ life

    async def open(self) -> None:
        self.stores = await self._open_stores()
        for name, store in (
            ("supervision", self.stores.supervision),
            ("recording", self.stores.recording),
            ("agent_state", self.stores.agent_state),
            ("conversation", self.stores.conversation),
        ):
            self.gate.wrap(name, store, skip=_NOT_GATED)
        for _ in range(self.replica_count):
            self.add_replica()

    async def aclose(self) -> None:
        for replica in self.replicas:
            self.kill(replica)
        for _ in range(100):
            if not any(r.tasks for r in self.replicas):
                break
            await asyncio.sleep(0)
        await self._stack.aclose()

    async def _open_stores(self) -> TurnStores:
        if self.store_kind == "memory":
            channel = InMemoryChangeChannel()
            return TurnStores(
                agent_state=InMemoryChatAgentStateStore(),
                recording=InMemoryChatStreamRecordingStore(channel),
                supervision=InMemoryChatStreamSupervisionStore(channel),
                conversation=InMemoryChatConversationStore(clock=self.clock),
            )
        from tether.adapters.sqlite import (
            SQLiteChatAgentStateStore,
            SQLiteChatConversationStore,
            SQLiteChatStreamRecordingStore,
            SQLiteChatStreamSupervisionStore,
        )
        from tether.adapters.sqlite.database import SQLiteDatabase

        directory = Path(self._stack.enter_context(tempfile.TemporaryDirectory()))
        database = SQLiteDatabase(directory / "sim.db")
        stores = TurnStores(
            agent_state=SQLiteChatAgentStateStore(database),
            recording=SQLiteChatStreamRecordingStore(database),
            supervision=SQLiteChatStreamSupervisionStore(database),
            conversation=SQLiteChatConversationStore(database, clock=self.clock),
        )
        for opened in (stores.agent_state, stores.recording, stores.supervision):
            await self._stack.enter_async_context(opened)  # type: ignore[arg-type]
        await self._stack.enter_async_context(stores.conversation)  # type: ignore[arg-type]
        return stores

    # ------------------------------------------------------------ replicas

    def add_replica(self) -> Replica:
        """A new replica process (a restart is a new one: new id, nothing in memory)."""
        name = f"r{self._born}"
        self._born += 1
        handler = ChatHandler(
            SimRegistries(self.model.agent_told),
            self.stores,
            self.settings,
            MessageBus(),
            self.clock,
            monotonic=still,
            metrics=self.metrics,
        )
        # Its own takeover loop's order and back-off, seeded and on virtual time.
        handler.takeovers = AutomaticTakeover(
            handler,
            interval=self.settings.takeover_scan_interval,
            limit=self.settings.takeover_limit,
            resume=self.settings.takeover,
            monotonic=self.loop.time,
            order=random.Random(self.rng.getrandbits(32)),
        )
        handler.erase = self._told_of_erases(handler.erase)  # type: ignore[method-assign,assignment]
        replica = Replica(name, handler)
        self.replicas.append(replica)
        return replica

    def _told_of_erases(self, erase: Erase) -> Erase:
        """``erase`` that tells the model of every erase that returned or died
        half way: a client's, and one the takeover scan finishes for a replica
        that died erasing (``handlers.takeover``)."""
        model = self.model

        async def erase_and_tell(tenant: str, requester_uuid: str | None, session: str) -> bool:
            began = model.tick()
            try:
                erased = await erase(tenant, requester_uuid, session)
            except asyncio.CancelledError:
                model.erase_interrupted(session)  # killed half way
                raise
            model.erase_returned(session, began, "erase")
            return erased

        return erase_and_tell

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if not r.dead]

    def kill(self, replica: Replica) -> None:
        """SIGKILL: its parked calls never land, its tasks stop where they are."""
        replica.dead = True
        replica.paused = False
        self.gate.kill(replica.name)
        for task in list(replica.tasks):
            task.cancel()

    def pause(self, replica: Replica, paused: bool) -> None:
        """SIGSTOP and SIGCONT, as the stores see it: its calls stay parked."""
        replica.paused = paused
        if paused:
            self.gate.paused.add(replica.name)
        else:
            self.gate.paused.discard(replica.name)

    def _task_factory(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any],
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
        owner = (context if context is not None else contextvars.copy_context()).get(REPLICA)
        if owner is not None:
            for replica in self.replicas:
                if replica.name == owner:
                    replica.tasks[task] = None
                    task.add_done_callback(functools.partial(_forget, replica.tasks))
                    if replica.dead:
                        task.cancel()
        return task


Erase = Callable[[str, "str | None", str], Coroutine[Any, Any, bool]]
"""``ChatHandler.erase``."""


def _forget(tasks: dict[asyncio.Task[Any], None], done: asyncio.Task[Any]) -> None:
    tasks.pop(done, None)


@contextmanager
def deterministic_ids(seed: int) -> Iterator[None]:
    """``uuid.uuid4`` from a seeded generator while a history runs: turn ids,
    replica ids and the order that follows from them are the seed's."""
    ids = random.Random(seed ^ 0x5EED)
    original = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
    try:
        yield
    finally:
        uuid.uuid4 = original


@contextmanager
def quiet_logs() -> Iterator[None]:
    """The handlers log every race they survive; a simulation makes thousands."""
    logger = logging.getLogger("tether")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)
