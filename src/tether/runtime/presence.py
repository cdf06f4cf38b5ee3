"""Presence: telling a killed replica from a slow one.

Heartbeats stop both when a replica is killed and when it is only slow (a
stalled loop, a SIGSTOP, a partition), so by heartbeats alone a reader must
wait out the dead threshold (3 s) before it may take a turn over. Where the
backend can tell that a *process* is gone, it need not wait:

- each replica holds a presence lock for its whole life, named by a replica
  id of its own (new at every start), and writes that id as the ``producer``
  of every supervision row it writes while it holds the lock;
- the operating system (an ``flock``, on the file store's or SQLite's host)
  or the database (a session-level advisory lock, PostgreSQL) releases the
  lock the moment the process dies, and never while it lives, however slow;
- a reader that finds a producer's lock free knows the producer is gone, for
  good (an id is never reused), and its RUNNING turns are dead at once
  (``ChatStreamSupervision.is_dead(..., gone=...)``).

A SIGSTOP'd or partitioned replica still holds its lock (PostgreSQL notices
a silent peer only after TCP keepalives), so its turns wait out the
threshold, as they must. A lock found free by mistake (the lock's own
connection to PostgreSQL broke while the replica lives) costs a takeover,
never a second producer: the taker's claim fences the old producer at every
store, as any takeover does.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection

from tether.domain.chat_stream_supervision_store import PresenceLock, is_replica_id

logger = logging.getLogger(__name__)


class ReplicaPresence:
    """This replica's presence id, and what it knows of other replicas'.

    Without a lock (the backend has none, or taking it failed) the replica
    names no producer in its rows, and readers judge its turns by heartbeat
    age alone, as before."""

    def __init__(self, lock: PresenceLock | None) -> None:
        self._lock = lock
        self.replica_id = uuid.uuid4().hex
        self.producer: str | None = None
        """The id this replica writes into its rows: set once its lock is held."""
        self.gone: set[str] = set()
        """Producers found gone: a gone process never comes back, so this only grows
        (by one id per dead process)."""

    @property
    def available(self) -> bool:
        return self._lock is not None

    async def start(self) -> None:
        """Hold the lock; a failure leaves this replica on heartbeats alone."""
        if self._lock is None:
            return
        try:
            await self._lock.hold(self.replica_id)
        except Exception:
            logger.warning(
                "cannot hold a presence lock: this replica's turns will read dead only "
                "after the dead threshold",
                exc_info=True,
            )
            return
        self.producer = self.replica_id

    async def find_gone(self, producers: Collection[str]) -> set[str]:
        """Those of ``producers`` that are gone (and remember them)."""
        unknown = {p for p in producers if is_replica_id(p)} - self.gone - {self.replica_id}
        if unknown and self._lock is not None:
            try:
                self.gone |= await self._lock.find_free(unknown)
            except Exception:
                # Not knowing is "held": the turns wait out the dead threshold.
                logger.warning("cannot test presence locks; retrying", exc_info=True)
        return {p for p in producers if p in self.gone}

    async def aclose(self) -> None:
        if self._lock is not None and self.producer is not None:
            await self._lock.release()
        self.producer = None
