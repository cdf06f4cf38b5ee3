"""The one path by which a producer writes: each write names the turn's epoch.

A write is made only if the turn's lifecycle allows it in its current state,
and each store refuses it in the write itself once a newer epoch has fenced
the conversation (``save_fenced``, ``put``, ``append_fenced``, the
supervision row's compare-and-swap). The first refusal fences the turn for
good: its lifecycle ends ``FENCED`` and every later write is refused here,
before it reaches a store.

A store that implements only the seed's methods still works: before writing
to it the writer renews the lease (a check made before the write, which is
what such an adapter gives up: a producer paused between the two can land
one last write).

A store outage is retried while the lease can still be ours: until the last
accepted heartbeat is older than the dead threshold. Past that another
replica may own the turn, so the error is raised instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_agent_state_store import DependencyState
from tether.domain.chat_conversation_store import LastTurnStatus
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import RecordingFencedError
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.domain.store_errors import StoreUnavailableError
from tether.runtime.lease import ConversationKey, FencedError, Lease
from tether.runtime.lifecycle import Lifecycle, TurnState, Write
from tether.runtime.recording_flusher import RecordingFencedOut, RecordingFlusher
from tether.runtime.turn_stores import TurnStores

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class StoreMetrics(Protocol):
    """What the writer reports of its writes (``tether.metrics.TetherMetrics``,
    named by what it does so that the runtime imports nothing above it)."""

    def timed(self, store_name: str, store: object, operation: str) -> AbstractContextManager[None]:
        """Time one store call."""
        ...

    def observe_checkpoint(self, state: dict[str, Any]) -> None:
        """Count one checkpoint's size."""
        ...


_T = TypeVar("_T")


async def raise_fences(stores: TurnStores, key: ConversationKey, epoch: int) -> None:
    """Fence the conversation at ``epoch`` in every store a producer writes to,
    other than the supervision row (whose compare-and-swap is the grant itself).

    Called before a new epoch is granted (a claim, a takeover, a cancel), so no
    store accepts an older epoch's write once the grant is accepted.
    """
    k = key
    fences: list[Awaitable[None]] = []
    if stores.recording is not None:
        fences.append(stores.recording.fence(k.tenant, k.requester_uuid, k.session_id, epoch))
    if stores.agent_state is not None:
        fences.append(stores.agent_state.fence(k.tenant, k.requester_uuid, k.session_id, epoch))
    if stores.conversation is not None:
        fences.append(stores.conversation.fence(k.tenant, k.requester_uuid, k.session_id, epoch))
    await asyncio.gather(*fences)


