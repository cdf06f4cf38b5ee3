"""Rounds of a conversation, not of one turn: ``--fault queue`` and ``--fault erase``.

queue: each conversation's first turn starts on the producer. Once its
client has a few messages, a second message goes to the same conversation
through another replica (or the load balancer) with a multitask strategy
(``enqueue``, ``interrupt``, ``rollback`` or the default ``reject``), and the
producer is SIGKILLed: just after the second message was sent, or just
before, so that it lands on a turn whose replica died. Each turn's client is
the Python client (``tether.client``), which recovers its turn through the
survivors. The conversation is then checked as a whole
(``conversation_checks.check_conversation``).

erase: each conversation's turn starts on the producer; once it streams, the
producer is SIGKILLed and, a moment later, the conversation is erased through
a survivor while the survivors' takeover resumes the dead turn (an erase
answers 409 while a turn is live, so the client asks again until it returns).
Once it returned, no replica may serve the conversation and the stores may
hold nothing of it: checked at once, and again after the takeover has had
time to write anything back (``conversation_checks.check_erased``).

Retention's prune goes through the same erase; it is left to the simulator
(``tether simulate``), which runs it between any two store calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx2

from tether.client import RotatingEndpoints, TetherClient, routes
from tether.client.errors import ConversationBusyError, TetherError
from tether.client.turn import Turn
from tether.crashtest.client import REQUESTER, TENANT, TIMEOUT
from tether.crashtest.cluster import Replica
from tether.crashtest.conversation_checks import (
    ErasedEvidence,
    TurnTrace,
    check_conversation,
    check_erased,
    rewound,
)
from tether.crashtest.faults import FaultKind, inject
from tether.crashtest.invariants import Violation
from tether.crashtest.reference import Reference
from tether.crashtest.results import RoundResult
from tether.crashtest.rounds import RoundContext, RoundPlan, round_bound

STRATEGIES = ("enqueue", "interrupt", "rollback", "reject")
_ERASE_PAUSE = 0.2
"""Between an erase answered 409 (a turn is live) and the client's next try."""


@dataclass(frozen=True)
class ConversationFault:
    """Where a conversation round's kill lands, drawn from the run's seed."""

    strategy: str
    kill_first: bool
    """Kill before the second message (it lands on a dead turn) or after it."""
    after_messages: int
    delay: float
    """Seconds between the second message (or the erase) and the kill (or after it)."""

    def describe(self) -> str:
        if self.strategy == "erase":
            return f"@msg {self.after_messages}, kill, erase +{self.delay * 1000:.0f}ms"
        order = "kill, then send" if self.kill_first else "send, then kill"
        return f"@msg {self.after_messages}, {order} +{self.delay * 1000:.0f}ms"


def draw_conversation_fault(
    rng: random.Random, kind: FaultKind, messages: int
) -> ConversationFault:
    strategy = rng.choice(STRATEGIES) if kind is FaultKind.QUEUE else "erase"
    return ConversationFault(
        strategy,
        kill_first=rng.random() < 0.5,
        after_messages=rng.randint(2, max(2, int(messages * 0.5))),
        delay=rng.choice((0.0, rng.uniform(0.0, 0.3), rng.uniform(0.3, 1.5))),
    )


@dataclass
class _Slot:
    number: int
    prompt: str
    session_id: str
    result: RoundResult
    turns: list[TurnTrace] = field(default_factory=list)
    followers: list[asyncio.Task[None]] = field(default_factory=list)


async def play_conversation_round(
    ctx: RoundContext,
    plan: RoundPlan,
    fault: ConversationFault,
    references: dict[str, Reference],
) -> list[RoundResult]:
    """Play a ``queue`` or ``erase`` round; one result per conversation."""
    kind = plan.fault.kind
    slots = [
        _Slot(
            slot,
            prompt,
            f"crash-{plan.number}-{slot}-{uuid.uuid4().hex[:10]}",
            RoundResult(
                number=plan.number,
                conversation=slot,
                producer=plan.producer.name,
                fault=str(kind),
                variant=fault.strategy,
                point=fault.describe(),
                prompt=prompt,
            ),
        )
        for slot, prompt in enumerate(plan.prompts)
    ]
    for slot in slots:
        slot.result.session_id = slot.session_id
    bound = 2 * max(round_bound(references[s.prompt], ctx.settings) for s in slots)
    started = time.monotonic()
    try:
        async with asyncio.timeout(bound):
            if kind is FaultKind.QUEUE:
                await _queue(ctx, plan, fault, slots, references, bound)
            else:
                await _erase(ctx, plan, fault, slots, bound)
    except TimeoutError:
        for slot in slots:
            slot.result.violations.append(
                Violation("terminal", f"the round did not finish within its bound of {bound:.0f} s")
            )
    except (httpx2.HTTPError, OSError) as error:
        for slot in slots:
            slot.result.error = f"the round broke off: {type(error).__name__}: {error}"
    finally:
        for slot in slots:
            for task in slot.followers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for replica in ctx.cluster.replicas:
            if not replica.alive:
                ctx.phase(f"round {plan.number}: restarting {replica.name}")
                await replica.start()
    for slot in slots:
        slot.result.duration = time.monotonic() - started
    return [slot.result for slot in slots]


