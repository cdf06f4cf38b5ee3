"""The producer's ownership lease on a conversation, kept in the supervision store.

Claiming takes the next epoch; every later write the producer makes names
that epoch, and each store refuses it once a newer epoch has fenced it. The
first refused write fences the producer for good: it stops and writes nothing
more anywhere.

Every change of the row other than a heartbeat takes the next epoch (a claim,
a cancel, the terminal status, a hand-off), so a heartbeat, which writes at
its own epoch, can never undo one: a heartbeat batch that lands late is
refused instead of bringing a finished or handed-off turn back to life.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
)
from tether.runtime import conversation_row as rows
from tether.runtime.conversation_key import ConversationKey
from tether.runtime.conversation_row import LONG_AGO, Move, RowState

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]
RaiseFences = Callable[[int], Awaitable[None]]
"""Fence every other store of the conversation at an epoch (see ``fences``)."""
Producer = Callable[[], "str | None"]
BeforeGrant = Callable[[], Awaitable[None]]
"""A check made once the stores are fenced at the new epoch and before the
row is taken: what it reads can no longer change under an older epoch's
write, and raising refuses the claim with nothing written to the row."""
"""This replica's presence id now (``ReplicaPresence.producer``), or None."""

__all__ = ["ClaimRefusedError", "ConversationKey", "FencedError", "Lease", "claim"]


class FencedError(Exception):
    """This producer no longer owns the turn (a takeover, a cancel, a newer turn)."""


class TakeoverCause(StrEnum):
    """Why a dead turn changed producer (the ``cause`` of the takeover metrics)."""

    AUTOMATIC = "automatic"
    """A replica's takeover loop found it dead, with no client asking."""
    CLIENT = "client"
    """A client asked for the resume (``POST /chat/stream?resume=true``)."""
    DRAIN = "drain_handoff"
    """Its producer drained and handed it off (by the loop or a client alike)."""


@dataclass(frozen=True)
class Takeover:
    """What a takeover's claim found: how the turn died, and since when."""

    cause: TakeoverCause
    dead_since: datetime
    """When the turn first read dead: its last heartbeat plus the dead threshold,
    or, for a hand-off (which stamps no time), the moment of the claim."""


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
        takeover: Takeover | None = None,
        producer: Producer = lambda: None,
    ) -> None:
        self.store = store
        self.key = key
        self.message_id = message_id
        self.epoch = epoch
        """The epoch this lease was granted: every producer write names it."""
        self.row_epoch = epoch
        """The epoch of the row as we last wrote it (one more after our final write)."""
        self._clock = clock
        self.lost = False
        self.renewed_at = clock()
        """When the row last held a heartbeat of ours that the store accepted."""
        self.takeover = takeover
        """Set when this lease was taken from a dead producer."""
        self._producer = producer

    @property
    def producer(self) -> str | None:
        """This replica's presence id as it is now, written into every row of
        the lease: read at each write, so a lock held again under a new id
        (``tether.runtime.presence``) is named from the next write on."""
        return self._producer()

    async def _swap(
        self, status: ChatStreamStatus, *, heartbeat_at: datetime | None = None, bump: bool
    ) -> bool:
        new_epoch = self.epoch + 1 if bump else self.epoch
        now = heartbeat_at or self._clock()
        if status is ChatStreamStatus.RUNNING:
            row = rows.running(self.message_id, new_epoch, now, self.producer)
        else:
            row = rows.verdict(self.message_id, new_epoch, status, now)
        written = await rows.write(self.store, self.key, self.epoch, row)
        if written:
            self.row_epoch = new_epoch
        return written

    async def renew(self) -> None:
        """Stamp a fresh RUNNING heartbeat, or raise FencedError (and stay fenced)."""
        if self.lost:
            raise FencedError(self.message_id)
        now = self._clock()
        if not await self._swap(ChatStreamStatus.RUNNING, heartbeat_at=now, bump=False):
            self.lost = True
            raise FencedError(self.message_id)
        self.renewed_at = now

    async def advance(self) -> None:
        """Hold the row on at the next epoch with a fresh heartbeat, or raise
        FencedError: a move someone decided from an earlier reading of the
        row (one that read it dead, say) is refused from now on, which a
        heartbeat at the same epoch would not do. Once per lease."""
        if self.lost:
            raise FencedError(self.message_id)
        if not await self._swap(ChatStreamStatus.RUNNING, bump=True):
            self.lost = True
            raise FencedError(self.message_id)

    async def finish(self, status: ChatStreamStatus) -> None:
        """Write the terminal status at the next epoch, guarded by ours: no
        heartbeat of ours can overwrite it afterwards."""
        if self.lost:
            raise FencedError(self.message_id)
        if not await self._swap(status, bump=True):
            self.lost = True
            raise FencedError(self.message_id)

    async def abandon(self) -> None:
        """Hand the turn off: a RUNNING row at the next epoch with a heartbeat from
        long ago reads as dead to every reader at once, so a resume elsewhere
        need not wait out the dead threshold, and no late heartbeat of ours
        can make it look alive again. The lease is given up either way."""
        if self.lost:
            raise FencedError(self.message_id)
        self.lost = True
        if not await self._swap(ChatStreamStatus.RUNNING, heartbeat_at=LONG_AGO, bump=True):
            raise FencedError(self.message_id)
        # Other replicas' takeover loops look now, not at their next scan
        # (best effort: a lost announcement is a turn found by that scan).
        try:
            await self.store.announce_dead_turns()
        except Exception:
            logger.debug("announcing a hand-off failed", exc_info=True)

    async def pass_on(self, message_id: str) -> None:
        """End the turn by handing the conversation to the next queued turn,
        ``message_id``, in one write: that turn's RUNNING row at the next
        epoch, with a heartbeat from long ago and no producer, which reads
        dead at once. Whichever replica looks first starts it (this one, at
        once; any takeover loop; a client's status read), so no crash after
        this write leaves the queue waiting, as one between a verdict and the
        next turn's claim did. No heartbeat of ours can undo it. The row no
        longer names this turn: readers elsewhere hear ``gone`` rather than
        ``done`` (the turn's answer is in the transcript already)."""
        if self.lost:
            raise FencedError(self.message_id)
        row = rows.running(message_id, self.epoch + 1, LONG_AGO, None)
        if not await rows.write(self.store, self.key, self.epoch, row):
            self.lost = True
            raise FencedError(self.message_id)
        self.row_epoch = row.epoch

    async def delete_row(self) -> None:
        """Remove the row if it is still exactly as we left it (clean-up after
        the grace period); the store keeps the epoch."""
        await rows.delete(self.store, self.key, self.message_id, self.row_epoch)