class FencedWriter:
    """Every write of one turn's producer, fenced by the turn's epoch."""

    def __init__(
        self,
        *,
        stores: TurnStores,
        key: ConversationKey,
        message_id: str,
        lease: Lease | None,
        lifecycle: Lifecycle,
        flusher: RecordingFlusher | None,
        clock: Clock,
        dead_after: timedelta,
        retry_interval: float,
        metrics: StoreMetrics,
    ) -> None:
        self._stores = stores
        self._key = key
        self._message_id = message_id
        self.lease = lease
        self.lifecycle = lifecycle
        self._flusher = flusher
        self._clock = clock
        self._dead_after = dead_after
        self._retry_interval = retry_interval
        self._metrics = metrics

    @property
    def epoch(self) -> int:
        """The epoch every write names; 0 without a supervision store (no lease)."""
        return self.lease.epoch if self.lease is not None else 0

    # ------------------------------------------------------------ the writes

    async def checkpoint(self, state: DependencyState) -> None:
        """Save the agent state (the turn's marker included)."""
        store = self._stores.agent_state
        if store is None:
            return
        k = self._key

        async def save() -> bool:
            with self._metrics.timed("agent_state", store, "save"):
                return await store.save_fenced(
                    k.tenant, k.requester_uuid, k.session_id, state, self.epoch
                )

        await self._write(Write.CHECKPOINT, store, Capability.STATE_SAVE_FENCED, save)
        self._metrics.observe_checkpoint(state)

    async def append(
        self,
        agent_identifier: str,
        messages: list[ChatMessage],
        *,
        last_turn_status: LastTurnStatus | None,
        create_if_absent: bool,
        **details: Any,
    ) -> None:
        """Append to the transcript, once per ``message_id`` (``append_fenced``)."""
        store = self._stores.conversation
        if store is None:
            return
        k = self._key

        async def append() -> bool:
            return await store.append_fenced(
                k.tenant,
                k.requester_uuid,
                k.session_id,
                agent_identifier,
                messages,
                epoch=self.epoch,
                last_turn_status=last_turn_status,
                create_if_absent=create_if_absent,
                **details,
            )

        await self._write(Write.TRANSCRIPT, store, Capability.CONVERSATION_APPEND_FENCED, append)

    async def record(self, owner: object) -> None:
        """Wait until everything ``owner`` (the turn) produced so far is
        recorded: in the replica's next recording batch, fenced by our epoch."""
        if self._flusher is None:
            return
        flusher = self._flusher

        async def flush() -> bool:
            try:
                await flusher.flush_now(owner)
            except (RecordingFencedOut, RecordingFencedError):
                return False
            return True

        # Every shipped and seed-only recording store fences ``put`` itself.
        await self._write(Write.RECORDING, None, None, flush)

    async def finish(self, status: ChatStreamStatus) -> None:
        """The terminal status of the supervision row (at the next epoch)."""
        lease = self.lease
        if lease is None:
            return
        await self._write(Write.STATUS, None, None, lambda: _accepted(lease.finish(status)))

    async def hand_off(self) -> None:
        """Leave the turn for another replica: the row reads dead at once."""
        lease = self.lease
        if lease is None:
            return
        await self._write(Write.STATUS, None, None, lambda: _accepted(lease.abandon()))

    async def pass_on(self, message_id: str) -> None:
        """End the turn by handing the row to queued turn ``message_id``
        (``Lease.pass_on``)."""
        lease = self.lease
        if lease is None:
            return
        await self._write(Write.STATUS, None, None, lambda: _accepted(lease.pass_on(message_id)))

    def allows_recording(self) -> bool:
        return self.lifecycle.allows(Write.RECORDING)

    # ------------------------------------------------------------- machinery

    def fence(self) -> None:
        """A store refused a write of ours: we are fenced, for good."""
        if self.lease is not None:
            self.lease.lost = True
        self.lifecycle.end(TurnState.FENCED)

    async def _write(
        self,
        write: Write,
        store: object | None,
        fenced: Capability | None,
        attempt: Callable[[], Awaitable[bool]],
    ) -> None:
        """``attempt`` the write, retried through an outage; ``fenced`` is the
        capability by which ``store`` fences it in the write itself (without
        it, the lease is renewed just before: a seed-only store)."""
        while True:
            if not self.lifecycle.allows(write):
                raise FencedError(
                    f"{self._message_id}: a {self.lifecycle.state} turn writes no {write}"
                )
            try:
                if fenced is not None and not supports(store, fenced):
                    await self._renew()  # a seed-only store: the check before the write
                accepted = await attempt()
            except StoreUnavailableError:
                if not self._may_still_own():
                    raise
                logger.warning(
                    "turn %s: %s failed (store unavailable), will retry", self._message_id, write
                )
                await asyncio.sleep(self._retry_interval)
                continue
            except FencedError:
                self.fence()
                raise
            if not accepted:
                self.fence()
                raise FencedError(f"{self._message_id}: the store refused its {write}")
            return

    def _may_still_own(self) -> bool:
        """Whether a retry may still write as the owner: the lease has been renewed
        within the dead threshold (the heartbeat batch keeps renewing it)."""
        if self.lifecycle.ended:
            return False
        if self.lease is None:
            return True
        return self._clock() - self.lease.renewed_at <= self._dead_after

    async def _renew(self) -> None:
        if self.lease is not None:
            await self.lease.renew()


async def _accepted(write: Awaitable[None]) -> bool:
    """Run a lease write that raises ``FencedError`` when refused, as a bool."""
    try:
        await write
    except FencedError:
        return False
    return True
