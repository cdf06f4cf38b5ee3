"""One history: the seeded scheduler's steps, then the drive to the end.

At each step every task of the world has run until it is blocked (at a
parked store call, a timer, or a reader's wait); the invariants are
checked; then the scheduler picks one thing to happen: a parked call
proceeds, a client sends a request, a fault strikes, or time moves. After
the last step the faults stop (paused replicas continue, a replica is
restarted if none lives) and the world runs until every turn has ended,
with takeover scans and status polls as a deployment makes them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from tether.domain.chat_request import MultitaskStrategy
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.domain.queued_messages import waiting_in
from tether.simulation import invariants, operations
from tether.simulation.world import Replica, World, deterministic_ids, quiet_logs

STRATEGIES: tuple[MultitaskStrategy, ...] = ("reject", "enqueue", "interrupt", "rollback")
_END_ROUNDS = 3_000
_NUDGE_SECONDS = 0.5
_SETTLE_SPINS = 1_000_000
_QUESTIONS = 6
"""Messages a history sends at most."""
_KILLS = 2
"""Replicas a history kills at most (a restart brings a new one)."""
_RECENT = 3
"""Cancels and reads pick among the turns sent last."""


@dataclass
class History:
    """What one seed did, and what it broke."""

    seed: int
    schedule: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Options:
    steps: int = 120
    store: str = "memory"
    replicas: int = 3
    sessions: int = 1


def history_seed(run_seed: int, number: int) -> int:
    """The seed of a run's ``number``-th history: replayable on its own."""
    return random.Random(f"{run_seed}:{number}").randrange(2**31)


def run_history(seed: int, options: Options) -> History:
    """Run the history of ``seed`` on a fresh virtual-time loop."""
    from tether.simulation.virtual_loop import VirtualTimeLoop

    loop = VirtualTimeLoop()
    try:
        with deterministic_ids(seed), quiet_logs():
            return loop.run_until_complete(_History(loop, seed, options).run())
    finally:
        loop.close()


