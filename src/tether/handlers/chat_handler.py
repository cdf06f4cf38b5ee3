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
from datetime import UTC, datetime, timedelta
from typing import Any

from tether.domain.agent_registries import AgentRegistriesFactory, BotParamsRejectedError
from tether.domain.agent_setup import AgentSetup
from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import (
    ConversationNotOwnedError,
    normalize_owner,
)
from tether.domain.chat_message import (
    ChatMessageSender,
)
from tether.domain.chat_request import ChatRequest
from tether.domain.chat_stream_supervision_store import (
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    PresenceLock,
)
from tether.domain.message_bus import MessageBus
from tether.domain.turn_context import TurnContext
from tether.handlers.cancel import cancel_turn
from tether.handlers.claims import ConversationClaims
from tether.handlers.endings import TurnEndings
from tether.handlers.erase import erase_conversation
from tether.handlers.errors import (
    BotParamsError,
    DrainingError,
    NotOwnerError,
    StorageNotConfiguredError,
    TurnEndedError,
    TurnNotFoundError,
    TurnRequestError,
    UnknownAgentError,
)
from tether.handlers.limits import TurnLimits
from tether.handlers.queue import TurnQueue
from tether.handlers.reading import TurnReaders, TurnStatus
from tether.handlers.running_turns import RunningTurns
from tether.handlers.takeover import AutomaticTakeover
from tether.handlers.turn import Turn
from tether.metrics import TetherMetrics, backend_name
from tether.observability.traces import NO_TRACING, Tracing
from tether.runtime.delta_publisher import DeltaPublisher
from tether.runtime.follower import has_deltas
from tether.runtime.heartbeats import HeartbeatBatcher
from tether.runtime.lease import (
    ConversationKey,
    FencedError,
    Lease,
)
from tether.runtime.lifecycle import TurnState
from tether.runtime.live_buffer import ChatStreamBuffer, EndReason, StreamEnd, StreamEvent
from tether.runtime.presence import ReplicaPresence
from tether.runtime.recording_flusher import RecordingFlusher
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings

logger = logging.getLogger(__name__)

FORCED_HAND_OFF_SECONDS = 1.0
"""The end of the drain timeout kept for handing off turns whose agents would
not stop (at most a quarter of the timeout)."""
STOP_WAIT_SECONDS = 1.0
"""How long ``shutdown`` waits for the tasks it cancels."""
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


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
        self.running = RunningTurns()
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
        self.claims = ConversationClaims(self)
        self.readers = TurnReaders(self, self.running, takeover_running=self._takes_over)
        self.endings = TurnEndings(
            stores,
            clock=clock,
            dead_after=self.dead_after,
            presence=self.presence,
            metrics=self.metrics,
            grace=settings.finished_turn_grace,
            kick=lambda key: self._in_background(self.queue.kick(key)),
            in_background=self._in_background,
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
            lease, interrupted = await self.claims.displace(context, request.multitask_strategy)
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
            lease = await self.claims.claim(
                context, automatic=automatic, end_dead=ends_dead, before_grant=still_waiting
            )
        # From the claim on the row names this turn, so an attach here finds it
        # there before it runs (its user message and marker still to write):
        # it waits for the start (``attach``) rather than read it from the stores.
        starting = self.running.starting(message_id)
        asking = False
        try:
            if interrupted is not None and request.multitask_strategy == "rollback":
                assert lease is not None
                await self.claims.roll_back(context, interrupted, lease.epoch)
            first_index, recorded = (
                await self.claims.recorded(context, lease) if resuming else (0, None)
            )
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
            self.running.hold(turn)
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
            self.running.started(message_id, starting)
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
        return await self.claims.grant_epoch(key, message_id, takeover_of=None)

    async def _check_writer(self, tenant: str, requester_uuid: str, session_id: str) -> None:
        """Writes (a turn, a resume, a cancel) are the owner's alone, shared or not.

        Stream rows are keyed by requester, so without this another user's
        resume or cancel would only miss the owner's rows and answer 410 or 404
        instead of saying plainly that the conversation is not theirs."""
        store = self.stores.conversation
        if store is None or not supports(store, Capability.CONVERSATION_GET):
            return  # no store, or it cannot say whose the conversation is
        try:
            summary = await store.get_conversation(tenant, requester_uuid, session_id)
        except ConversationNotOwnedError as error:
            raise NotOwnerError("only the owner can write to this conversation") from error
        if summary is not None and summary.owner_uuid != requester_uuid:
            raise NotOwnerError("only the owner can write to this conversation")

    def _producer_changed(self, producer: str | None) -> None:
        """This replica's presence id changed (its lock was lost and held again):
        its leases read it at each write, so they name the new one from their
        next write on; this only counts it."""
        self.metrics.presence_changes.inc()

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
        elif (
            turn.lease is not None
            and not lost
            and end is not None
            and end.reason is not EndReason.DEAD
        ):
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
        self.running.forget(turn.message_id)
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
        return self.running.get(message_id)

    def running_turn_of(self, key: ConversationKey) -> str | None:
        """The message id of a turn this replica is producing for ``key``, if any."""
        return self.running.producing(key)

    # ------------------------------------------------------------ reading

    async def attach(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str | None,
        message_id: str,
        start_index: int,
    ) -> tuple[AsyncIterator[StreamEvent | StreamEnd], bool]:
        """The turn's events from ``start_index`` (``TurnReaders.attach``), and
        whether they come from this replica's live buffer."""
        return await self.readers.attach(
            tenant, requester_uuid, session_id, message_id, start_index
        )

    async def status(self, tenant: str, requester_uuid: str | None, session_id: str) -> TurnStatus:
        """The conversation's last turn and its queue (``TurnReaders.status``)."""
        return await self.readers.status(tenant, requester_uuid, session_id)

    def _takes_over(self) -> bool:
        return self.takeovers.running

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
        local = self.running.get(message_id)
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
            local.stop(StreamEnd(EndReason.CANCELLED))
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
        if not supports(self.stores.supervision, Capability.SUPERVISION_FIND_BY_MESSAGE_ID):
            raise TurnRequestError(
                "cancelling a stateful turn needs its session_id (this server's "
                "supervision store cannot find a turn by its message_id)"
            )
        requester = normalize_owner(requester_uuid)
        found = await self.stores.supervision.find_by_message_id(tenant, requester, message_id)
        if found is None:
            raise TurnNotFoundError(f"turn {message_id} is not running")
        return found

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
            end_dead=self.endings.end_erased_turn,
        )

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
        running = self.running.with_tasks()
        if running:
            await asyncio.wait(
                [t.task for t in running if t.task is not None],
                timeout=min(self.settings.drain_grace, timeout),
            )
        stopping = self.running.with_tasks()
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
                turn.buffer.close(StreamEnd(EndReason.DEAD))  # readers resume elsewhere
        for task in handing_off:
            task.cancel()  # only waits on its turn's task
        return [turn.message_id for turn in self.running.with_tasks()]

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
        for turn in self.running.with_tasks():
            assert turn.task is not None
            turn.stop(StreamEnd(EndReason.DEAD))
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


def _presence_lock(store: ChatStreamSupervisionStore | None) -> PresenceLock | None:
    """The supervision store's presence lock, where its backend has one."""
    if store is None or not supports(store, Capability.SUPERVISION_PRESENCE_LOCK):
        return None
    return store.presence_lock()
