"""The chat handler: starts, resumes, cancels and reports turns on this replica.

It does everything that can fail *before* a stream exists (unknown agent,
missing store, busy conversation, not the owner), so that the API answers those
as HTTP statuses; then it hands the turn to a ``Turn`` that runs on its own,
whether or not anyone reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tether.domain.agent_registries import AgentRegistriesFactory, BotParamsRejectedError
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationNotOwnedError,
    LastTurnStatus,
    normalize_owner,
)
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
)
from tether.domain.chat_request import ChatRequest, MultitaskStrategy
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    PresenceLock,
)
from tether.domain.message_bus import MessageBus
from tether.domain.queued_messages import Waiting, queued_id
from tether.domain.turn_context import TurnContext
from tether.handlers.cancel import cancel_turn
from tether.handlers.erase import erase_conversation
from tether.handlers.errors import (
    BotParamsError,
    ConversationBusyError,
    DrainingError,
    NotImplementedByStoreError,
    NotOwnerError,
    StorageNotConfiguredError,
    TurnEndedError,
    TurnNotFoundError,
    TurnRequestError,
    UnknownAgentError,
)
from tether.handlers.limits import TurnLimits
from tether.handlers.queue import TurnQueue
from tether.handlers.takeover import PRODUCER_LOST, AutomaticTakeover
from tether.handlers.turn import Turn
from tether.handlers.turn_ends import ending_of, kept_answer
from tether.metrics import TetherMetrics, backend_name
from tether.observability.traces import NO_TRACING, Tracing
from tether.runtime import conversation_row as rows
from tether.runtime.conversation_row import RowState
from tether.runtime.delta_publisher import DeltaPublisher
from tether.runtime.fenced_writer import raise_fences
from tether.runtime.follower import RecordingFollower, has_deltas, has_push, shows_the_same
from tether.runtime.heartbeats import HeartbeatBatcher
from tether.runtime.lease import (
    BeforeGrant,
    ClaimRefusedError,
    ConversationKey,
    FencedError,
    Lease,
    claim,
    take,
)
from tether.runtime.lifecycle import TurnState
from tether.runtime.live_buffer import ChatStreamBuffer, StreamEnd, StreamEvent
from tether.runtime.presence import ReplicaPresence
from tether.runtime.recording_flusher import RecordingFlusher
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings

logger = logging.getLogger(__name__)

_DISPLACE_TRIES = 3
"""Claims an ``interrupt`` or ``rollback`` turn tries, cancelling the occupant
before each: more than one only when other turns keep taking the conversation."""

FORCED_HAND_OFF_SECONDS = 1.0
"""The end of the drain timeout kept for handing off turns whose agents would
not stop (at most a quarter of the timeout)."""
STOP_WAIT_SECONDS = 1.0
"""How long ``shutdown`` waits for the tasks it cancels."""
_STARTING_WAIT = 5.0
"""Seconds an attach waits for a turn this replica claimed to start, before it
reads the turn from the stores instead."""

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class TurnStatus:
    """The answer to ``GET /chat/stream/status``."""

    message_id: str
    status: str  # running | done | errored | cancelled | dead
    epoch: int
    heartbeat_at: datetime | None
    queue: list[Waiting] = field(default_factory=list)
    """The turns waiting after this one, in the order they will run."""


_VERDICTS = {
    ChatStreamStatus.DONE: "done",
    ChatStreamStatus.ERRORED: "errored",
    ChatStreamStatus.CANCELLED: "cancelled",
}


class ChatHandler:
    def __init__(
        self,
        registries: AgentRegistriesFactory,
        stores: TurnStores,
        settings: TetherSettings,
        bus: MessageBus,
        clock: Clock = utc_now,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: TetherMetrics | None = None,
    ) -> None:
        self.registries = registries
        self.stores = stores
        self.settings = settings
        self.bus = bus
        self.clock = clock
        self.monotonic = monotonic
        """The elapsed-time clock of its followers, its delta windows and its
        takeover back-off: the simulator's virtual time, so that how long a
        real step took under load never changes a seeded history."""
        self.dead_after = timedelta(seconds=settings.dead_after)
        self.draining = False
        self._turns: dict[str, Turn] = {}
        self._starts: dict[str, asyncio.Future[None]] = {}
        """Turns this replica has claimed and is starting, not yet in ``_turns``:
        done once they are (or failed to start)."""
        self._background: set[asyncio.Task[object]] = set()
        self.metrics = metrics if metrics is not None else TetherMetrics()
        """Its own registry; the simulator's replicas share one (their dozens
        of metrics took a sixth of a history to build, and nobody reads them)."""
        self.tracing: Tracing = NO_TRACING
        """Where its turns' spans go (``setup_app`` sets it from the environment)."""
        self.heartbeats = (
            HeartbeatBatcher(
                stores.supervision,
                interval=settings.heartbeat_interval,
                dead_after=self.dead_after,
                clock=clock,
                on_batch=self.metrics.heartbeat_observer(stores.supervision),
            )
            if stores.supervision is not None
            else None
        )
        self.flusher = (
            RecordingFlusher(
                stores.recording,
                retry_interval=settings.recording_flush_interval,
                on_batch=self.metrics.store_operation_seconds.labels(
                    "recording", backend_name(stores.recording), "put_many"
                ).observe,
            )
            if stores.recording is not None
            else None
        )
        self.queue = TurnQueue(self)
        self.limits = TurnLimits(
            per_requester=settings.max_turns_per_requester,
            per_tenant=settings.max_turns_per_tenant,
            retry_after=settings.limit_retry_after,
        )
        self.presence = ReplicaPresence(
            _presence_lock(stores.supervision) if settings.presence else None
        )
        self.takeovers = AutomaticTakeover(
            self,
            interval=settings.takeover_scan_interval,
            limit=settings.takeover_limit,
            resume=settings.takeover,
            # Half a renewal interval: a killed producer's rows are listed
            # within half an interval of its last heartbeat, a live one's about
            # half the time (one lock test per scan for it, whatever its turns).
            suspect_after=timedelta(seconds=settings.heartbeat_interval / 2),
            monotonic=monotonic,
        )
        self.deltas = (
            DeltaPublisher(stores.recording, window=settings.delta_window, clock=monotonic)
            if stores.recording is not None and has_deltas(stores.recording)
            else None
        )

    # ------------------------------------------------------------ starting

    async def start_turn(
        self,
        request: ChatRequest,
        *,
        resume_message_id: str | None = None,
        automatic: bool = False,
        dequeue: str | None = None,
    ) -> Turn:
        """Claim and start a turn: a new one, the resume of a dead one
        (``resume_message_id``; ``automatic`` when this replica's takeover
        loop resumes it with no client), or the queued turn ``dequeue``
        (``handlers.queue``: its id is the one its client was given). A new
        one over the requester's or the tenant's limit is refused first
        (``handlers.limits``); every turn counts until its task ends."""
        slot = self.limits.take(
            request.tenant,
            normalize_owner(request.request_headers.requester_uuid),
            enforce=resume_message_id is None and dequeue is None,
        )
        try:
            turn = await self._start_turn(
                request, resume_message_id=resume_message_id, automatic=automatic, dequeue=dequeue
            )
        except BaseException:
            slot.release()
            raise
        assert turn.task is not None
        turn.task.add_done_callback(lambda _: slot.release())
        return turn

    async def _start_turn(
        self,
        request: ChatRequest,
        *,
        resume_message_id: str | None,
        automatic: bool,
        dequeue: str | None,
    ) -> Turn:
        resuming = resume_message_id is not None
        setup = await self.check_request(request, resuming=resuming)
        message_id = resume_message_id or dequeue or uuid.uuid4().hex
        requester = normalize_owner(request.request_headers.requester_uuid)
        context = TurnContext(
            tenant=request.tenant,
            requester_uuid=requester,
            session_id=request.session_id,
            message_id=message_id,
            agent_identifier=request.agent_identifier,
            stateful=request.stateful,
            resuming=resuming,
        )
        key = self._key(context.tenant, requester, context.session_id or "")
        if request.stateful:
            await self._check_writer(request.tenant, requester, request.session_id or "")
        displacing = not resuming and request.multitask_strategy in ("interrupt", "rollback")
        interrupted: str | None = None
        if not request.stateful:
            lease = None
        elif displacing:
            lease, interrupted = await self._displace(context, request.multitask_strategy)
        else:
            # The seed's strategy may take a conversation whose turn died (ended
            # first); a queued turn's start and ``enqueue`` wait for it instead.
            ends_dead = not resuming and request.multitask_strategy == "reject" and dequeue is None
            # A queued turn checks that it still waits once the transcript is
            # fenced at its epoch and before it takes the row: a cancel that
            # took it out of the queue first leaves the row untouched.
            still_waiting = (
                functools.partial(self.queue.check_still_waiting, key, dequeue)
                if dequeue is not None
                else None
            )
            lease = await self._claim(
                context, automatic=automatic, end_dead=ends_dead, before_grant=still_waiting
            )
        # From the claim on the row names this turn, so an attach here finds it
        # there before it runs (its user message and marker still to write):
        # it waits for the start (``attach``) rather than read it from the stores.
        starting = self._starts[message_id] = asyncio.get_running_loop().create_future()
        asking = False
        try:
            if interrupted is not None and request.multitask_strategy == "rollback":
                assert lease is not None
                await self._roll_back(context, interrupted, lease.epoch)
            first_index, recorded = await self._recorded(context, lease) if resuming else (0, None)
            turn = Turn(
                request=request,
                setup=setup,
                context=context,
                registries=self.registries,
                stores=self.stores,
                settings=self.settings,
                bus=self.bus,
                clock=self.clock,
                lease=lease,
                buffer=ChatStreamBuffer(first_index),
                heartbeats=self.heartbeats,
                flusher=self.flusher,
                deltas=self.deltas,
                recorded=recorded,
                metrics=self.metrics,
                tracing=self.tracing,
                next_queued=self.queue.head if request.stateful and self.queue.supported else None,
            )
            turn.hold_lease()
            if request.stateful and not resuming:
                asking = True
                try:
                    await turn.record_user_message()
                except ConversationNotOwnedError as error:
                    raise NotOwnerError("only the owner can add to this conversation") from error
                if dequeue is not None and lease is not None:
                    if not await self.queue.remove(key, dequeue, lease.epoch):
                        raise FencedError(message_id)  # a newer epoch (a cancel) holds it
                await turn.mark()
            self._turns[message_id] = turn
        except BaseException as error:
            if lease is not None:
                if self.heartbeats is not None:
                    self.heartbeats.discard(lease)
                # Given back only while nothing of the turn may be recorded,
                # and only if still ours. Once its question may be in the
                # transcript it needs a verdict: its row reads dead and the
                # reaper (or a resume) gives one; a newer epoch's holder (a
                # cancel) gives its own.
                if not (resuming or asking or isinstance(error, FencedError)):
                    with contextlib.suppress(Exception):
                        await lease.delete_row()
            raise
        finally:
            if self._starts.get(message_id) is starting:
                del self._starts[message_id]
            starting.set_result(None)
        self.metrics.turn_started(lease.takeover if lease is not None else None)
        task = turn.start()
        task.add_done_callback(lambda _: self._after_turn(turn))
        return turn

    async def check_request(self, request: ChatRequest, *, resuming: bool = False) -> AgentSetup:
        """Everything about a turn's request that can be refused before any
        claim (draining, the agent, the stores it needs, its last message);
        its agent's setup. A queued turn is checked so before it is queued."""
        if self.draining:
            raise DrainingError("this replica is shutting down; retry on another")
        setup = await self._checked_setup(request)
        if request.stateful:
            if not request.session_id:
                raise TurnRequestError("a stateful turn needs a session_id")
            if self.stores.agent_state is None:
                raise StorageNotConfiguredError(
                    "stateful turns need an agent state store; this server has none"
                )
        elif resuming:
            raise TurnRequestError("resume needs stateful=true and a session_id")
        if resuming and self.stores.supervision is None:
            raise StorageNotConfiguredError(
                "resume needs a supervision store to tell a dead producer from a live one"
            )
        if not resuming and (
            not request.conversation
            or request.conversation[-1].sender is not ChatMessageSender.USER
        ):
            raise TurnRequestError("the conversation must end with the user's new message")
        return setup

    async def _checked_setup(self, request: ChatRequest) -> AgentSetup:
        """The request's agent setup; 404 for an unknown agent, 400 for bot
        params it refuses."""
        setup = await self.registries.get_setup(request.agent_identifier)
        if setup is None:
            raise UnknownAgentError(f"no agent is set up as {request.agent_identifier!r}")
        try:
            self.registries.check_bot_params(setup, request.bot_params)
        except BotParamsRejectedError as error:
            raise BotParamsError(str(error)) from error
        return setup

    def _key(self, tenant: str, requester_uuid: str | None, session_id: str) -> ConversationKey:
        return ConversationKey(tenant, normalize_owner(requester_uuid), session_id)

    def conversation_key(self, request: ChatRequest) -> ConversationKey:
        """The key of the conversation a stateful request writes to."""
        return self._key(
            request.tenant, request.request_headers.requester_uuid, request.session_id or ""
        )

    async def check_writer(self, key: ConversationKey) -> None:
        await self._check_writer(key.tenant, key.requester_uuid, key.session_id)

    async def grant(self, key: ConversationKey, message_id: str) -> Lease:
        """Claim the conversation's next epoch for a new turn ``message_id``."""
        return await self._grant(key, message_id, takeover_of=None)

    async def _reader_key(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ConversationKey:
        """The key of the stream rows a reader may see: their own, or, for a
        conversation shared with them, its owner's. A private conversation of
        someone else is a 403, whatever the reader guesses."""
        key = self._key(tenant, requester_uuid, session_id)
        store = self.stores.conversation
        if store is None:
            return key
        try:
            summary = await store.get_conversation(tenant, key.requester_uuid, session_id)
        except NotImplementedError:
            return key
        except ConversationNotOwnedError as error:
            raise NotOwnerError("this conversation is private to its owner") from error
        if summary is None or summary.owner_uuid == key.requester_uuid:
            return key
        return ConversationKey(tenant, summary.owner_uuid, session_id)

    async def _settled(
        self,
        events: AsyncIterator[StreamEvent | StreamEnd],
        key: ConversationKey,
        message_id: str,
        start_index: int,
    ) -> AsyncIterator[StreamEvent | StreamEnd]:
        """A follower's events, its ``gone`` settled by the transcript.

        The follower hears ``gone`` once the row names another turn: the next
        queued one, to which this turn handed the conversation at its end
        (``Lease.pass_on``), or an interrupt's, which claimed it right after
        its cancel. Then the turn's answer, and how it ended, are in the
        transcript (``handlers.turn_ends``): the reader gets that answer, if
        it was not the last message it was sent, and that verdict. So does a
        follower whose turn's row was cleaned up meanwhile. Without an answer
        there (a rolled-back turn, one cancelled before anything of it was
        recorded) it stays ``gone``."""
        last: StreamEvent | None = None
        async for item in events:
            if isinstance(item, StreamEvent):
                last = item
            elif item.reason == "gone":
                recorded = await self.answer_in_transcript(key, message_id)
                if recorded is not None:
                    answer, item = recorded, ending_of(recorded)
                    if last is None or not shows_the_same(last.message, answer):
                        index = last.index + 1 if last is not None else start_index
                        yield StreamEvent(index, answer)
            yield item

    async def answer_in_transcript(
        self, key: ConversationKey, message_id: str
    ) -> ChatMessage | None:
        """Turn ``message_id``'s answer as the transcript holds it, if it does."""
        store = self.stores.conversation
        if store is None:
            return None
        transcript = await store.get_transcript(key.tenant, key.requester_uuid, key.session_id)
        return next(
            (
                m
                for m in transcript
                if m.message_id == message_id and m.sender is ChatMessageSender.BOT
            ),
            None,
        )

    async def _check_writer(self, tenant: str, requester_uuid: str, session_id: str) -> None:
        """Writes (a turn, a resume, a cancel) are the owner's alone, shared or not.

        Stream rows are keyed by requester, so without this another user's
        resume or cancel would only miss the owner's rows and answer 410 or 404
        instead of saying plainly that the conversation is not theirs."""
        store = self.stores.conversation
        if store is None:
            return
        try:
            summary = await store.get_conversation(tenant, requester_uuid, session_id)
        except NotImplementedError:
            return
        except ConversationNotOwnedError as error:
            raise NotOwnerError("only the owner can write to this conversation") from error
        if summary is not None and summary.owner_uuid != requester_uuid:
            raise NotOwnerError("only the owner can write to this conversation")

    async def _claim(
        self,
        context: TurnContext,
        *,
        automatic: bool,
        end_dead: bool = False,
        before_grant: BeforeGrant | None = None,
    ) -> Lease | None:
        """The lease of a new turn, or of a resume (``context.resuming``); 409
        naming the occupant when the conversation is not free. A turn whose
        producer died occupies it until it is resumed or ended: with
        ``end_dead`` (the seed's strategy) it is ended first, with what it
        had recorded and a verdict, and the claim made again."""
        store = self.stores.supervision
        if store is None:
            return None
        key = self._key(context.tenant, context.requester_uuid, context.session_id or "")
        takeover = context.message_id if context.resuming else None
        if takeover is not None:
            await self._check_resumable(key, takeover)
        try:
            return await self._grant(
                key,
                context.message_id,
                takeover_of=takeover,
                automatic=automatic,
                before_grant=before_grant,
            )
        except ClaimRefusedError as refused:
            # Never for a resume: the occupant may be its own turn, resumed
            # elsewhere a moment ago.
            ending = end_dead and takeover is None
            if not (ending and await self._end_displaced(key, refused.occupant)):
                raise _refusal(key, refused) from refused
        try:
            return await self._grant(
                key, context.message_id, takeover_of=None, before_grant=before_grant
            )
        except ClaimRefusedError as refused:
            raise _refusal(key, refused) from refused

    async def _end_displaced(
        self, key: ConversationKey, occupant: ChatStreamSupervision | None
    ) -> bool:
        """End the dead turn a new message is about to displace (or one whose
        cancel or reaping died half way), so its answer and verdict stay in
        the transcript; whether the claim may be tried again. Not a queued
        turn the row was passed on to: it runs first."""
        if occupant is None:
            return False
        state = rows.state_of(occupant, self.clock(), self.dead_after, self.presence.gone)
        stuck = state is RowState.ENDING and rows.is_stuck(occupant, self.clock(), self.dead_after)
        if not (state is RowState.DEAD or stuck):
            return False
        if await self.queue.is_waiting(key, occupant.message_id):
            return False
        await self.end_dead_turn(
            key,
            occupant.message_id,
            PRODUCER_LOST,
            "the turn's producer died and a new message took the conversation",
        )
        return True  # ended, by us or by another hand meanwhile: claim again

    async def _displace(
        self, context: TurnContext, strategy: MultitaskStrategy
    ) -> tuple[Lease | None, str | None]:
        """Claim the conversation for a new turn, cancelling whatever turn
        occupies it (``interrupt``, ``rollback``): the cancel of any replica,
        so the occupant's partial answer is kept and its producer, wherever it
        runs, is fenced. Returns the lease and the interrupted turn's id."""
        if strategy == "rollback" and not self._can_roll_back():
            raise NotImplementedByStoreError(
                "rollback needs a conversation store that can remove messages "
                "(remove_fenced); this server's cannot: use interrupt"
            )
        interrupted: str | None = None
        for _ in range(_DISPLACE_TRIES):
            try:
                return await self._claim(context, automatic=False), interrupted
            except ConversationBusyError as busy:
                occupant = busy.message_id
            try:
                await self.cancel(
                    context.tenant, context.requester_uuid, context.session_id, occupant, kick=False
                )
                interrupted = occupant
            except (TurnEndedError, TurnNotFoundError, ConversationBusyError):
                pass  # it ended, or changed hands, meanwhile: claim again
        raise ConversationBusyError(
            "the conversation stayed busy: other turns kept taking it; try again",
            message_id=occupant,
            session_id=context.session_id,
        )

    def _can_roll_back(self) -> bool:
        store = self.stores.conversation
        return store is None or (
            type(store).remove_fenced is not ChatConversationStore.remove_fenced
        )

    async def _roll_back(self, context: TurnContext, interrupted: str, epoch: int) -> None:
        """Remove the interrupted turn's user message and partial answer from the
        transcript, fenced at the new turn's epoch (before its own user message)."""
        store = self.stores.conversation
        if store is None:
            return  # no transcript here: the client's is the only one
        # And its queued copy, should a start fenced half way have left one:
        # alone, it would read as waiting again and the turn would run.
        ids = [interrupted, f"{interrupted}-user", queued_id(interrupted)]
        key = self._key(context.tenant, context.requester_uuid, context.session_id or "")
        if not await store.remove_fenced(
            key.tenant, key.requester_uuid, key.session_id, ids, epoch=epoch
        ):
            raise ConversationBusyError(
                "the conversation changed hands during the rollback; try again",
                message_id=context.message_id,
                session_id=key.session_id,
            )

    async def _grant(
        self,
        key: ConversationKey,
        message_id: str,
        *,
        takeover_of: str | None,
        automatic: bool = False,
        before_grant: BeforeGrant | None = None,
    ) -> Lease:
        """Claim the conversation's next epoch for ``message_id``, every other
        store fenced at it first (``ClaimRefusedError`` when it is not free)."""
        assert self.stores.supervision is not None
        return await claim(
            self.stores.supervision,
            key,
            message_id,
            self.clock,
            self.dead_after,
            raise_fences=functools.partial(raise_fences, self.stores, key),
            takeover_of=takeover_of,
            automatic=automatic,
            producer=lambda: self.presence.producer,
            gone=self.presence.gone,
            before_grant=before_grant,
        )

    def _producer_changed(self, producer: str | None) -> None:
        """This replica's presence id changed (its lock was lost and held again):
        its leases read it at each write, so they name the new one from their
        next write on; this only counts it."""
        self.metrics.presence_changes.inc()

    async def _check_resumable(self, key: ConversationKey, message_id: str) -> None:
        """Resume takes over only a dead turn: live is 409, finished or replaced is 410."""
        assert self.stores.supervision is not None
        row = await self.stores.supervision.read(key.tenant, key.requester_uuid, key.session_id)
        if row is None or row.message_id != message_id:
            raise TurnEndedError(f"turn {message_id} is finished or was replaced by a newer turn")
        if row.status is not ChatStreamStatus.RUNNING:
            raise TurnEndedError(f"turn {message_id} is {_VERDICTS[row.status]}; nothing to resume")
        if row.is_live(self.clock(), self.dead_after, self.presence.gone):
            raise ConversationBusyError(
                f"turn {message_id} is still running; attach to it instead",
                message_id=message_id,
                session_id=key.session_id,
            )

    async def _recorded(
        self, context: TurnContext, lease: Lease | None
    ) -> tuple[int, ChatMessage | None]:
        """Where a resumed turn's stream starts, and what its clients last saw.

        Each producer of a turn streams at most ``max_turn_events`` messages, so
        a resumed producer at epoch ``e`` starts at ``e * max_turn_events``:
        past anything any earlier producer can have streamed (their epochs are
        lower), and apart from any other resumer (each epoch has one claimant),
        so ids never repeat with different content, and an old ``start_index``
        or ``Last-Event-ID`` still works. The recorded message, read after the
        claim fenced the recording, is returned so the resumed stream starts
        from it rather than from the (older) checkpoint."""
        epoch = lease.epoch if lease is not None else 1
        first_index = epoch * self.settings.max_turn_events
        store = self.stores.recording
        if store is None:
            return first_index, None
        record = await store.read(context.tenant, context.requester_uuid, context.session_id or "")
        if record is None or record.message_id != context.message_id:
            return first_index, None
        return max(first_index, record.index + 1), record.message

    # ---------------------------------------------------- after and cleanup

    def _after_turn(self, turn: Turn) -> None:
        lost = turn.lease is not None and turn.lease.lost
        self.metrics.turn_ended(turn.buffer.end, lease_lost=lost)
        self._in_background(self._clean_up_later(turn))
        end = turn.buffer.end
        if turn.passed_to is not None and turn.lease is not None:
            # It handed the conversation to the next queued turn: start that here now.
            hand_off = self.queue.start_passed_on(turn.key, turn.passed_to, turn.lease.row_epoch)
            self._in_background(hand_off)
        elif turn.lease is not None and not lost and end is not None and end.reason != "dead":
            # The conversation is free: its next queued turn starts now. (A
            # turn this replica lost or handed off is ended by another hand,
            # which kicks the queue itself.)
            self._in_background(self.queue.kick(turn.key))

    def _in_background(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[object]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("background work failed", exc_info=task.exception())

    async def _clean_up_later(self, turn: Turn) -> None:
        """Keep a finished turn attachable for the grace period, then remove its
        rows (guarded: a newer turn's rows are left alone) and forget it.
        Only a turn that wrote its own verdict removes them: one stopped for a
        cancel leaves them to the canceller, whose verdict is still to come."""
        await asyncio.sleep(self.settings.finished_turn_grace)
        self._turns.pop(turn.message_id, None)
        if turn.lease is None or turn.lease.lost:
            return
        if turn.lifecycle.state not in (TurnState.DONE, TurnState.ERRORED):
            return
        ctx = turn.context
        with contextlib.suppress(Exception):
            if self.stores.recording is not None:
                await self.stores.recording.delete(
                    ctx.tenant, ctx.requester_uuid, ctx.session_id or "", turn.message_id
                )
            await turn.lease.delete_row()

    async def clean_ups_done(self) -> None:
        """Wait until every clean-up scheduled so far has run (after a grace
        period of 0, the rows of finished turns are then gone)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def local_turn(self, message_id: str) -> Turn | None:
        return self._turns.get(message_id)

    def running_turn_of(self, key: ConversationKey) -> str | None:
        """The message id of a turn this replica is producing for ``key``, if any."""
        for turn in self._turns.values():
            if turn.key == key and turn.buffer.end is None:
                return turn.message_id
        return None

    async def attach(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str | None,
        message_id: str,
        start_index: int,
    ) -> tuple[AsyncIterator[StreamEvent | StreamEnd], bool]:
        """The turn's events from ``start_index``: from the live buffer when this
        replica produces it, else by following the recording from the stores.
        The flag says whether the source is the live buffer."""
        requester = normalize_owner(requester_uuid)
        starting = self._starts.get(message_id)
        if starting is not None:
            # Claimed here a moment ago: follow it from its live buffer once it
            # runs (from the stores, should its start fail or take long).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(starting), _STARTING_WAIT)
        local = self._turns.get(message_id)
        if local is not None and local.lease is not None and local.lease.lost:
            # This replica lost the turn (a takeover, a cancel, a drain): its buffer
            # is a stale copy. Follow the stores, where the current owner writes.
            local = None
        if (
            local is not None
            and local.lease is not None
            and local.buffer.end is not None
            and self.stores.supervision is not None
        ):
            # A stateful turn over here: served from memory only while its row
            # still names it. Once the row is gone (an erase, or the clean-up)
            # or names the next turn, the transcript is the one answer there is.
            k = local.key
            row = await self.stores.supervision.read(k.tenant, k.requester_uuid, k.session_id)
            if row is None or row.message_id != message_id:
                local = None
        # The local buffer serves only the turn of the key the reader names: its
        # own turn (of the session given, if any), or below, a shared one's.
        if (
            local is not None
            and (local.context.tenant, local.context.requester_uuid) == (tenant, requester)
            and (not session_id or local.context.session_id in (None, session_id))
        ):
            return self.metrics.lagged(local.buffer.follow(start_index)), True
        recording, supervision = self.stores.recording, self.stores.supervision
        if not session_id or recording is None or supervision is None:
            raise TurnNotFoundError(
                f"turn {message_id} is not running on this server"
                + ("" if session_id else "; pass its session_id to follow it from another")
            )
        key = await self._reader_key(tenant, requester, session_id)
        if local is not None and local.key == key:
            return self.metrics.lagged(local.buffer.follow(start_index)), True
        row = await supervision.read(key.tenant, key.requester_uuid, key.session_id)
        if row is None or row.message_id != message_id:
            if await self.queue.is_waiting(key, message_id):
                # Queued: stream it once it starts, wherever it does.
                async def later(start: int) -> AsyncIterator[StreamEvent | StreamEnd]:
                    events, _ = await self.attach(tenant, requester, session_id, message_id, start)
                    return events

                return self.queue.follow_when_started(key, message_id, later, start_index), False
            answer = await self.answer_in_transcript(key, message_id)
            if answer is None:
                raise TurnEndedError(
                    f"turn {message_id} is finished and cleaned up, or never existed"
                )
            # Over, its row cleaned up or naming the next turn: its answer
            # says how it ended (``handlers.turn_ends``).
            return _told(StreamEvent(start_index, answer), ending_of(answer)), False

        def live_here(epoch: int, start: int) -> AsyncIterator[StreamEvent | StreamEnd] | None:
            """The turn's live buffer, once this replica produces it at ``epoch``."""
            turn = self._turns.get(message_id)
            if turn is None or turn.lease is None or turn.lease.lost:
                return None
            if (turn.key, turn.lease.epoch) != (key, epoch):
                return None
            return self.metrics.lagged(turn.buffer.follow(start))

        follower = RecordingFollower(
            recording,
            supervision,
            key,
            message_id,
            clock=self.clock,
            dead_after=self.dead_after,
            poll_interval=(
                self.settings.follower_push_fallback_interval
                if has_push(recording)
                else self.settings.follower_poll_interval
            ),
            await_takeover=self.settings.dead_after if self.takeovers.running else 0.0,
            live_here=live_here,
            monotonic=self.monotonic,
        )
        return self._settled(follower.follow(start_index), key, message_id, start_index), False

    # --------------------------------------------------- status and cancel

    async def status(self, tenant: str, requester_uuid: str | None, session_id: str) -> TurnStatus:
        store = self.stores.supervision
        if store is not None:
            key = await self._reader_key(tenant, requester_uuid, session_id)
            row = await store.read(key.tenant, key.requester_uuid, key.session_id)
            waiting = await self.queue.waiting(key)
            if waiting and (
                row is None or row.status is not ChatStreamStatus.RUNNING or self.reads_dead(row)
            ):
                # Idle (or its row dead: a hand-off to the next queued turn
                # whose replica died) with turns waiting: start the next one
                # now, and say so.
                if await self.queue.kick(key) is not None or row is None:
                    row = await store.read(key.tenant, key.requester_uuid, key.session_id)
                    waiting = await self.queue.waiting(key)
            if row is None:
                # No turn, or an erased conversation: a turn this replica still
                # remembers must not be told of after its row is gone.
                raise TurnNotFoundError(f"no turn is known for conversation {session_id!r}")
            return TurnStatus(
                row.message_id, self._verdict(row), row.epoch, row.heartbeat_at, waiting
            )
        # Without a supervision store only this replica's own turns can be known.
        for turn in reversed(list(self._turns.values())):
            ctx = turn.context
            if (ctx.tenant, ctx.requester_uuid, ctx.session_id) == (
                tenant,
                normalize_owner(requester_uuid),
                session_id,
            ):
                end = turn.buffer.end
                return TurnStatus(turn.message_id, end.reason if end else "running", 0, None)
        raise TurnNotFoundError(f"no turn is known for conversation {session_id!r}")

    def _verdict(self, row: ChatStreamSupervision) -> str:
        if row.status is ChatStreamStatus.RUNNING:
            return "dead" if self.reads_dead(row) else "running"
        return _VERDICTS[row.status]

    def reads_dead(self, row: ChatStreamSupervision) -> bool:
        """Whether ``row`` reads dead here now: by its heartbeat's age, or its
        producer's free presence lock."""
        return row.is_dead(self.clock(), self.dead_after, self.presence.gone)

    async def cancel(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str | None,
        message_id: str,
        *,
        kick: bool = True,
    ) -> None:
        """Cancel a turn, running or queued, from any replica; once this
        returns the turn never produces again (``handlers.cancel``). Then the
        conversation's next queued turn starts (unless ``kick`` is False: an
        interrupt's own turn goes first)."""
        local = self._turns.get(message_id)
        store = self.stores.supervision
        if store is None or (local is not None and local.lease is None):
            # A stateless turn has no conversation to check: only its own
            # requester may stop it, and to anyone else it does not exist.
            if local is None or (local.context.tenant, local.context.requester_uuid) != (
                tenant,
                normalize_owner(requester_uuid),
            ):
                raise TurnNotFoundError(f"turn {message_id} is not running on this server")
            if session_id and local.context.session_id != session_id:
                # Bound to the full key: the turn of another conversation is not this one.
                raise TurnNotFoundError(f"turn {message_id} is not a turn of {session_id!r}")
            if local.buffer.end is not None:
                raise TurnEndedError(f"turn {message_id} already ended ({local.buffer.end.reason})")
            local.stop(StreamEnd("cancelled"))
            return
        if not session_id:
            session_id = await self._session_of(tenant, requester_uuid, message_id)
        await self._check_writer(tenant, normalize_owner(requester_uuid), session_id)
        key = self._key(tenant, requester_uuid, session_id)
        await cancel_turn(self, key, message_id, local)
        if kick:
            self._in_background(self.queue.kick(key))

    async def _session_of(self, tenant: str, requester_uuid: str | None, message_id: str) -> str:
        """The conversation of the requester's turn ``message_id``, for a cancel
        that names only the turn (the seed's SDK clients): found in the
        supervision store, so on any replica, and only among the requester's own."""
        assert self.stores.supervision is not None
        requester = normalize_owner(requester_uuid)
        try:
            found = await self.stores.supervision.find_by_message_id(tenant, requester, message_id)
        except NotImplementedError:
            raise TurnRequestError(
                "cancelling a stateful turn needs its session_id (this server's "
                "supervision store cannot find a turn by its message_id)"
            ) from None
        if found is None:
            raise TurnNotFoundError(f"turn {message_id} is not running")
        return found

    async def end_dead_turn(
        self, key: ConversationKey, message_id: str, code: str, reason: str
    ) -> bool:
        """End a dead turn that will not be resumed (the reaper, the takeover
        limit, a new message over it), or one whose ending stopped half way:
        the row taken at the next epoch (``ENDING``, so no cancel ends it
        too), then ``errored``, with what it recorded kept as its answer;
        ``cancelled``, with nothing written to the transcript, when its
        question was never recorded (a queued turn taken out of the queue
        after the row was passed on to it). Whether this replica ended it:
        False when the turn is no longer dead or another replica was first."""
        store = self.stores.supervision
        assert store is not None
        row = await store.read(key.tenant, key.requester_uuid, key.session_id)
        if row is None or row.message_id != message_id:
            return False
        state = rows.state_of(row, self.clock(), self.dead_after, self.presence.gone)
        if not (state is RowState.DEAD or rows.is_stuck(row, self.clock(), self.dead_after)):
            return False  # live, finished, or another hand ends it now
        try:
            lease = await take(
                store,
                key,
                rows.Reading(row, row.epoch),
                message_id,
                self.clock,
                functools.partial(raise_fences, self.stores, key),
                lambda: rows.REAPER,
            )
        except ClaimRefusedError:
            return False
        asked = await self.asked(key, message_id)
        written = await self.written_verdict(key, message_id)
        if written is not None:
            # An ender before us (a cancel, the reaper, the producer's own
            # seal) wrote the verdict and died before the row said it: the
            # row now says the same, so every reader hears one ending.
            status, reaped = written, False
        elif rows.is_cancelling(row):
            # A cancel that died half way: its intent stands, and it is the
            # verdict the cancel's own retry would write.
            status, reaped = ChatStreamStatus.CANCELLED, False
            if not await self.keep_partial_answer(key, message_id, lease.epoch):
                return False  # a newer epoch took the conversation meanwhile
        elif asked:
            status, reaped = ChatStreamStatus.ERRORED, True
            logger.warning("turn %s: ended errored (%s): %s", message_id, code, reason)
            kept = await self.keep_partial_answer(
                key, message_id, lease.epoch, status="errored", error=(code, reason)
            )
            if not kept:
                return False  # a newer epoch took the conversation meanwhile
        else:
            status, reaped = ChatStreamStatus.CANCELLED, False
        try:
            await lease.finish(status)
        except FencedError:
            return False
        if reaped:
            self.metrics.turns_reaped.labels(code).inc()
        self.forget_later(key, message_id, lease.row_epoch)
        self._in_background(self.queue.kick(key))
        return True

    async def erase(self, tenant: str, requester_uuid: str | None, session_id: str) -> bool:
        """Erase the conversation and everything it owns (``handlers.erase``);
        whether a transcript existed. The owner's DELETE, and the takeover
        scan finishing an erase whose replica died half way."""
        return await erase_conversation(
            self.stores,
            tenant,
            requester_uuid,
            session_id,
            clock=self.clock,
            dead_after=self.dead_after,
            running_locally=self.running_turn_of,
            producer=lambda: self.presence.producer,
            end_dead=self.end_erased_turn,
        )

    async def end_erased_turn(self, key: ConversationKey, message_id: str) -> bool:
        """``end_dead_turn`` for a dead turn whose conversation is being erased."""
        return await self.end_dead_turn(
            key,
            message_id,
            PRODUCER_LOST,
            "the turn's producer died and its conversation was erased",
        )

    async def asked(self, key: ConversationKey, message_id: str) -> bool:
        """Whether turn ``message_id``'s user message is in the transcript (a
        turn records it right after its claim): only then may its verdict
        write an answer there. True without a conversation store."""
        store = self.stores.conversation
        if store is None:
            return True
        transcript = await store.get_transcript(key.tenant, key.requester_uuid, key.session_id)
        return any(m.message_id == f"{message_id}-user" for m in transcript)

    async def written_verdict(
        self, key: ConversationKey, message_id: str
    ) -> ChatStreamStatus | None:
        """The verdict already in the transcript for turn ``message_id`` (its
        answer, marked with how it ended: ``turn_ends``), or None. Read by a
        hand that has just taken the row of a turn whose ending stopped half
        way: the row then says what the transcript says."""
        answer = await self.answer_in_transcript(key, message_id)
        return ChatStreamStatus(ending_of(answer).reason) if answer is not None else None

    async def keep_partial_answer(
        self,
        key: ConversationKey,
        message_id: str,
        epoch: int,
        *,
        status: LastTurnStatus = "cancelled",
        error: tuple[str, str] | None = None,
    ) -> bool:
        """Write a turn's verdict, given by another hand than its producer's (a
        cancel, the reaper), into its transcript at that verdict's epoch: the
        newest recorded message (read after the fence, so nothing a fenced
        producer writes later can be newer than it) as its answer, marked
        with the way it ended (``handlers.turn_ends``: a cancel, or an
        ``error`` (code, message)), so the transcript says why the answer
        stops where it does. Nothing is written for a turn whose question was
        never recorded: an answer there would follow no question.

        Fenced and idempotent by ``message_id``: if the producer sealed its whole
        answer before the fence, that answer stays the one bot message.
        Whether the store took it (False: a newer epoch holds the conversation)."""
        conversations = self.stores.conversation
        if conversations is None or not await self.asked(key, message_id):
            return True
        partial: ChatMessage | None = None
        if self.stores.recording is not None:
            record = await self.stores.recording.read(
                key.tenant, key.requester_uuid, key.session_id
            )
            if record is not None and record.message_id == message_id:
                partial = record.message
        # With its tool calls closed and its end marked (``turn_ends``).
        partial = kept_answer(
            partial, status, session_id=key.session_id, message_id=message_id, error=error
        )
        return await conversations.append_fenced(
            key.tenant,
            key.requester_uuid,
            key.session_id,
            await self._stored_agent(key),
            [partial] if partial is not None else [],
            epoch=epoch,
            last_turn_status=status,
            create_if_absent=False,
        )

    async def _stored_agent(self, key: ConversationKey) -> str:
        """The conversation's agent as stored: appending names it again, and a
        verdict written by another replica (a cancel, the reaper) repeats it."""
        assert self.stores.conversation is not None
        with contextlib.suppress(NotImplementedError):
            summary = await self.stores.conversation.get_conversation(
                key.tenant, key.requester_uuid, key.session_id
            )
            return summary.agent_identifier if summary is not None else ""
        return ""

    def forget_later(self, key: ConversationKey, message_id: str, epoch: int) -> None:
        async def forget() -> None:
            await asyncio.sleep(self.settings.finished_turn_grace)
            with contextlib.suppress(Exception):
                if self.stores.recording is not None:
                    await self.stores.recording.delete(
                        key.tenant, key.requester_uuid, key.session_id, message_id
                    )
                if self.stores.supervision is not None:
                    await rows.delete(self.stores.supervision, key, message_id, epoch)

        self._in_background(forget())

    # ------------------------------------------------------------ shutdown

    async def drain(self) -> list[str]:
        """Graceful drain (SIGTERM): take no new turns, let running ones finish
        within ``drain_grace``, then hand the rest off so they read as dead at
        once and a client (or another replica) resumes them elsewhere.

        Over within ``drain_timeout`` whatever the agents do: a turn whose
        agent has not stopped shortly before then (it swallowed its
        cancellation) is handed off without it. Returns the message ids of the
        turns whose tasks are still running (such a task keeps the process
        from exiting by itself)."""
        self.draining = True
        loop = asyncio.get_running_loop()
        timeout = self.settings.drain_timeout
        deadline = loop.time() + timeout
        running = self._running_turns()
        if running:
            await asyncio.wait(
                [t.task for t in running if t.task is not None],
                timeout=min(self.settings.drain_grace, timeout),
            )
        stopping = self._running_turns()
        if not stopping:
            return []
        handing_off = [asyncio.create_task(turn.hand_off()) for turn in stopping]
        # The last moment of the timeout is for the turns that would not stop.
        reserve = min(FORCED_HAND_OFF_SECONDS, timeout / 4)
        await asyncio.wait(handing_off, timeout=max(0.0, deadline - reserve - loop.time()))
        stuck = [turn for turn in stopping if turn.task is not None and not turn.task.done()]
        if stuck:
            logger.error(
                "draining: %d turn(s) did not stop when cancelled; handing them off "
                "without their agents: %s",
                len(stuck),
                ", ".join(turn.message_id for turn in stuck),
            )
            forced = [asyncio.create_task(turn.hand_off_now()) for turn in stuck]
            _, late = await asyncio.wait(forced, timeout=max(0.0, deadline - loop.time()))
            for task in late:
                task.cancel()  # a store that hangs: not waited for
            for turn in stuck:
                turn.buffer.close(StreamEnd("dead"))  # readers resume elsewhere
        for task in handing_off:
            task.cancel()  # only waits on its turn's task
        return [turn.message_id for turn in self._running_turns()]

    def _running_turns(self) -> list[Turn]:
        return [t for t in self._turns.values() if t.task is not None and not t.task.done()]

    async def start(self) -> None:
        """Start the replica's own background work (the app's start-up): its
        presence lock, and the automatic takeover of dead turns."""
        await self.presence.start(
            keep_every=self.settings.heartbeat_interval, on_change=self._producer_changed
        )
        if self.presence.producer is not None:
            logger.info(
                "presence lock held: this replica's turns read dead the moment it dies "
                "(replica %s)",
                self.presence.replica_id,
            )
        if self.takeovers.start():
            logger.info(
                "every %s s this replica looks for dead turns: it %s",
                self.settings.takeover_scan_interval,
                "takes them over (automatic takeover is on)"
                if self.settings.takeover
                else "ends those nobody can resume, and leaves the rest to a client's resume "
                "(automatic takeover is off)",
            )

    async def shutdown(self) -> None:
        """Stop every local turn and background task (the process is exiting)."""
        await self.takeovers.aclose()
        tasks: list[asyncio.Task[Any]] = [*self._background]
        for turn in self._running_turns():
            assert turn.task is not None
            turn.stop(StreamEnd("dead"))
            tasks.append(turn.task)
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: an agent that swallows its cancellation is left behind.
            done, _ = await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    logger.warning("a task failed while stopping", exc_info=task.exception())
        if self.heartbeats is not None:
            await self.heartbeats.aclose()
        if self.flusher is not None:
            await self.flusher.aclose()
        if self.deltas is not None:
            await self.deltas.aclose()
        # Released last, once nothing of this replica writes: any turn it leaves
        # running then reads dead to the others at once, not after the threshold.
        await self.presence.aclose()


def _refusal(key: ConversationKey, refused: ClaimRefusedError) -> Exception:
    """What a refused claim answers: 409 naming the occupant, or 410 when a
    resume finds its turn gone."""
    occupant = refused.occupant
    if occupant is None:
        return TurnEndedError("the turn to resume no longer exists")
    return ConversationBusyError(
        f"the conversation is busy with turn {occupant.message_id}",
        message_id=occupant.message_id,
        session_id=key.session_id,
    )


async def _told(*items: StreamEvent | StreamEnd) -> AsyncIterator[StreamEvent | StreamEnd]:
    for item in items:
        yield item


def _presence_lock(store: ChatStreamSupervisionStore | None) -> PresenceLock | None:
    """The supervision store's presence lock, where its backend has one."""
    if store is None:
        return None
    try:
        return store.presence_lock()
    except NotImplementedError:
        return None