class _History:
    def __init__(self, loop: Any, seed: int, options: Options) -> None:
        self.options = options
        self.world = World(loop, seed, store=options.store, replicas=options.replicas)
        self.rng = random.Random(seed)
        self.history = History(seed)
        self.sessions = [f"s{i}" for i in range(options.sessions)]
        self.ops: set[asyncio.Task[Any]] = set()
        self.questions = 0
        self.kills = 0
        self.step = 0
        self._shots: dict[str, invariants.Snapshot] = {}
        self._shots_version = -1

    async def run(self) -> History:
        world = self.world
        await world.open()
        try:
            for step in range(self.options.steps):
                self.step = step
                await self._settle()
                if await self._check(final=False):
                    return self.history
                self._act()
            self.step = self.options.steps
            if await self._drive_to_end():
                await self._settle()
                await self._check(final=True)
        finally:
            for task in self.ops:
                task.cancel()
            await world.aclose()
        return self.history

    # ------------------------------------------------------------ plumbing

    def _log(self, text: str) -> None:
        self.history.schedule.append(f"{self.step:3d} t={self.world.loop.time():6.2f} {text}")

    async def _settle(self) -> None:
        """Run every task until each is blocked (and no store call is under way)."""
        loop, gate = self.world.loop, self.world.gate
        for _ in range(_SETTLE_SPINS):
            await asyncio.sleep(0)
            if loop.pending() == 0 and gate.in_flight == 0:
                return

    async def _check(self, *, final: bool) -> bool:
        version = self.world.model.version
        if version != self._shots_version or final:
            self._shots = {s: await invariants.snapshot(self.world, s) for s in self.sessions}
            self._shots_version = version
        shots = self._shots
        found = invariants.after_step(self.world.model, shots)
        if final:
            found += invariants.at_end(self.world.model, shots, self.world.readings)
        for violation in dict.fromkeys(found):
            self._log(f"VIOLATION {violation}")
        self.history.violations.extend(dict.fromkeys(found))
        return bool(found)

    def _spawn(
        self, replica: Replica, name: str, work: Coroutine[Any, Any, str]
    ) -> asyncio.Task[Any]:
        number = len(self.history.schedule)
        self._log(f"{replica.name} {name} [op{number}]")
        task = replica.run(work, f"op{number}")
        self.ops.add(task)

        def done(finished: asyncio.Task[Any]) -> None:
            self.ops.discard(finished)
            if finished.cancelled():
                outcome = "killed"
            elif (error := finished.exception()) is not None:
                outcome = f"raised {type(error).__name__}: {str(error)[:60]}"
            else:
                outcome = str(finished.result())
            self._log(f"  op{number} {name} -> {outcome}")

        task.add_done_callback(done)
        return task

    def _client_replica(self) -> Replica | None:
        usable = [r for r in self.world.live() if not r.paused]
        return self.rng.choice(usable) if usable else None

    # ------------------------------------------------------------ the steps

    def _act(self) -> None:
        world, rng = self.world, self.rng
        eligible = world.gate.eligible()
        live = world.live()
        turns = world.known_turns
        # Clients wait for answers: the more requests are under way, the
        # fewer new ones, so requests overlap without burying each other.
        busy = 1.0 / (1 + len(self.ops))
        sends = 3.0 * busy if self.questions < _QUESTIONS else 0.0
        faults = 1.0 if self.kills < _KILLS else 0.0
        choices: list[tuple[float, Callable[[], None]]] = [
            (12.0 if eligible else 0.0, lambda: self._release(rng.choice(eligible))),
            (sends, self._send),
            (2.0 * busy if turns else 0.0, self._cancel),
            (2.0 * busy, self._status),
            (1.0 * busy if turns else 0.0, self._attach),
            (0.4 * busy, self._erase),
            (0.1 * busy, self._share),
            (1.0 * busy, self._scan),
            (0.2 * busy, self._retention),
            (0.7 * faults if len(live) > 1 else 0.0, self._kill),
            (0.3 * faults if len(live) > 1 else 0.0, self._pause),
            (1.0 if any(r.paused for r in live) else 0.0, self._resume),
            (0.5 if len(live) < world.replica_count else 0.0, self._restart),
            (0.4, self._past_dead),
            (1.0 if eligible else 4.0, self._tick),
        ]
        total = sum(weight for weight, _ in choices)
        pick = rng.uniform(0, total)
        for weight, act in choices:
            if pick < weight:
                act()
                return
            pick -= weight
        choices[-1][1]()

    def _release(self, parked: Any) -> None:
        self._log(f"go {parked.describe()}")
        self.world.gate.release(parked)

    def _send(self) -> None:
        replica = self._client_replica()
        if replica is None:
            return
        strategy = self.rng.choices(STRATEGIES, weights=(2, 3, 2, 1))[0]
        session = self.rng.choice(self.sessions)
        self.questions += 1
        text = f"q{self.questions}"
        work = operations.send(self.world, replica, session, text, strategy)
        self._spawn(replica, f"send {session} {text} {strategy}", work)

    def _pick_turn(self) -> tuple[str, str]:
        # Clients cancel and read what they sent lately, not long-finished turns.
        return self.rng.choice(self.world.known_turns[-_RECENT:])

    def _cancel(self) -> None:
        replica = self._client_replica()
        if replica is None:
            return
        session, turn = self._pick_turn()
        self._spawn(
            replica, f"cancel {turn[:6]}", operations.cancel(self.world, replica, session, turn)
        )

    def _attach(self) -> None:
        replica = self._client_replica()
        if replica is None:
            return
        session, turn = self._pick_turn()
        self._spawn(
            replica, f"attach {turn[:6]}", operations.read(self.world, replica, session, turn)
        )

    def _status(self) -> None:
        replica = self._client_replica()
        if replica is not None:
            session = self.rng.choice(self.sessions)
            self._spawn(
                replica, f"status {session}", operations.status(self.world, replica, session)
            )

    def _erase(self) -> None:
        replica = self._client_replica()
        if replica is not None:
            session = self.rng.choice(self.sessions)
            self._spawn(replica, f"erase {session}", operations.erase(self.world, replica, session))

    def _share(self) -> None:
        replica = self._client_replica()
        if replica is not None:
            session = self.rng.choice(self.sessions)
            self._spawn(replica, f"share {session}", operations.share(self.world, replica, session))

    def _scan(self) -> None:
        replica = self._client_replica()
        if replica is not None:
            self._spawn(replica, "takeover scan", operations.takeover_scan(self.world, replica))

    def _retention(self) -> None:
        replica = self._client_replica()
        if replica is not None:
            self._spawn(replica, "retention", operations.retention_scan(self.world, replica))

    def _kill(self) -> None:
        world = self.world
        live = world.live()
        owners = {p.replica for p in world.gate.parked}
        busy = [r for r in live if r.name in owners]
        victim = self.rng.choice(busy if busy and self.rng.random() < 0.7 else live)
        self._log(f"KILL {victim.name}")
        self.kills += 1
        world.kill(victim)

    def _pause(self) -> None:
        victim = self.rng.choice(self.world.live())
        self._log(f"PAUSE {victim.name}")
        self.world.pause(victim, True)

    def _resume(self) -> None:
        paused = [r for r in self.world.live() if r.paused]
        replica = self.rng.choice(paused)
        self._log(f"RESUME {replica.name}")
        self.world.pause(replica, False)

    def _restart(self) -> None:
        replica = self.world.add_replica()
        self._log(f"START {replica.name}")

    def _past_dead(self) -> None:
        seconds = self.world.settings.dead_after + 0.5
        self._log(f"clock +{seconds}")
        self.world.loop.advance(seconds)

    def _tick(self) -> None:
        loop = self.world.loop
        deadline = loop.next_deadline()
        step = 0.1 if deadline is None else min(1.0, max(0.0, deadline - loop.time()))
        self._log(f"clock +{step:.2f}")
        loop.advance(step)

    # ------------------------------------------------------------ the end

    async def _drive_to_end(self) -> bool:
        """Faults stop; run until every turn has ended. False (and a
        violation) if some turn never does."""
        world = self.world
        for replica in world.live():
            if replica.paused:
                world.pause(replica, False)
        if not world.live():
            world.add_replica()
        self._log("faults stop")
        nudge_at = world.loop.time()
        nudges: list[asyncio.Task[Any]] = []
        for _ in range(_END_ROUNDS):
            await self._settle()
            eligible = world.gate.eligible()
            if eligible:
                self._release(self.rng.choice(eligible))
                continue
            if not self.ops and await self._all_ended():
                return True
            if world.loop.time() >= nudge_at and not any(not t.done() for t in nudges):
                replica = self.rng.choice(world.live())
                nudges = [
                    self._spawn(replica, "takeover scan", operations.takeover_scan(world, replica))
                ]
                for session in self.sessions:
                    work = operations.status(world, replica, session)
                    nudges.append(self._spawn(replica, f"status {session}", work))
                nudge_at = world.loop.time() + _NUDGE_SECONDS
                continue
            deadline = world.loop.next_deadline()
            step = _NUDGE_SECONDS if deadline is None else max(0.0, deadline - world.loop.time())
            world.loop.advance(min(step, _NUDGE_SECONDS))
        self._log("VIOLATION not terminal: some turn never ended after the faults stopped")
        self.history.violations.append("not terminal: some turn never ended")
        return False

    async def _all_ended(self) -> bool:
        for session in self.sessions:
            shot = await invariants.snapshot(self.world, session)
            if shot.row is not None and shot.row.status is ChatStreamStatus.RUNNING:
                return False
            if waiting_in(shot.transcript):
                return False
        return True
