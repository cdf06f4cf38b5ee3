"""The liveness record, send mutex and ownership lease of a conversation: one row each."""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, field_validator

from tether.domain.chat_stream_recording_store import ChangeSubscription

DEAD_AFTER = timedelta(seconds=3)
"""A RUNNING row whose heartbeat is older than this belongs to a dead producer."""


class ChatStreamStatus(StrEnum):
    RUNNING = "running"
    DONE = "done"
    ERRORED = "errored"
    CANCELLED = "cancelled"


class ChatStreamSupervision(BaseModel):
    """The row: which turn owns the conversation, at which lease epoch, alive when."""

    status: ChatStreamStatus
    heartbeat_at: datetime
    message_id: str
    epoch: int
    producer: str | None = None
    """The replica process producing the turn (``tether.runtime.presence``),
    when it holds a presence lock the others can test; None otherwise (a
    replica without one, a seed-only adapter, a row written before it)."""

    @field_validator("heartbeat_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        # Stores compare heartbeats written by different processes: keep them in UTC.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def is_dead(
        self,
        now: datetime,
        dead_after: timedelta = DEAD_AFTER,
        gone: Collection[str] = (),
    ) -> bool:
        """A crashed process cannot record its own death: the reader decides, by
        age, or at once when its producer is among the replicas known ``gone``
        (their presence lock was found free)."""
        if self.status is not ChatStreamStatus.RUNNING:
            return False
        return now - self.heartbeat_at > dead_after or (
            self.producer is not None and self.producer in gone
        )

    def is_live(
        self,
        now: datetime,
        dead_after: timedelta = DEAD_AFTER,
        gone: Collection[str] = (),
    ) -> bool:
        return self.status is ChatStreamStatus.RUNNING and not self.is_dead(now, dead_after, gone)


@dataclass(frozen=True)
class StaleTurn:
    """A RUNNING row whose heartbeat is old (see ``list_stale_running``), with
    the conversation it belongs to."""

    tenant: str
    requester_uuid: str | None
    session_id: str
    supervision: ChatStreamSupervision


@dataclass(frozen=True)
class SupervisionSwap:
    """One compare-and-swap of a batch (see ``compare_and_swap_many``)."""

    tenant: str
    requester_uuid: str | None
    session_id: str
    expected_epoch: int | None
    supervision: ChatStreamSupervision


_REPLICA_ID = re.compile(r"[0-9a-f]{32}")


def is_replica_id(value: str) -> bool:
    """Whether ``value`` can be a replica's presence id (uuid4 hex): anything
    else read from a row is not tested, and never becomes a path."""
    return _REPLICA_ID.fullmatch(value) is not None


class PresenceLock(ABC):
    """A backend's way to hold a replica's presence and to test others'
    (``tether.runtime.presence``).

    ``hold`` is called once, before the replica writes a row naming its id;
    ``find_free`` answers which of the given ids no live process holds. An
    id it cannot judge (it never saw its lock) is *not* free: a wrong "free"
    costs a needless takeover, a wrong "held" only the dead threshold."""

    @abstractmethod
    async def hold(self, replica_id: str) -> None:
        """Take the lock for ``replica_id`` until ``release`` or the process's death."""

    @abstractmethod
    async def find_free(self, replica_ids: Collection[str]) -> set[str]:
        """The ids among ``replica_ids`` whose lock no live process holds."""

    @abstractmethod
    async def release(self) -> None:
        """Give the lock up (a clean exit); idempotent."""

    async def is_held(self) -> bool:
        """Whether the lock taken by ``hold`` is still ours. A lock held through
        a connection (PostgreSQL, Redis) is lost with it: a database restart or
        a network reset ends the session while the replica lives, and other
        replicas then read it gone. The default suits a lock only the holder's
        death can free (``flock``)."""
        return True