async def claim(
    store: ChatStreamSupervisionStore,
    key: ConversationKey,
    message_id: str,
    clock: Clock,
    dead_after: timedelta,
    *,
    raise_fences: RaiseFences | None = None,
    takeover_of: str | None = None,
    automatic: bool = False,
    producer: Producer = lambda: None,
    gone: Collection[str] = (),
    before_grant: BeforeGrant | None = None,
) -> Lease:
    """Claim the conversation for ``message_id`` at the next epoch
    (``conversation_row``: ``CLAIM`` or ``TAKE_OVER``).

    A new turn may claim a ``FREE`` conversation (or one whose erase died
    half way), and the queued turn a row was passed on to may take that row.
    A new turn never claims a ``DEAD`` turn's row: that turn can still be
    resumed, and its caller decides (``handlers``). A takeover
    (``takeover_of``) may claim only a dead row of that turn. Raises
    ClaimRefusedError naming the occupant otherwise, or when another
    replica's compare-and-swap won the race. The lease of a takeover says its
    cause (``automatic`` when a replica's takeover loop claims) and since when
    the turn was dead. A row whose producer is among the replicas known
    ``gone`` (``tether.runtime.presence``) is dead whatever its heartbeat's
    age. Every row the lease writes names ``producer()`` as it is then.

    The other stores are fenced at the new epoch (``raise_fences``; none when
    the supervision row is all there is) *before* it is granted, so
    from the moment the grant is accepted no store takes a write of an older
    epoch. Fencing first is safe: a claim that then loses the race lost it to
    a claimant of the same epoch, and a claim is only made over a row whose
    producer is finished or dead.
    """
    reading = await rows.read(store, key)
    current = reading.row
    now = clock()
    state = rows.state_of(current, now, dead_after, gone)
    if takeover_of is not None:
        allowed = (
            rows.may(Move.TAKE_OVER, state)
            and current is not None
            and current.message_id == takeover_of
        )
    else:
        allowed = (
            rows.may(Move.CLAIM, state)
            or (state is RowState.DEAD and current is not None and current.message_id == message_id)
            or (state is RowState.ERASING and rows.is_stuck(current, now, dead_after))
        )
    if not allowed:
        raise ClaimRefusedError(current)
    lease = await take(store, key, reading, message_id, clock, raise_fences, producer, before_grant)
    if takeover_of is not None and current is not None:
        lease.takeover = _takeover(current, now, dead_after, automatic=automatic)
    return lease


async def take(
    store: ChatStreamSupervisionStore,
    key: ConversationKey,
    reading: rows.Reading,
    message_id: str,
    clock: Clock,
    raise_fences: RaiseFences | None,
    producer: Producer = lambda: None,
    before_grant: BeforeGrant | None = None,
) -> Lease:
    """Take the row as read (``reading``, from ``conversation_row.read``) for
    ``message_id`` at the next epoch, whatever holds it: the write of every
    move that claims (a claim, a takeover, a cancel, the reaper, an erase),
    the caller having decided by the table that the move is allowed. Raises
    ClaimRefusedError naming the new holder when the row moved on since it
    was read, and what ``before_grant`` raises (see ``BeforeGrant``)."""
    epoch = reading.epoch + 1
    if raise_fences is not None:
        await raise_fences(epoch)
    if before_grant is not None:
        await before_grant()
    row = rows.running(message_id, epoch, clock(), producer())
    expected = None if reading.row is None else reading.row.epoch
    if not await rows.write(store, key, expected, row):
        raise ClaimRefusedError(await store.read(key.tenant, key.requester_uuid, key.session_id))
    return Lease(store, key, message_id, epoch, clock, None, producer)


def _takeover(
    dead: ChatStreamSupervision, now: datetime, dead_after: timedelta, *, automatic: bool
) -> Takeover:
    if dead.heartbeat_at == LONG_AGO:
        return Takeover(TakeoverCause.DRAIN, now)
    cause = TakeoverCause.AUTOMATIC if automatic else TakeoverCause.CLIENT
    # Read dead by its producer's free presence lock, before the threshold:
    # the verdict is the claim's own moment (a close upper bound).
    return Takeover(cause, min(dead.heartbeat_at + dead_after, now))