def _client(ctx: RoundContext, urls: Sequence[str], bound: float) -> TetherClient:
    return TetherClient(
        RotatingEndpoints(list(urls)),
        tenant=TENANT,
        requester_uuid=REQUESTER,
        http=ctx.api.http,
        timeout=TIMEOUT.connect or 5.0,
        stream_read_timeout=TIMEOUT.read or 30.0,
        # The round's bound is the limit; the client must not give up first.
        recovery_timeout=bound,
    )


def _elsewhere(ctx: RoundContext, producer: Replica) -> list[str]:
    """Where a survivor's client sends its requests: the load balancer, or
    the replicas other than the producer."""
    if ctx.api.front is not None:
        return [ctx.api.front.url]
    return [r.url for r in ctx.cluster.replicas if r is not producer and r.running]


async def _follow(
    stream: Turn, trace: TurnTrace, *, after: int = 0, reached: asyncio.Event | None = None
) -> None:
    """Follow the turn to its end, noting every text its client was shown
    and what the server sent that its guard kept off the screen (text going
    backwards: the guard is defence in depth, the server must never send
    it); ``reached`` is set once it was shown ``after`` updates (or it ended)."""
    try:
        async for update in stream:
            trace.message_id = update.message_id
            trace.shown.append(update.content)
            if reached is not None and len(trace.shown) >= after:
                reached.set()
        trace.outcome = stream.outcome
    except ConversationBusyError:
        trace.refused = True
    except TetherError as error:
        trace.outcome = stream.outcome
        if trace.outcome is None:
            trace.error = f"{type(error).__name__}: {error}"
    finally:
        # Its connection closed here, whatever ended the turn (a refusal, a
        # recovery given up, the round's end): none is left for the GC.
        with contextlib.suppress(Exception):
            await stream.aclose()
        trace.message_id = trace.message_id or stream.message_id
        trace.kept_off = trace.observer.dropped_characters
        if reached is not None:
            reached.set()


async def _start_first(
    ctx: RoundContext, plan: RoundPlan, slot: _Slot, fault: ConversationFault, bound: float
) -> None:
    """The conversation's first turn, on the producer, until its client has
    ``fault.after_messages`` messages (or the turn ended)."""
    client = _client(ctx, [plan.producer.url, *_elsewhere(ctx, plan.producer)], bound)
    first = TurnTrace(slot.prompt, "first")
    stream = client.stream(
        agent_identifier=ctx.api.agent,
        message=slot.prompt,
        session_id=slot.session_id,
        observer=first.observer,
    )
    slot.turns.append(first)
    reached = asyncio.Event()
    follow = _follow(stream, first, after=fault.after_messages, reached=reached)
    slot.followers.append(asyncio.create_task(follow))
    await reached.wait()
    slot.result.message_id = first.message_id


async def _queue(
    ctx: RoundContext,
    plan: RoundPlan,
    fault: ConversationFault,
    slots: list[_Slot],
    references: dict[str, Reference],
    bound: float,
) -> None:
    ctx.phase(f"round {plan.number}: {len(slots)} conversations on {plan.producer.name}")
    await asyncio.gather(*(_start_first(ctx, plan, s, fault, bound) for s in slots))
    survivors = _elsewhere(ctx, plan.producer)

    async def send_second(slot: _Slot) -> None:
        client = _client(ctx, survivors, bound)
        second = TurnTrace(slot.prompt, fault.strategy)
        slot.turns.append(second)
        stream = client.stream(
            agent_identifier=ctx.api.agent,
            message=slot.prompt,
            session_id=slot.session_id,
            multitask_strategy=fault.strategy,  # type: ignore[arg-type]
            observer=second.observer,
        )
        slot.followers.append(asyncio.create_task(_follow(stream, second)))

    if fault.kill_first:
        await inject(plan.producer, FaultKind.KILL)
        await asyncio.sleep(fault.delay)  # the fault's timing, drawn: not a wait for anything
        for slot in slots:
            await send_second(slot)
    else:
        for slot in slots:
            await send_second(slot)
        await asyncio.sleep(fault.delay)
        await inject(plan.producer, FaultKind.KILL)
    ctx.phase(f"round {plan.number}: {fault.strategy}, the clients recovering")
    await asyncio.gather(*(t for s in slots for t in s.followers), return_exceptions=True)

    ctx.phase(f"round {plan.number}: checking {len(slots)} conversations")
    answers = {p: _crash_free_answer(r) for p, r in references.items()}
    for slot in slots:
        transcript = await ctx.api.transcript(survivors[0], slot.session_id)
        slot.result.violations += check_conversation(slot.turns, transcript, answers)
        slot.result.final_status = " / ".join(
            "refused" if t.refused else str(t.outcome) for t in slot.turns
        )
        slot.result.notes += [
            f"{t.strategy}: {len(t.shown)} updates, "
            f"{rewound(t.shown) + t.kept_off} characters rewound"
            for t in slot.turns
        ]


