"""No turn left behind: every replica takes over, or ends, turns whose producer died.

A stateful turn outlives its producer only if someone resumes it. A client
that comes back does (``POST /chat/stream?resume=true``); this module makes
the replicas do it by themselves, within a second of the turn reading dead:

- Every ``TETHER_TAKEOVER_SCAN_INTERVAL`` (0.25 s), and at once when another
  replica announces a hand-off (``announce_dead_turns``: a drain, over
  PostgreSQL NOTIFY or Redis pub/sub), each replica asks the supervision
  store for RUNNING rows whose heartbeat is older than the dead threshold
  (``list_stale_running``: an index, a sorted set, one directory; the cost
  does not grow with the live turns of other replicas). Where the replicas
  hold presence locks (``tether.runtime.presence``: SQLite, the file store,
  PostgreSQL, Redis) it asks for rows not renewed for half a heartbeat
  interval, and those whose producer's lock is free are dead at once: a
  killed replica's turns are taken over within a second of the kill, not
  after three; a slow one's still wait out the threshold.
- For each, it reads the turn's checkpoint marker, which carries what a
  takeover needs (the agent, its bot params, the requester's roles and
  tenants), rebuilds the request and resumes the turn exactly as a client's
  resume would: ``ChatHandler.start_turn`` claims the next epoch by the
  store's compare-and-swap, so of several replicas (and a client) racing for
  one dead turn exactly one wins; the others are refused and move on.
- A turn taken over ``TETHER_TAKEOVER_LIMIT`` times already (an agent that
  kills every replica running it) is not tried again: it ends ``errored``,
  code ``TAKEOVER_LIMIT``. A turn that cannot be resumed (its checkpoint has
  no marker of it, or its agent is no longer set up) ends ``errored``, code
  ``PRODUCER_LOST`` (the reaper): nothing reads ``running`` forever. With
  ``TETHER_TAKEOVER=false`` replicas still reap, but leave resumable turns to
  a client's resume.
- Replicas do not stampede: each scans on its own phase and takes the dead
  turns it found in its own random order, eight at a time (so the replicas
  of a deployment that lost one with many turns take different ones, not all
  the same ones first, and the last of them starts within a few claims of
  the first), and a turn a replica failed to take is left to the others for
  a growing back-off.
- A turn whose producers died before (taken over ``n`` times already) is
  taken over again only ``dead_after * 2**(n-1)`` after its last heartbeat,
  even when its producer's presence lock says at once that it is gone: an
  agent that crashes its replica is retried ever more slowly rather than
  at the pace of the kills. The bound is the row's own, by the store's
  clock, so every replica waits alike. A drain's hand-off is never held
  back (its heartbeat is from long ago).

A supervision store without ``list_stale_running`` (a seed-only adapter)
keeps the client-driven resume only; the server says so at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.domain.chat_conversation_store import ConversationNotOwnedError
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore, StaleTurn
from tether.handlers.endings import PRODUCER_LOST
from tether.handlers.errors import (
    ConversationBusyError,
    TurnEndedError,
    TurnNotFoundError,
    TurnRequestError,
    UnknownAgentError,
)
from tether.handlers.replica import Replica
from tether.handlers.retention import LEASE_KEY
from tether.observability.logs import turn_log_context
from tether.runtime import background
from tether.runtime import conversation_row as rows
from tether.runtime.conversation_row import RowState
from tether.runtime.lease import ConversationKey

logger = logging.getLogger(__name__)

TAKEOVER_LIMIT = "TAKEOVER_LIMIT"

_BATCH = 50  # dead turns looked at per scan
_CANNOT_LIST = (
    "automatic takeover is off: %s cannot list dead turns (list_stale_running); "
    "a dead turn waits for a client's resume"
)
_BACKOFF_CAP = 30.0
"""The longest a replica leaves a turn it failed to take to the others."""
_TAKES_AT_ONCE = 8
"""Dead turns one replica takes over side by side (their claims, checkpoint
reads and first writes overlap; the agents then run as any turns do)."""
_RETRY_CAP = timedelta(minutes=2)
"""The longest a turn whose producers keep dying waits between takeovers."""


@dataclass
class _Attempt:
    failures: int
    not_before: float


class AutomaticTakeover:
    """The loop that finds dead turns and takes them over or ends them."""

    def __init__(
        self,
        handler: Replica,
        *,
        interval: float,
        limit: int,
        resume: bool = True,
        suspect_after: timedelta = timedelta(seconds=0.5),
        monotonic: Callable[[], float] = time.monotonic,
        order: random.Random | None = None,
    ) -> None:
        self._handler = handler
        self._interval = interval
        self.suspect_after = suspect_after
        """Rows not renewed for this long get their producer's presence tested."""
        self._limit = limit
        self._resume = resume
        self._monotonic = monotonic
        self._order = order or random.Random()
        """Shuffles each scan's dead turns: each replica's own order."""
        self._attempts: dict[str, _Attempt] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> bool:
        """Start scanning; False (and a log line saying why) when this server cannot."""
        store = self._handler.stores.supervision
        if store is None or self._handler.stores.agent_state is None:
            return False
        if not supports(store, Capability.SUPERVISION_LIST_STALE_RUNNING):
            logger.warning(_CANNOT_LIST, type(store).__name__)
            return False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="takeovers")
        return True

    @property
    def running(self) -> bool:
        """Whether this replica looks for dead turns (followers then wait for a
        takeover rather than ending at a dead producer)."""
        return self._task is not None and not self._task.done()

    async def aclose(self) -> None:
        await background.stop(self._task)

    async def _run(self) -> None:
        store = self._handler.stores.supervision
        assert store is not None
        # A hand-off (a drain) is announced where the store has a channel:
        # scan at once then, and at the interval otherwise (a kill announces
        # nothing; without a channel the wait sleeps out the interval).
        async with store.subscribe_dead_turns() as handed_off:
            while not self._handler.draining:
                await handed_off.wait(self._interval)
                try:
                    await self.scan()
                except Exception:
                    logger.warning("looking for dead turns failed; retrying", exc_info=True)

    async def scan(self) -> int:
        """One pass: take over or end every dead turn found; how many this
        replica took or ended."""
        store = self._handler.stores.supervision
        assert store is not None
        found = await self._dead_turns(store)
        self._order.shuffle(found)
        due = [s for s in found if s.tenant != LEASE_KEY.tenant and not self._backing_off(s)]
        # The turns of a killed replica die together: resumed side by side, the
        # last of twenty starts within a few claims of the first, not twenty.
        gate = asyncio.Semaphore(_TAKES_AT_ONCE)
        taken = await asyncio.gather(*(self._take_in_turn(stale, gate) for stale in due))
        return sum(taken)

    def _backing_off(self, stale: StaleTurn) -> bool:
        """Whether this replica failed to take ``stale`` lately and leaves it to others."""
        attempt = self._attempts.get(stale.supervision.message_id)
        return attempt is not None and self._monotonic() < attempt.not_before

    async def _take_in_turn(self, stale: StaleTurn, gate: asyncio.Semaphore) -> bool:
        """``_take`` once the gate lets it through; whether this replica took
        or ended the turn. A failure (refused, or an error, logged) backs off."""
        message_id = stale.supervision.message_id
        async with gate:
            if self._handler.draining:
                return False
            try:
                taken = await self._take(stale)
            except Exception:
                logger.warning("turn %s: taking it over failed", message_id, exc_info=True)
                taken = False
        if taken is None:
            return False  # its earlier producers died too: every replica waits alike
        if taken:
            self._attempts.pop(message_id, None)
            return True
        attempt = self._attempts.get(message_id)
        failures = attempt.failures + 1 if attempt is not None else 1
        delay = min(self._interval * 2**failures, _BACKOFF_CAP)
        self._attempts[message_id] = _Attempt(failures, self._monotonic() + delay)
        return False

    async def _dead_turns(self, store: ChatStreamSupervisionStore) -> list[StaleTurn]:
        """The RUNNING rows that read dead now: by heartbeat age, or, where the
        replicas hold presence locks, because their producer is gone.

        With presence, the listing reaches back only half a heartbeat
        interval (``suspect_after``), so it holds live rows too (at most a
        batch of them): a killed producer's rows stop being renewed, so once
        a renewal is missed they are the oldest there. Each distinct producer
        among the rows not yet dead by age costs one lock test per scan: the
        cost follows the number of replicas, not of turns."""
        handler = self._handler
        presence = handler.presence
        now = handler.clock()
        suspect = self.suspect_after if presence.available else handler.dead_after
        found = await store.list_stale_running(now - suspect, _BATCH)
        late = {
            s.supervision.producer
            for s in found
            if s.supervision.producer is not None
            and not s.supervision.is_dead(now, handler.dead_after)
        }
        if late:
            gone = await presence.find_gone(late)
            handler.metrics.presence_tests.labels("gone").inc(len(gone))
            handler.metrics.presence_tests.labels("held").inc(len(late - gone))
        return [s for s in found if s.supervision.is_dead(now, handler.dead_after, presence.gone)]

    async def _take(self, stale: StaleTurn) -> bool | None:
        """Take ``stale`` over, or end it; whether this replica did (None: not
        yet, its producers died before and it backs off)."""
        handler = self._handler
        key = ConversationKey(stale.tenant, stale.requester_uuid or "", stale.session_id)
        message_id = stale.supervision.message_id
        state = rows.state_of(stale.supervision, handler.clock(), handler.dead_after)
        if state is RowState.ERASING:
            # An erase that died half way (the listing holds only rows that
            # read dead): its owner, or the retention policy, asked for it,
            # so finish it, as a dead cancel is finished below. Left alone,
            # the conversation would stay half erased and its row would fill
            # a slot of every scan's batch for good. The erase re-reads the
            # row; one still live answers busy and is left to its replica.
            with contextlib.suppress(ConversationBusyError, ConversationNotOwnedError):
                await handler.erase(key.tenant, key.requester_uuid, key.session_id)
                return True
            return False
        if state is RowState.ENDING and rows.is_cancelling(stale.supervision):
            # A cancel that died half way: the user asked for it, so finish it.
            with contextlib.suppress(TurnEndedError, TurnNotFoundError):
                await handler.cancel(key.tenant, key.requester_uuid, key.session_id, message_id)
            return True
        if state is RowState.ENDING:
            # The reaper died half way: its verdict stands.
            return await handler.endings.end_dead_turn(
                key, message_id, PRODUCER_LOST, "the turn's producer died and it cannot be resumed"
            )
        marker = await self._marker(key, message_id)
        if marker is None and await handler.queue.start_handed_off(key, message_id):
            return True  # a queued turn whose starter drained or died before its marker
        if marker is None:
            return await handler.endings.end_dead_turn(
                key, message_id, PRODUCER_LOST, "the turn's producer died and it cannot be resumed"
            )
        if not self._resume:
            return False  # automatic takeover is off: left for a client's resume
        if int(marker.get("takeovers", 0)) >= self._limit:
            return await handler.endings.end_dead_turn(
                key,
                message_id,
                TAKEOVER_LIMIT,
                f"the turn was taken over {self._limit} times and its producer died each time",
            )
        earlier = int(marker.get("takeovers", 0))
        if earlier and handler.clock() < _retry_at(stale, earlier, handler.dead_after):
            return None
        request = _request(key, marker["request"])
        try:
            turn = await handler.start_turn(request, resume_message_id=message_id, automatic=True)
        except (ConversationBusyError, TurnEndedError):
            return False  # another replica (or a client) was first, or it ended
        except UnknownAgentError:
            return await handler.endings.end_dead_turn(
                key, message_id, PRODUCER_LOST, "the turn's agent is no longer set up"
            )
        except TurnRequestError as error:
            logger.warning("turn %s: cannot take it over: %s", message_id, error)
            return False
        with turn_log_context(turn.observed.fields):
            logger.info("turn %s: taken over from a dead producer", message_id)
        return True

    async def _marker(self, key: ConversationKey, message_id: str) -> dict[str, Any] | None:
        """The turn's checkpoint marker, if it is this turn's and says how to
        rebuild its request."""
        store = self._handler.stores.agent_state
        if store is None:
            return None
        state = await store.load(key.tenant, key.requester_uuid, key.session_id)
        marker = state.get(TURN_STATE_KEY)
        if not isinstance(marker, dict) or marker.get("message_id") != message_id:
            return None
        if not isinstance(marker.get("request"), dict):
            return None  # written by a release without automatic takeover
        return marker


def _retry_at(stale: StaleTurn, earlier: int, dead_after: timedelta) -> datetime:
    """When a turn taken over ``earlier`` times already may be taken over
    again: ``dead_after`` after its last heartbeat, doubled for each earlier
    takeover past the first, at most ``_RETRY_CAP``."""
    wait = min(dead_after * 2 ** (earlier - 1), _RETRY_CAP)
    return stale.supervision.heartbeat_at + wait


def _request(key: ConversationKey, saved: dict[str, Any]) -> ChatRequest:
    """The request of a resume, as its turn's client would have sent it."""
    headers = RequestHeaders.model_validate(
        {
            "requester-uuid": key.requester_uuid or None,
            "user-roles": saved.get("user_roles"),
            "user-tenants": saved.get("user_tenants"),
        }
    )
    return ChatRequest(
        tenant=key.tenant,
        request_headers=headers,
        agent_identifier=saved["agent_identifier"],
        conversation=[],
        bot_params=saved.get("bot_params"),
        stateful=True,
        session_id=key.session_id,
    )