class ChatStreamSupervisionStore(ABC):
    """One row per conversation; the only store with a hard atomicity requirement.

    Every write is a compare-and-swap on the epoch, so two replicas can never
    both claim a conversation, and a producer that was only slow finds out the
    moment its next heartbeat is refused. There is no stored "dead" status: the
    owner stamps a fresh RUNNING heartbeat every second and readers judge age.

    Epochs only grow, forever. The shipped backends remember the highest epoch
    ever written for a conversation beside its row, and keep it when the row
    is deleted or expires (``last_epoch``); a claim of a conversation with no
    row (``expected_epoch=None``) is refused unless its epoch is above it. A
    seed-only adapter forgets a conversation's epochs with its row: a producer
    paused past the grace period could then share an epoch with a new turn.
    """

    @abstractmethod
    async def compare_and_swap(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        expected_epoch: int | None,
        supervision: ChatStreamSupervision,
    ) -> bool:
        """Write ``supervision`` if and only if the current row's epoch equals
        ``expected_epoch`` (``None``: only if no row exists), atomically with that
        check. Returns whether it wrote."""

    @abstractmethod
    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        """The current row, or None."""

    @abstractmethod
    async def delete(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_id: str,
        epoch: int,
    ) -> None:
        """Remove the row only if it still holds exactly ``message_id`` at ``epoch``,
        atomically with that check. A row claimed by a newer turn is left alone."""

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        """Several independent compare-and-swaps; one result per swap, in order.

        Optional: lets a replica renew the heartbeats of all its turns in one
        round trip each second. Each swap keeps its own epoch guard; the batch
        is not a transaction across rows. The default runs the swaps
        concurrently (they touch different rows), so a slow store delays a
        batch by one operation's latency, not by the sum of them.
        """
        return list(
            await asyncio.gather(
                *(
                    self.compare_and_swap(
                        s.tenant, s.requester_uuid, s.session_id, s.expected_epoch, s.supervision
                    )
                    for s in swaps
                )
            )
        )

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written for the conversation, ``0`` when none;
        also after its row was deleted or expired.

        Optional. A shipped backend keeps it in the same atomic step as every
        write, and refuses a ``compare_and_swap`` with ``expected_epoch=None``
        whose epoch is not above it. The default reads the row, so a seed-only
        adapter starts again at 1 once a row is gone.
        """
        row = await self.read(tenant, requester_uuid, session_id)
        return 0 if row is None else row.epoch

    async def find_by_message_id(
        self, tenant: str, requester_uuid: str | None, message_id: str
    ) -> str | None:
        """The ``session_id`` of the requester's conversation whose current row
        holds ``message_id``, or None; never another requester's, nor a row
        that has since moved on to another turn or was deleted.

        Optional: lets a cancel name only the turn (``DELETE
        /chat/stream/{message_id}`` without ``session_id``, as the seed's SDK
        clients send it) and still find it on any replica. The shipped
        backends answer with one indexed read. The default raises
        ``NotImplementedError``: the server then asks for the ``session_id``.
        """
        raise NotImplementedError

    async def list_stale_running(self, heartbeat_before: datetime, limit: int) -> list[StaleTurn]:
        """RUNNING rows whose heartbeat is older than ``heartbeat_before``,
        oldest heartbeat first, at most ``limit`` of them.

        Optional: lets every replica find turns whose producer died (to take
        them over, or end them) without a client coming back, at a cost that
        does not grow with the number of live turns: the shipped backends
        answer from an index on the heartbeat (SQL), a sorted set (Redis), or
        a scan of one directory (the file store, on one host). The default
        raises ``NotImplementedError``: the server then leaves dead turns to
        the client-driven resume, and says so at start-up.
        """
        raise NotImplementedError

    async def announce_dead_turns(self) -> None:
        """Tell every replica's takeover loop that a turn reads dead now, so it
        looks at once instead of at its next scan: a replica says so after it
        hands a turn off (a drain), whose row it wrote dead on purpose. A
        killed replica writes nothing; its turns are found by the scan.

        Optional, and best effort: an announcement lost is a turn found at the
        next scan (``TETHER_TAKEOVER_SCAN_INTERVAL``). Backends with a push
        channel (PostgreSQL NOTIFY, Redis pub/sub) send it there; the default
        does nothing.
        """
        return None  # no channel: the scans find it

    def subscribe_dead_turns(self) -> ChangeSubscription:
        """Hear ``announce_dead_turns`` of every replica from now on (use it as
        ``async with``): the takeover loop waits on it between scans.

        Optional. The default announces nothing, so every ``wait`` sleeps out
        its ``max_wait`` and the loop scans at its interval. An announcement
        is heard as some change (which one carries no meaning); a spurious
        one (the channel reconnected) only costs a scan.
        """
        return ChangeSubscription()

    def for_another_loop(self) -> ChatStreamSupervisionStore:
        """A store of the same backend and place with connections of its own,
        not yet opened, for another thread's event loop: the replica renews
        its leases from a thread of their own (``tether.runtime.heartbeats``)
        so that a serving loop flooded with work cannot delay them past the
        dead threshold. The caller opens (``open()``, where the store has one)
        and closes (``aclose()``) it on that loop.

        Optional: ``NotImplementedError`` (the default) keeps the renewals on
        the serving loop.
        """
        raise NotImplementedError

    async def server_time(self) -> datetime:
        """The store's own clock, now, as an aware UTC datetime.

        Optional: where replicas on several hosts share the store, it is the
        one clock they all can read, so heartbeats are stamped and judged by
        it and replicas whose clocks disagree never read a live producer as
        dead, nor a dead one as alive (``tether.runtime.clock``). PostgreSQL
        answers ``clock_timestamp()``, Redis ``TIME``. The default raises
        ``NotImplementedError``: each replica then uses its own clock, which
        is exact on one host (SQLite, the file store) and as good as NTP
        keeps the hosts otherwise.
        """
        raise NotImplementedError

    def presence_lock(self) -> PresenceLock:
        """A lock by which replicas sharing this store tell a killed replica
        from a slow one (``tether.runtime.presence``): its turns then read
        dead at once instead of after the dead threshold.

        Optional: the file store and SQLite answer an ``flock`` on their host,
        PostgreSQL a session-level advisory lock. The default raises
        ``NotImplementedError``: turns read dead by heartbeat age alone.
        """
        raise NotImplementedError
