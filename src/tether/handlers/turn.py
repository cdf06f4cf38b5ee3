"""One chat turn on the replica producing it, from the claimed lease to its verdict.

The turn's life follows ``tether.runtime.lifecycle``: CLAIMED (the lease is
ours, the stores fenced at our epoch, the input fixed), RUNNING (the agent
produces; every cumulative message goes to the live buffer), SEALING (the
answer is persisted), then one verdict (in the supervision row, or, when a
queued turn waits behind it, the row handed to that turn). Beside a running stateful turn, the
replica's heartbeat batcher renews its lease every second, the replica's
recording flusher records each new message at once (batched with the other
turns' while a batch is in flight), and the turn's checkpointer saves every
resumable dependency every 5 s and whenever a dependency asks. Every write
goes through the turn's ``FencedWriter``; the first one a store refuses fences
the turn: the agent is stopped and nothing more is written anywhere.

Shown implies kept: a recorded turn's readers are handed a message only once
the recording store accepted it, so whatever a screen was shown, a successor
that takes the turn over resumes from at least that text
(``handlers.turn_showing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from tether.domain.agent_dependency import ResumableAgentDependency
from tether.domain.agent_registries import AgentRegistriesFactory, CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.domain.message_bus import ConversationUpdated, MessageBus
from tether.domain.store_errors import StoreUnavailableError
from tether.domain.turn_context import TurnContext
from tether.handlers.turn_checkpoint import TurnCheckpoint
from tether.handlers.turn_ends import kept_answer
from tether.handlers.turn_showing import TurnShowing
from tether.metrics import TetherMetrics
from tether.observability.logs import TurnFields
from tether.observability.traces import NO_TRACING, Tracing
from tether.observability.turns import TurnObservation
from tether.runtime import producer_watch
from tether.runtime.delta_publisher import DeltaPublisher
from tether.runtime.fenced_writer import FencedWriter
from tether.runtime.follower import has_push
from tether.runtime.heartbeats import HeartbeatBatcher
from tether.runtime.lease import ConversationKey, FencedError, Lease
from tether.runtime.lifecycle import Lifecycle, TurnState
from tether.runtime.live_buffer import ChatStreamBuffer, EndReason, StreamEnd
from tether.runtime.recording_flusher import RecordingFlusher
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings
from tether.tools import set_current_turn

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]

NextQueued = Callable[[ConversationKey], Awaitable["str | None"]]
"""The id of the conversation's next queued turn, if one waits (``TurnQueue.head``)."""


