"""What clients do to the deployment: each a request to one replica.

An operation runs as a task of the replica it is sent to, so it parks at
its store calls like everything else and dies with its replica. What the
client was answered goes to the model: a turn accepted (started or
queued), a cancel or an erase that returned, what a reader was shown and
how its stream ended.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from tether.domain.chat_conversation_store import ConversationNotOwnedError
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest, MultitaskStrategy, RequestHeaders
from tether.handlers.errors import TurnEndedError, TurnRequestError
from tether.handlers.queue import Ticket
from tether.handlers.retention import prune_stores
from tether.runtime.live_buffer import StreamEvent
from tether.simulation.agent import AGENT
from tether.simulation.model import OWNER, TENANT
from tether.simulation.world import Replica, World

RETENTION_AGE = timedelta(seconds=3)
"""Retention erases conversations not updated for this long: within a history."""


@dataclass(frozen=True)
class Reading:
    """What one reader of a turn saw."""

    turn: str
    started_seq: int
    ended_seq: int
    shown: str | None
    end: str


def request(session: str, text: str, strategy: MultitaskStrategy) -> ChatRequest:
    return ChatRequest(
        tenant=TENANT,
        request_headers=RequestHeaders(requester_uuid=OWNER),
        agent_identifier=AGENT,
        conversation=[ChatMessage(sender=ChatMessageSender.USER, content=text)],
        stateful=True,
        session_id=session,
        multitask_strategy=strategy,
    )


async def send(
    world: World, replica: Replica, session: str, text: str, strategy: MultitaskStrategy
) -> str:
    """``POST /chat/stream`` with ``strategy``; the sender then reads the stream."""
    handler = replica.handler
    asked = world.model.tick()
    try:
        if strategy == "enqueue":
            started = await handler.queue.submit(request(session, text, strategy))
        else:
            started = await handler.start_turn(request(session, text, strategy))
    except TurnRequestError as refused:
        return f"refused: {type(refused).__name__}"
    if isinstance(started, Ticket):
        world.model.accepted(started.message_id, session, "queued", asked)
        world.known_turns.append((session, started.message_id))
        return f"queued {started.message_id[:6]}"
    world.model.accepted(started.message_id, session, strategy, asked)
    world.known_turns.append((session, started.message_id))
    return f"started {started.message_id[:6]}; " + await read(
        world, replica, session, started.message_id
    )


async def read(world: World, replica: Replica, session: str, turn: str) -> str:
    """Attach to ``turn`` from ``replica`` and read its stream to the end."""
    started = world.model.tick()
    try:
        events, _ = await replica.handler.attach(TENANT, OWNER, session, turn, 0)
    except TurnEndedError:
        world.readings.append(Reading(turn, started, world.model.tick(), None, "410"))
        return "410"
    except TurnRequestError as refused:
        return f"refused: {type(refused).__name__}"
    shown: str | None = None
    end = "?"
    async for item in events:
        if isinstance(item, StreamEvent):
            shown = item.message.content
        else:
            end = item.reason
    world.readings.append(Reading(turn, started, world.model.tick(), shown, end))
    return f"read {turn[:6]}: {end}"


async def cancel(world: World, replica: Replica, session: str, turn: str) -> str:
    """``DELETE /chat/stream/{turn}``."""
    try:
        await replica.handler.cancel(TENANT, OWNER, session, turn)
    except TurnRequestError as refused:
        return f"refused: {type(refused).__name__}"
    world.model.cancel_returned(turn)
    return f"cancelled {turn[:6]}"


async def status(world: World, replica: Replica, session: str) -> str:
    """``GET /chat/stream/status``: it starts a waiting queued turn, too."""
    try:
        answer = await replica.handler.status(TENANT, OWNER, session)
    except TurnRequestError as refused:
        return f"refused: {type(refused).__name__}"
    return f"{answer.message_id[:6]} {answer.status}"


async def erase(world: World, replica: Replica, session: str) -> str:
    """``DELETE /conversations/{session}``."""
    try:
        # The model hears of it from the replica (``World``), as of the
        # erases the takeover scan finishes.
        await replica.handler.erase(TENANT, OWNER, session)
    except (TurnRequestError, ConversationNotOwnedError) as refused:
        return f"refused: {type(refused).__name__}"
    return "erased"


async def share(world: World, replica: Replica, session: str) -> str:
    """``PATCH /conversations/{session}`` (shared)."""
    store = replica.handler.stores.conversation
    assert store is not None
    await store.set_shared(TENANT, OWNER, session, True)
    return "shared"


async def takeover_scan(world: World, replica: Replica) -> str:
    """One pass of the replica's takeover loop."""
    return f"took {await replica.handler.takeovers.scan()}"


async def retention_scan(world: World, replica: Replica) -> str:
    """One retention run (``prune_stores``), as the lease holder does it."""
    began = world.model.tick()
    try:
        report = await prune_stores(
            replica.handler.stores,
            RETENTION_AGE,
            dry_run=False,
            now=world.clock(),
            dead_after=replica.handler.dead_after,
            clock=replica.handler.clock,
            end_dead=replica.handler.endings.end_erased_turn,
        )
    except asyncio.CancelledError:
        # Killed while it erased one of them, which is not told: any may
        # have lost its transcript.
        for session in {t.session for t in world.model.turns.values()}:
            world.model.erase_interrupted(session)
        raise
    for removed in report.removed:
        world.model.erase_returned(removed.session_id, began, "retention")
    return f"pruned {len(report.removed)}"
