"""The producer's ownership lease on a conversation, kept in the supervision store.

Claiming bumps the epoch; every later write the producer makes is guarded by
that epoch. The first refused write fences the producer for good: it stops and
writes nothing more anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
)

Clock = Callable[[], datetime]


_LONG_AGO = datetime(1970, 1, 1, tzinfo=UTC)


class LeaseLostError(Exception):
    """This producer no longer owns the turn (a takeover, a cancel, a newer turn)."""


@dataclass(frozen=True)
class ConversationKey:
    tenant: str
    requester_uuid: str
    session_id: str


class ClaimRefusedError(Exception):
    """The conversation is occupied by a live turn, or the claim lost a race."""

    def __init__(self, occupant: ChatStreamSupervision | None) -> None:
        super().__init__(f"conversation occupied by {occupant.message_id if occupant else '?'}")
        self.occupant = occupant


class Lease:
    """A held claim: (message_id, epoch) on one conversation's supervision row."""

    def __init__(
        self,
        store: ChatStreamSupervisionStore,
        key: ConversationKey,
        message_id: str,
        epoch: int,
        clock: Clock,
    ) -> None:
        self.store = store
        self.key = key
        self.message_id = message_id
        self.epoch = epoch
        self._clock = clock
        self.lost = False
        self.renewed_at = clock()
        """When the row last held a heartbeat of ours that the store accepted."""

    async def _swap(self, status: ChatStreamStatus, heartbeat_at: datetime | None = None) -> bool:
        row = ChatStreamSupervision(
            status=status,
            heartbeat_at=heartbeat_at or self._clock(),
            message_id=self.message_id,
            epoch=self.epoch,
        )
        k = self.key
        return await self.store.compare_and_swap(
            k.tenant, k.requester_uuid, k.session_id, self.epoch, row
        )

    async def renew(self) -> None:
        """Stamp a fresh RUNNING heartbeat, or raise LeaseLostError (and stay fenced)."""
        if self.lost:
            raise LeaseLostError(self.message_id)
        now = self._clock()
        if not await self._swap(ChatStreamStatus.RUNNING, heartbeat_at=now):
            self.lost = True
            raise LeaseLostError(self.message_id)
        self.renewed_at = now

    async def finish(self, status: ChatStreamStatus) -> None:
        """Write the terminal status, still guarded by the epoch."""
        if self.lost:
            raise LeaseLostError(self.message_id)
        if not await self._swap(status):
            self.lost = True
            raise LeaseLostError(self.message_id)

    async def abandon(self) -> None:
        """Hand the turn off: a RUNNING row with a heartbeat from long ago reads as
        dead to every reader at once, so a resume elsewhere need not wait out the
        dead threshold. The lease is given up either way."""
        if self.lost:
            raise LeaseLostError(self.message_id)
        self.lost = True
        if not await self._swap(ChatStreamStatus.RUNNING, heartbeat_at=_LONG_AGO):
            raise LeaseLostError(self.message_id)

    async def release(self) -> None:
        """Remove the row if it is still exactly ours (clean-up after the grace period)."""
        k = self.key
        await self.store.delete(
            k.tenant, k.requester_uuid, k.session_id, self.message_id, self.epoch
        )


async def claim(
    store: ChatStreamSupervisionStore,
    key: ConversationKey,
    message_id: str,
    clock: Clock,
    dead_after: timedelta,
    *,
    takeover_of: str | None = None,
) -> Lease:
    """Claim the conversation for ``message_id`` at the next epoch.

    A new turn may claim a conversation with no row, a finished row, or a dead
    one. A takeover (``takeover_of``) may claim only a dead row of that turn.
    Raises ClaimRefusedError naming the occupant otherwise, or when another
    replica's compare-and-swap won the race.
    """
    current = await store.read(key.tenant, key.requester_uuid, key.session_id)
    now = clock()
    if current is not None and current.is_live(now, dead_after):
        raise ClaimRefusedError(current)
    if takeover_of is not None and (
        current is None or current.message_id != takeover_of or not current.is_dead(now, dead_after)
    ):
        raise ClaimRefusedError(current)
    expected = None if current is None else current.epoch
    epoch = 1 if current is None else current.epoch + 1
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=now, message_id=message_id, epoch=epoch
    )
    if not await store.compare_and_swap(
        key.tenant, key.requester_uuid, key.session_id, expected, row
    ):
        raise ClaimRefusedError(await store.read(key.tenant, key.requester_uuid, key.session_id))
    return Lease(store, key, message_id, epoch, clock)