class TurnLimitError(Exception):
    """The turn passed one of its limits (time, streamed messages): it errs."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Turn:
    """A turn this replica produces. ``run()`` is its whole life; it never raises."""

    def __init__(
        self,
        *,
        request: ChatRequest,
        setup: AgentSetup,
        context: TurnContext,
        registries: AgentRegistriesFactory,
        stores: TurnStores,
        settings: TetherSettings,
        bus: MessageBus,
        clock: Clock,
        lease: Lease | None,
        buffer: ChatStreamBuffer,
        heartbeats: HeartbeatBatcher | None = None,
        flusher: RecordingFlusher | None = None,
        deltas: DeltaPublisher | None = None,
        recorded: ChatMessage | None = None,
        metrics: TetherMetrics | None = None,
        next_queued: NextQueued | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.request = request
        self.setup = setup
        self.context = context
        self.message_id = context.message_id
        self._registries = registries
        self._stores = stores
        self._settings = settings
        self._bus = bus
        self._clock = clock
        self.lease = lease
        self.buffer = buffer
        self._heartbeats = heartbeats
        self._metrics = metrics if metrics is not None else TetherMetrics()
        self.lifecycle = Lifecycle()
        self.key = ConversationKey(context.tenant, context.requester_uuid, context.session_id or "")
        self.writer = FencedWriter(
            stores=stores,
            key=self.key,
            message_id=self.message_id,
            lease=lease,
            lifecycle=self.lifecycle,
            flusher=flusher,
            clock=clock,
            dead_after=timedelta(seconds=settings.dead_after),
            retry_interval=settings.heartbeat_interval,
            metrics=self._metrics,
        )
        self._produced_count = 0
        self._drive_task: asyncio.Task[None] | None = None
        self._stop_reason: StreamEnd | None = None
        self._cancel_written = asyncio.Event()
        self._dead_after = timedelta(seconds=settings.dead_after)
        self.task: asyncio.Task[None] | None = None
        self._created: CreatedAgent | None = None
        self._next_queued = next_queued
        self.passed_to: str | None = None
        """The queued turn this one handed the conversation to at its end, if any."""
        self.observed = TurnObservation(
            TurnFields(
                context.session_id,
                self.message_id,
                lease.epoch if lease is not None else None,
                context.agent_identifier,
            ),
            tracing=tracing,
            metrics=self._metrics,
            resumed=context.resuming,
        )
        """Its log lines, span and timings (started now: the marker names the span)."""
        self.state = TurnCheckpoint(
            request=request,
            context=context,
            stores=stores,
            writer=self.writer,
            observed=self.observed,
            recorded=recorded,
        )
        """Its checkpoint: marked before the agent runs, restored on a resume."""
        self.shown = TurnShowing(
            key=self.key,
            message_id=self.message_id,
            stateful=context.stateful,
            stores=stores,
            buffer=buffer,
            writer=self.writer,
            flusher=flusher,
            deltas=deltas,
            observed=self.observed,
            metrics=self._metrics,
            clock=clock,
            recorded=recorded,
            takeover=lease.takeover if lease is not None else None,
            stop=self.stop,
        )
        """Its messages on their way to its readers: recorded, then shown."""

    # ----------------------------------------------------------------- life

    async def record_user_message(self) -> None:
        """Append the user's new message before the agent runs (CLAIMED), so it
        survives a producer crash. Raises what the store raises (not the owner)."""
        ctx = self.context
        user_message = self.request.conversation[-1].model_copy(
            # ``queued`` is the server's mark alone (``handlers.queue``).
            update={
                "session_id": ctx.session_id,
                "message_id": f"{ctx.message_id}-user",
                "queued": None,
            }
        )
        headers = self.request.request_headers
        await self.writer.append(
            ctx.agent_identifier,
            [user_message],
            last_turn_status="running",
            create_if_absent=True,
            user_roles=headers.user_roles,
            user_tenants=headers.user_tenants,
            bot_params=self.request.bot_params,
            conversation_context=self.request.conversation_context,
        )

    async def mark(self) -> None:
        """Mark the checkpoint as this turn's (``TurnCheckpoint.mark``)."""
        await self.state.mark()

    async def checkpoint(self) -> None:
        """Save every resumable dependency now (``TurnCheckpoint.checkpoint``)."""
        await self.state.checkpoint()

    def hold_lease(self) -> None:
        """Renew the turn's lease from now on (CLAIMED, right after the claim):
        the replica's batcher renews it with all the others, each second, until
        the turn's verdict; a refused renewal fences this turn alone. Renewed
        from the claim on, not from the agent's start, so the writes a turn
        makes before its agent runs (its user message, its marker) may wait
        in a busy store's queue without the lease aging to dead."""
        if self.lease is not None and self._heartbeats is not None and self.context.stateful:
            self._heartbeats.add(self.lease, lambda: self.stop(StreamEnd(EndReason.GONE)))

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run(), name=f"turn-{self.message_id}")
        return self.task

    async def run(self) -> None:
        # Tool calls' idempotency keys name this turn, also for a ChatClient
        # the agent built itself (``tether.tools.current_turn_id``).
        set_current_turn(self.message_id)
        end: StreamEnd | None = None
        try:
            with self.observed.running():
                end = await self._run()
        finally:
            told = end or self._stop_reason or StreamEnd(EndReason.DEAD)
            self.observed.ended(told.reason, told.error_code)
            self.shown.settle()
        self.buffer.close(end)

    async def _run(self) -> StreamEnd:
        try:
            end = await self._produce()
        except FencedError:
            end = await self._fenced_end()
        except StoreUnavailableError:
            # Retried while the lease could still be ours; past that another
            # replica may own the turn. It stopped here: resume it elsewhere.
            logger.warning("turn %s: stores unavailable, stopping", self.message_id)
            self.writer.fence()
            end = StreamEnd(EndReason.DEAD)
        except TurnLimitError as error:
            end = await self._fail(error.code, str(error))
        except asyncio.CancelledError:
            # Cancelled from outside (the server shutting down): the verdict was
            # set by whoever stopped us.
            end = self._stop_reason or StreamEnd(EndReason.DEAD)
            self.buffer.close(end)
            raise
        except Exception:
            # The client hears a stable code and an id to quote; what failed
            # (a stack, a message that may carry secrets) goes to the log only.
            error_id = uuid.uuid4().hex[:16]
            logger.exception("turn %s failed [error id %s]", self.message_id, error_id)
            end = await self._fail(
                "INTERNAL", f"the agent failed; quote error id {error_id} to the operator"
            )
        finally:
            self._leave_batches()
            await self._close_dependencies()
        return end

    def _leave_batches(self) -> None:
        if self.lease is not None and self._heartbeats is not None:
            self._heartbeats.discard(self.lease)
        self.shown.leave()

    async def _close_dependencies(self) -> None:
        """Dependencies are built per turn; release what they hold (connections)."""
        if self._created is None:
            return
        for dep in self._created.dependencies:
            close = getattr(dep, "aclose", None)
            if close is None:
                continue
            try:
                await close()
            except Exception:
                logger.warning("turn %s: closing %r failed", self.message_id, dep, exc_info=True)

    def stop(self, end: StreamEnd) -> None:
        """Stop producing now (a cancel, a fence, a drain); ``end`` is what readers hear."""
        if self._stop_reason is None:
            self._stop_reason = end
        self.shown.settle()  # nothing more is shown before the verdict
        if self._drive_task is not None and not self._drive_task.done():
            self._drive_task.cancel()

    async def hand_off(self) -> None:
        """Graceful drain: stop now and leave the turn for another replica to
        resume: flush, checkpoint, hand the row off so it reads dead at once.
        A turn already sealing is left to finish."""
        if self.lifecycle.state in (TurnState.CLAIMED, TurnState.RUNNING):
            self.lifecycle.move(TurnState.HANDING_OFF)
            self.stop(StreamEnd(EndReason.DEAD))
        if self.task is not None:
            await asyncio.wait([self.task])

    async def hand_off_now(self) -> None:
        """The drain's last resort, for an agent that did not stop when it was
        cancelled (it swallowed the cancellation): hand the turn off without
        waiting for it. Its lifecycle ends here, so nothing the agent does
        afterwards is shown or written; its readers hear ``dead``."""
        if self.lifecycle.state is TurnState.HANDING_OFF:
            await self._leave_for_resume()
        self.buffer.close(StreamEnd(EndReason.DEAD))

    async def stop_for_cancel(self) -> None:
        """A cancel asked on this replica: stop the agent and flush the newest
        message it showed, so the partial the canceller keeps is what every
        client of this turn saw. The canceller then fences the turn and writes
        the verdict at the next epoch. A turn already sealing is not stopped:
        its own answer and the cancel meet in the stores, which keep one."""
        if self.lifecycle.state not in (TurnState.CLAIMED, TurnState.RUNNING):
            return
        self.lifecycle.move(TurnState.CANCELLING)
        self.stop(StreamEnd(EndReason.CANCELLED))
        if self._drive_task is not None:
            await asyncio.wait([self._drive_task])
        try:
            await self.shown.flush()
        except Exception:
            # Fenced or unreachable: the canceller keeps what is recorded.
            logger.warning("turn %s: no final flush before the cancel", self.message_id)

    def cancelled(self) -> None:
        """The cancel is over: its verdict is written (the row CANCELLED at the
        epoch after the canceller's), with the partial answer it kept."""
        if self.lease is not None:
            self.lease.lost = True
        self.lifecycle.end(TurnState.CANCELLED)
        self.stop(StreamEnd(EndReason.CANCELLED))
        self._cancel_written.set()

    # ------------------------------------------------------------- producing

    async def _produce(self) -> StreamEnd:
        created = await self._registries.create_agent(self.setup, self.request, self.context)
        self._created = created
        self.state.resumables = [
            dep for dep in created.dependencies if isinstance(dep, ResumableAgentDependency)
        ]
        conversation = self.state.input
        if self.context.stateful:
            conversation = await self.state.restore()
        if self.lease is not None:
            # The start's commit point: a fenced renewal after the last read
            # of the input, so a cancel (or any taker) whose row write came
            # first stops the turn before its agent makes a model call.
            await self.lease.renew()
        if self.lifecycle.state is TurnState.CLAIMED:
            self.lifecycle.move(TurnState.RUNNING)
        workers = self._start_workers()
        self.shown.show_recorded()
        self._drive_task = asyncio.create_task(self._drive(created, conversation))
        if self._stop_reason is not None:
            self._drive_task.cancel()  # stopped before the agent started
        try:
            await self._drive_task
            if self._stop_reason is not None:
                # The agent returned after it was told to stop (it swallowed its
                # cancellation): stopped all the same; its answer is not sealed.
                raise asyncio.CancelledError
        except asyncio.CancelledError:
            if self._stop_reason is None:
                raise
            if self._stop_reason.reason is EndReason.GONE:
                raise FencedError(self.message_id) from None
            if self.lifecycle.state is TurnState.HANDING_OFF:
                await self._leave_for_resume()
            if self.lifecycle.state is TurnState.CANCELLING:
                # The canceller keeps what readers saw, then writes its verdict:
                # readers here hear ``cancelled`` once it has, so one who reads
                # the transcript then finds the answer kept (bounded: a
                # canceller that died leaves it to the takeover scan).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._settings.heartbeat_interval):
                        await self._cancel_written.wait()
            return self._stop_reason
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        return await self._seal()

    async def _drive(self, created: CreatedAgent, conversation: list[ChatMessage]) -> None:
        agent = created.agent
        try:
            async with asyncio.timeout(self._settings.max_turn_seconds):
                if isinstance(agent, StreamableChatAgent):
                    async for message in agent.execute_streaming(conversation):
                        self._publish(message)
                else:
                    answer = await agent.execute(conversation)
                    if answer is not None:
                        self._publish(answer)
        except TimeoutError:
            raise TurnLimitError(
                "TURN_TIMEOUT", f"the turn ran longer than {self._settings.max_turn_seconds} s"
            ) from None

    def _publish(self, message: ChatMessage) -> None:
        if self._stop_reason is not None or self.lifecycle.ended:
            # Stopped, but the cancellation did not reach the agent (a library
            # under it swallowed it): nothing more may be shown or recorded.
            raise asyncio.CancelledError
        if self.lease is not None and self._clock() - self.lease.renewed_at > self._dead_after:
            # Unrenewed past the dead threshold (a stall, a SIGSTOP, an outage):
            # another replica may own the turn now. Stop before showing anything.
            raise FencedError(self.message_id)
        new = self.shown.new_content(message)
        if new is None:
            return  # held back: not past what a resumed turn's clients were shown
        if self._produced_count >= self._settings.max_turn_events:
            raise TurnLimitError(
                "TURN_TOO_LONG",
                f"the turn exceeded {self._settings.max_turn_events} streamed messages",
            )
        stamped = new.model_copy(
            update={
                "sender": ChatMessageSender.BOT,
                "message_id": self.message_id,
                "session_id": self.context.session_id,
            }
        )
        self._produced_count += 1
        self.shown.offer(stamped)

    async def settled(self) -> None:
        """Wait until every message the agent yielded so far was shown, or
        never will be (the turn was stopped or fenced, or it ended)."""
        await self.shown.settled()

    # --------------------------------------------------------------- workers

    def _start_workers(self) -> list[asyncio.Task[None]]:
        """For a stateful turn: the recording flusher's hold, the checkpoint loop,
        and the watch for a new owner."""
        if not self.context.stateful:
            return []
        workers: list[asyncio.Task[None]] = []
        if self._stores.recording is not None:
            self.shown.hold()
            if self.lease is not None and has_push(self._stores.recording):
                watching = producer_watch.watch(
                    self._stores.recording,
                    self.lease,
                    self.key,
                    producing=lambda: (
                        self.lifecycle.state in (TurnState.CLAIMED, TurnState.RUNNING)
                    ),
                    interval=self._settings.heartbeat_interval,
                    on_watched=self.shown.watched,
                    on_taken=lambda: self.stop(StreamEnd(EndReason.GONE)),
                )
                workers.append(asyncio.create_task(watching))
        if self._stores.agent_state is not None and self.state.resumables:
            workers.append(asyncio.create_task(self._checkpoint_loop()))
        return workers

    async def _checkpoint_loop(self) -> None:
        try:
            await self.state.keep(
                self._settings.checkpoint_interval,
                running=lambda: self.lifecycle.state is TurnState.RUNNING,
            )
        except (FencedError, StoreUnavailableError):
            # Fenced, or unreachable past the writer's retries while the lease
            # could still be ours: another replica may own the turn.
            self.stop(StreamEnd(EndReason.GONE))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("turn %s: checkpointing failed", self.message_id)
            self.stop(
                StreamEnd(EndReason.ERRORED, "INTERNAL", "a background worker of the turn failed")
            )

    # ------------------------------------------------------------------- end

    async def _seal(self) -> StreamEnd:
        """Persist the finished turn: recording, checkpoint, transcript, then DONE."""
        self.lifecycle.move(TurnState.SEALING)
        ctx = self.context
        if ctx.stateful:
            # The final message is durable, and shown, before the verdict.
            await self.shown.flush()
            final = self.buffer.latest
            await self.shown.publish_now()
            await self.checkpoint()
            if self._stores.conversation is not None:
                # Fenced and idempotent by message id: a resumed turn whose first
                # producer wrote the answer, or a cancel that kept a partial,
                # leaves exactly one bot message.
                await self.writer.append(
                    ctx.agent_identifier,
                    [final.message] if final is not None else [],
                    last_turn_status="complete",
                    create_if_absent=False,
                    bot_params=self.request.bot_params,
                )
            try:
                await self._write_verdict(ChatStreamStatus.DONE)
            except FencedError:
                if self._stores.conversation is None:
                    raise
                # The whole answer is in the transcript: that is the verdict,
                # and whoever took the row (a cancel, the reaper) finishes it
                # with the verdict written there. Readers hear done.
                self.writer.fence()
                self.lifecycle.end(TurnState.DONE)
                return StreamEnd(EndReason.DONE)
            if self._stores.conversation is not None:
                await self._bus.publish(
                    ConversationUpdated(
                        ctx.tenant, ctx.requester_uuid, ctx.session_id or "", self.message_id
                    )
                )
        self.lifecycle.end(TurnState.DONE)
        return StreamEnd(EndReason.DONE)

    async def _fail(self, code: str, message: str) -> StreamEnd:
        """Record an errored turn (unless fenced: then someone else owns it)."""
        end = StreamEnd(EndReason.ERRORED, code, message)
        if not self.lifecycle.can_move(TurnState.FAILING):
            return await self._fenced_end() if self.lifecycle.ended else end
        self.lifecycle.move(TurnState.FAILING)
        if self.context.stateful:
            try:
                await self.shown.flush()
                latest = self.buffer.latest
                answer = kept_answer(
                    latest.message if latest is not None else None,
                    "errored",
                    session_id=self.context.session_id,
                    message_id=self.message_id,
                    error=(code, message),
                )
                await self.writer.append(
                    self.context.agent_identifier,
                    [answer] if answer is not None else [],
                    last_turn_status="errored",
                    create_if_absent=False,
                )
                await self._write_verdict(ChatStreamStatus.ERRORED)
            except FencedError:
                return await self._fenced_end()
            except Exception:
                # The row still says RUNNING and will read dead: the turn is not
                # over for the rest of the deployment (a client may resume it), so
                # readers are told to ask the status rather than a verdict nobody
                # stored.
                logger.exception("turn %s: could not record its error", self.message_id)
                self.writer.fence()
                return StreamEnd(EndReason.GONE)
        self.lifecycle.end(TurnState.ERRORED)
        return end

    async def _write_verdict(self, status: ChatStreamStatus) -> None:
        """The turn's last write: its verdict in the row or, when a queued turn
        waits behind it, the row handed to that turn (``Lease.pass_on``). One
        write either way: a crash after a verdict and before the next turn's
        claim left the queue waiting for a client to look."""
        head = None
        if self._next_queued is not None:
            try:
                head = await self._next_queued(self.key)
            except Exception:
                # The verdict, then: the replica's kick after the turn reads
                # the queue again.
                logger.warning("turn %s: could not read the queue", self.message_id, exc_info=True)
        if head is None:
            await self.writer.finish(status)
            return
        await self.writer.pass_on(head)
        self.passed_to = head

    async def _leave_for_resume(self) -> None:
        try:
            await self.shown.flush()
            await self.checkpoint()
            await self.writer.hand_off()
        except FencedError:
            return  # someone else owns it already: nothing of ours to leave
        except Exception:
            logger.exception(
                "turn %s: hand-off incomplete; it will read dead in time", self.message_id
            )
            self.writer.fence()
            return
        self.lifecycle.end(TurnState.HANDED_OFF)

    async def _fenced_end(self) -> StreamEnd:
        """What local readers hear when another writer took the lease
        (``producer_watch.ending_after_fence``)."""
        self.writer.fence()
        if self.lease is None:
            return StreamEnd(EndReason.GONE)
        recording, wait = self._stores.recording, self._settings.heartbeat_interval
        reason = await producer_watch.ending_after_fence(self.lease, recording, self.key, wait=wait)
        return StreamEnd(reason)
