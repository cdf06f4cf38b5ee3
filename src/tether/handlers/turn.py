"""One chat turn on the replica producing it, from the claimed lease to the sealed transcript.

The producer drives the agent and publishes every cumulative message to the
live buffer. For a stateful turn, three things run beside it: the replica's
heartbeat batcher (renews the lease every second), the replica's recording
flusher (the newest message to shared storage at most every 0.5 s, one batch
for all turns) and the turn's checkpointer (every resumable dependency every
5 s, and when a dependency asks). Any refused guarded write fences the turn:
the agent is stopped and nothing more is written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any

from tether.domain.agent_dependency import ResumableAgentDependency
from tether.domain.agent_registries import AgentRegistriesFactory, CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_state_store import TURN_STATE_KEY, DependencyState
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest
from tether.domain.chat_stream_recording_store import (
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
)
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.domain.message_bus import ConversationUpdated, MessageBus
from tether.domain.store_errors import StoreUnavailableError
from tether.domain.turn_context import TurnContext
from tether.handlers.turn_stores import TurnStores
from tether.metrics import TetherMetrics
from tether.runtime.follower import is_regression
from tether.runtime.heartbeats import HeartbeatBatcher
from tether.runtime.lease import Lease, LeaseLostError
from tether.runtime.live_buffer import ChatStreamBuffer, StreamEnd
from tether.runtime.recording_flusher import RecordingFencedOut, RecordingFlusher
from tether.settings import TetherSettings

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class TurnLimitError(Exception):
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
        recorded: ChatMessage | None = None,
        metrics: TetherMetrics | None = None,
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
        self._flusher = flusher
        self._metrics = metrics if metrics is not None else TetherMetrics()
        # A resumed turn starts its stream from what clients last saw, and holds
        # back the regenerated text until it has passed that point.
        self._recorded = recorded
        self._holding_back = recorded
        self._resumables: list[ResumableAgentDependency] = []
        self._checkpoint_lock = asyncio.Lock()
        self._flushed_index = -1
        self._drive_task: asyncio.Task[None] | None = None
        self._stop_reason: StreamEnd | None = None
        self._workers_stopped = False
        self._dead_after = timedelta(seconds=settings.dead_after)
        self.task: asyncio.Task[None] | None = None
        self._created: CreatedAgent | None = None
        self._handing_off = False

    # ----------------------------------------------------------------- life

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run(), name=f"turn-{self.message_id}")
        return self.task

    async def run(self) -> None:
        try:
            end = await self._produce()
        except LeaseLostError:
            end = await self._fenced_end()
        except TurnLimitError as error:
            end = await self._fail(error.code, str(error))
        except asyncio.CancelledError:
            # Cancelled from outside (a local cancel or the server shutting down):
            # the verdict was set by whoever stopped us.
            end = self._stop_reason or StreamEnd("dead")
            self.buffer.close(end)
            raise
        except Exception as error:
            logger.exception("turn %s failed", self.message_id)
            end = await self._fail("INTERNAL", f"the agent failed: {type(error).__name__}: {error}")
        finally:
            await self._close_dependencies()
        self.buffer.close(end)

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

    async def hand_off(self) -> None:
        """Stop now and leave the turn for another replica to resume (graceful
        drain): checkpoint, flush, mark the row dead, and tell readers ``dead``."""
        self._handing_off = True
        self.stop(StreamEnd("dead"))
        if self.task is not None:
            await asyncio.wait([self.task])

    async def _leave_for_resume(self) -> None:
        if self.lease is None or self.lease.lost:
            return
        if self._heartbeats is not None:
            self._heartbeats.release(self.lease)
        if self._flusher is not None:
            self._flusher.release(self)
        try:
            await self._flush()
            await self.checkpoint()
            await self.lease.abandon()
        except LeaseLostError:
            pass  # someone else owns it already: nothing of ours to leave
        except Exception:
            logger.exception(
                "turn %s: hand-off incomplete; it will read dead in time", self.message_id
            )

    def stop(self, end: StreamEnd) -> None:
        """Stop producing now (cancel, fence, drain); ``end`` is what readers hear."""
        if self._stop_reason is None:
            self._stop_reason = end
        if self._drive_task is not None and not self._drive_task.done():
            self._drive_task.cancel()

    # ------------------------------------------------------------- producing

    async def _produce(self) -> StreamEnd:
        created = await self._registries.create_agent(self.setup, self.request, self.context)
        self._created = created
        self._resumables = [
            dep for dep in created.dependencies if isinstance(dep, ResumableAgentDependency)
        ]
        conversation = self.request.conversation
        if self.context.stateful:
            conversation = await self._restore(conversation)
        workers = self._start_workers()
        if self._recorded is not None:
            self.buffer.publish(self._recorded)
        self._drive_task = asyncio.create_task(self._drive(created, conversation))
        try:
            await self._drive_task
        except asyncio.CancelledError:
            if self._stop_reason is None:
                raise
            if self._stop_reason.reason == "gone":
                raise LeaseLostError(self.message_id) from None
            if self._handing_off:
                await self._leave_for_resume()
            return self._stop_reason
        finally:
            if self.lease is not None and self._heartbeats is not None:
                self._heartbeats.release(self.lease)
            if self._flusher is not None:
                self._flusher.release(self)
            await self._stop_workers(workers)
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
        if self._stop_reason is not None:
            # Stopped, but the cancellation did not reach the agent (a library
            # under it swallowed it): nothing more may be shown or recorded.
            raise asyncio.CancelledError
        if self.lease is not None and self._clock() - self.lease.renewed_at > self._dead_after:
            # Unrenewed past the dead threshold (a stall, a SIGSTOP, an outage):
            # another replica may own the turn now. Stop before showing anything.
            raise LeaseLostError(self.message_id)
        if self._holding_back is not None:
            if is_regression(self._holding_back, message):
                return
            self._holding_back = None
        if self.buffer.next_index - self.buffer.first_index >= self._settings.max_turn_events:
            raise TurnLimitError(
                "TURN_TOO_LONG",
                f"the turn exceeded {self._settings.max_turn_events} streamed messages",
            )
        stamped = message.model_copy(
            update={
                "sender": ChatMessageSender.BOT,
                "message_id": self.message_id,
                "session_id": self.context.session_id,
            }
        )
        self.buffer.publish(stamped)

    # ------------------------------------------------------ state and resume

    async def _restore(self, conversation: list[ChatMessage]) -> list[ChatMessage]:
        """Load checkpoints into resumable dependencies; return what the agent reads."""
        store = self._stores.agent_state
        assert store is not None  # the handler refuses stateful turns without one
        ctx = self.context
        state = await store.load(ctx.tenant, ctx.requester_uuid, ctx.session_id or "")
        marker = state.get(TURN_STATE_KEY, {})
        resuming_turn = marker.get("message_id") == self.message_id and bool(marker.get("progress"))
        if not self.context.resuming:
            # Mark the checkpoint as this turn's before the agent runs, with the
            # request's messages, so a resume of a turn that died before its first
            # checkpoint still answers this turn's question.
            marker = {
                "message_id": self.message_id,
                "epoch": self._epoch,
                "progress": False,
                "conversation": [m.model_dump(mode="json") for m in conversation],
            }
            await self._save_checkpoint({**state, TURN_STATE_KEY: marker}, guard=True)
        for dep in self._resumables:
            await dep.load(state.get(dep.state_key, {}), resuming_turn=resuming_turn)
            dep.bind_checkpoint_hook(self.checkpoint)
        if any(dep.restores_conversation for dep in self._resumables):
            if self.context.resuming:
                return [ChatMessage.model_validate(m) for m in marker.get("conversation", [])]
            return conversation
        if self._stores.conversation is not None:
            return await self._stores.conversation.get_transcript(
                ctx.tenant, ctx.requester_uuid, ctx.session_id or ""
            )
        if self.context.resuming:
            return [ChatMessage.model_validate(m) for m in marker.get("conversation", [])]
        return conversation

    @property
    def _epoch(self) -> int:
        return self.lease.epoch if self.lease is not None else 0

    async def checkpoint(self) -> None:
        """Save every resumable dependency now (guarded by the lease)."""
        if not self.context.stateful or not self._resumables:
            return
        async with self._checkpoint_lock:
            state: DependencyState = {dep.state_key: await dep.dump() for dep in self._resumables}
            state[TURN_STATE_KEY] = {
                "message_id": self.message_id,
                "epoch": self._epoch,
                "progress": True,
                "conversation": [m.model_dump(mode="json") for m in self.request.conversation],
            }
            await self._save_checkpoint(state, guard=True)

    async def _save_checkpoint(self, state: DependencyState, *, guard: bool) -> None:
        store = self._stores.agent_state
        if store is None:
            return
        ctx = self.context
        while True:
            if guard:
                await self._renew()
            try:
                with self._metrics.timed("agent_state", store, "save"):
                    await store.save(ctx.tenant, ctx.requester_uuid, ctx.session_id or "", state)
                break
            except StoreUnavailableError:
                if not guard or self._stop_reason is not None:
                    # Unguarded (a hand-off's last save) or already stopped: the
                    # caller decides; a stopped turn must not linger in this loop.
                    raise
                # A checkpoint is what keeps a resume from running a finished tool
                # call again, so it is waited for, not skipped: retried while the
                # lease holds, until ``_renew`` finds it unrenewed past the dead
                # threshold (another replica may own the turn by then) and stops us.
                logger.warning("turn %s: checkpoint failed, will retry", self.message_id)
                await asyncio.sleep(self._settings.heartbeat_interval)
        self._metrics.observe_checkpoint(state)

    # --------------------------------------------------------------- workers

    def _start_workers(self) -> list[asyncio.Task[None]]:
        if not self.context.stateful:
            return []
        loops: list[Callable[[], Coroutine[Any, Any, None]]] = []
        if self.lease is not None:
            # The replica's batcher renews this lease with all the others, each
            # second; a refused renewal fences this turn alone.
            assert self._heartbeats is not None, "a leased turn needs the heartbeat batcher"
            self._heartbeats.hold(self.lease, lambda: self.stop(StreamEnd("gone")))
        if self._stores.recording is not None:
            # Likewise the replica's flusher writes this turn's recording with
            # all the others' every flush interval; a fenced put stops this turn.
            assert self._flusher is not None, "a recorded turn needs the recording flusher"
            self._flusher.hold(
                self,
                self._pending_put,
                self._written,
                self._fenced_by_recording,
                self._flush_failed,
            )
        if self._stores.agent_state is not None and self._resumables:
            loops.append(self._checkpoint_loop)
        return [asyncio.create_task(self._guarded(loop)) for loop in loops]

    async def _stop_workers(self, workers: list[asyncio.Task[None]]) -> None:
        # The flag ends a worker's loop even when a store driver swallowed the
        # cancellation (Python 3.11's wait_for can): it then finishes its
        # current write and stops at the loop's next turn instead of running on.
        self._workers_stopped = True
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def _guarded(self, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            await loop()
        except LeaseLostError:
            self.stop(StreamEnd("gone"))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("turn %s: worker %s failed", self.message_id, loop.__name__)
            self.stop(StreamEnd("errored", "INTERNAL", "a background worker of the turn failed"))

    async def _renew(self) -> None:
        """Renew the lease. A store outage is retried; one longer than the dead
        threshold means another replica may own the turn by now, so we stop."""
        if self.lease is None:
            return
        try:
            await self.lease.renew()
        except LeaseLostError:
            raise
        except Exception:
            # Measured from the last renewal by anyone: the replica's heartbeat
            # batch renews the lease every second between our own calls.
            silent = self._clock() - self.lease.renewed_at
            if silent > timedelta(seconds=self._settings.dead_after):
                logger.warning(
                    "turn %s: lease unrenewable for %s, stopping", self.message_id, silent
                )
                self.lease.lost = True
                raise LeaseLostError(self.message_id) from None
            logger.warning("turn %s: heartbeat failed, will retry", self.message_id, exc_info=True)

    def _pending_put(self) -> RecordingPut | None:
        """The newest message not yet recorded, as a put; None when there is
        nothing new or the lease is gone (a fenced producer writes nothing)."""
        latest = self.buffer.latest
        if latest is None or latest.index <= self._flushed_index:
            return None
        if self.lease is not None and self.lease.lost:
            return None
        ctx = self.context
        event = RecordedStreamEvent(
            index=latest.index,
            message=latest.message,
            message_id=self.message_id,
            epoch=self._epoch,
        )
        return RecordingPut(ctx.tenant, ctx.requester_uuid, ctx.session_id or "", event)

    def _written(self, put: RecordingPut) -> None:
        self._flushed_index = max(self._flushed_index, put.event.index)

    def _fenced_by_recording(self) -> None:
        if self.lease is not None:
            self.lease.lost = True
        self.stop(StreamEnd("gone"))

    def _flush_failed(self, error: BaseException) -> None:
        # Not an outage (the flusher retries those: the next flush writes the
        # latest message again), but this turn's own put failing.
        logger.error("turn %s: recording flush failed", self.message_id, exc_info=error)
        self.stop(StreamEnd("errored", "INTERNAL", "a background worker of the turn failed"))

    async def _flush(self) -> None:
        """Record the newest message now (the end of the turn, a hand-off), in
        the replica's next batch; a fenced put raises ``LeaseLostError``."""
        store = self._stores.recording
        if store is None:
            return
        if self.lease is not None and self.lease.lost:
            raise LeaseLostError(self.message_id)
        put = self._pending_put()
        if put is None:
            return
        # Every recorded turn has the replica's flusher (``_start_workers``).
        assert self._flusher is not None, "a recorded turn needs the recording flusher"
        try:
            with self._metrics.timed("recording", store, "put"):
                await self._flusher.flush_now(self, put)
        except (RecordingFencedOut, RecordingFencedError):
            if self.lease is not None:
                self.lease.lost = True
            raise LeaseLostError(self.message_id) from None
        self._written(put)

    async def _checkpoint_loop(self) -> None:
        while not self._workers_stopped:
            await asyncio.sleep(self._settings.checkpoint_interval)
            if self._workers_stopped:
                return
            await self.checkpoint()

    # ------------------------------------------------------------------- end

    async def _seal(self) -> StreamEnd:
        """Persist the finished turn: recording, checkpoint, transcript, then DONE."""
        final = self.buffer.latest
        ctx = self.context
        if ctx.stateful:
            await self._flush()
            await self.checkpoint()
            conversations = self._stores.conversation
            if conversations is not None and final is not None:
                await self._renew()
                if not await self._transcript_has_answer():
                    await conversations.append_messages(
                        ctx.tenant,
                        ctx.requester_uuid,
                        ctx.session_id or "",
                        ctx.agent_identifier,
                        [final.message],
                        bot_params=self.request.bot_params,
                        last_turn_status="complete",
                        create_if_absent=False,
                    )
            elif conversations is not None:
                await conversations.set_last_turn_status(
                    ctx.tenant, ctx.requester_uuid, ctx.session_id or "", "complete"
                )
            if self.lease is not None:
                await self.lease.finish(ChatStreamStatus.DONE)
            if conversations is not None:
                await self._bus.publish(
                    ConversationUpdated(
                        ctx.tenant, ctx.requester_uuid, ctx.session_id or "", self.message_id
                    )
                )
        return StreamEnd("done")

    async def _transcript_has_answer(self) -> bool:
        """A resumed turn whose first producer died after writing the answer must
        not write it twice."""
        if not self.context.resuming or self._stores.conversation is None:
            return False
        ctx = self.context
        transcript = await self._stores.conversation.get_transcript(
            ctx.tenant, ctx.requester_uuid, ctx.session_id or ""
        )
        return any(
            m.sender is ChatMessageSender.BOT and m.message_id == self.message_id
            for m in transcript
        )

    async def _fail(self, code: str, message: str) -> StreamEnd:
        """Record an errored turn (unless fenced: then someone else owns it)."""
        ctx = self.context
        end = StreamEnd("errored", code, message)
        if not ctx.stateful:
            return end
        try:
            await self._renew()
            await self._flush()
            if self._stores.conversation is not None:
                await self._stores.conversation.set_last_turn_status(
                    ctx.tenant, ctx.requester_uuid, ctx.session_id or "", "errored"
                )
            if self.lease is not None:
                await self.lease.finish(ChatStreamStatus.ERRORED)
        except LeaseLostError:
            return await self._fenced_end()
        except Exception:
            # The row still says RUNNING and will read dead: the turn is not over
            # for the rest of the deployment (a client may resume it), so readers
            # are told to ask the status rather than a verdict nobody stored.
            logger.exception("turn %s: could not record its error", self.message_id)
            return StreamEnd("gone")
        return end

    async def _fenced_end(self) -> StreamEnd:
        """What local readers hear when another writer took the lease: a cancel
        says cancelled; a takeover says ask the status (the turn lives elsewhere)."""
        if self.lease is None:
            return StreamEnd("gone")
        key = self.lease.key
        with contextlib.suppress(Exception):
            row = await self.lease.store.read(key.tenant, key.requester_uuid, key.session_id)
            if (
                row is not None
                and row.message_id == self.message_id
                and row.status is ChatStreamStatus.CANCELLED
            ):
                return StreamEnd("cancelled")
        return StreamEnd("gone")