async def _erase(
    ctx: RoundContext,
    plan: RoundPlan,
    fault: ConversationFault,
    slots: list[_Slot],
    bound: float,
) -> None:
    ctx.phase(f"round {plan.number}: {len(slots)} conversations on {plan.producer.name}")
    await asyncio.gather(*(_start_first(ctx, plan, s, fault, bound) for s in slots))
    await inject(plan.producer, FaultKind.KILL)
    await asyncio.sleep(fault.delay)  # the fault's timing, drawn: not a wait for anything
    survivors = _elsewhere(ctx, plan.producer)
    ctx.phase(f"round {plan.number}: erasing while the survivors take the turns over")
    statuses = await asyncio.gather(*(_erase_once(ctx, survivors[0], s, bound) for s in slots))
    seen = [await _left_behind(ctx, plan.producer, s) for s in slots]
    # Whatever a takeover still had in flight has landed by now: a dead
    # turn is taken within the dead threshold plus a scan.
    await asyncio.sleep(ctx.settings.dead_after + 4 * ctx.settings.takeover_scan_interval + 1.0)
    again = [await _left_behind(ctx, plan.producer, s) for s in slots]
    for slot, status, (served, stored), (served2, stored2) in zip(
        slots, statuses, seen, again, strict=True
    ):
        evidence = ErasedEvidence(
            status,
            tuple(dict.fromkeys(served + served2)),
            tuple(dict.fromkeys(stored + stored2)),
        )
        slot.result.violations += check_erased(evidence)
        slot.result.final_status = "erased" if status == 204 else str(status)
    # The first turn's client ends too (its turn is gone), within the bound.
    await asyncio.gather(*(t for s in slots for t in s.followers), return_exceptions=True)


async def _erase_once(ctx: RoundContext, base_url: str, slot: _Slot, bound: float) -> int | None:
    """Erase the conversation as a client would: again after each 409 (a
    turn is live), until it returns."""
    deadline = time.monotonic() + bound / 2
    route = routes.delete_conversation(TENANT, slot.session_id)
    while time.monotonic() < deadline:
        response = await ctx.api.http.request(route.method, route.url(base_url), **route.options())
        if response.status_code != 409:
            return response.status_code
        await asyncio.sleep(_ERASE_PAUSE)
    return None


async def _left_behind(
    ctx: RoundContext, producer: Replica, slot: _Slot
) -> tuple[list[str], list[str]]:
    """What of an erased conversation a replica serves, and the stores hold."""
    served = []
    for replica in ctx.cluster.replicas:
        if replica is producer or not replica.running:
            continue
        if await ctx.api.transcript(replica.url, slot.session_id) is not None:
            served.append(f"{replica.name}'s transcript")
        if (status := await ctx.api.status(replica.url, slot.session_id)) is not None:
            served.append(f"{replica.name}'s turn status ({status.status})")
        message_id = slot.result.message_id
        if message_id is not None:
            route = routes.attach(TENANT, message_id=message_id, session_id=slot.session_id)
            http = ctx.api.http
            async with http.stream(route.method, route.url(replica.url), **route.options()) as r:
                if r.status_code < 400:
                    served.append(f"{replica.name}'s stream of the turn ({r.status_code})")
    stored = []
    if ctx.stores is not None:
        held = await ctx.stores.read(slot.session_id)
        if held.recorded_final is not None:
            stored.append("recording")
        if held.checkpoint_message_id is not None:
            stored.append("checkpoint")
    return served, stored


def _crash_free_answer(reference: Reference) -> str:
    bots = [m for m in reference.expected.transcript if m.get("sender") == "bot"]
    return str(bots[-1].get("content") or "") if bots else ""
