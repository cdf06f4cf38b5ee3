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
threshold, as they must.

A live replica can lose its lock: on PostgreSQL and Redis it lives in a
connection, which a database restart or a network reset ends. Others then
read its id gone, for good. So the replica checks its lock every heartbeat
interval (``keep``) and, once it finds it lost, holds a new one under a new
id and names that id in its rows from then on (its running turns' leases
are re-stamped, and their next heartbeat writes it). A turn found dead in
between costs a takeover, never a second producer: the taker's claim fences
the old producer at every store, as any takeover does. Without the new lock
(the database still down) the replica names no producer, and its turns are
judged by heartbeat age alone until it holds one again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Collection

from tether.domain.chat_stream_supervision_store import PresenceLock, is_replica_id
from tether.runtime import background

logger = logging.getLogger(__name__)


class ReplicaPresence:
    """This replica's presence id, and what it knows of other replicas'.

    Without a lock (the backend has none, or taking it failed) the replica
    names no producer in its rows, and readers judge its turns by heartbeat
    age alone, as before."""

    def __init__(self, lock: PresenceLock | None) -> None:
        self._lock = lock
        self.replica_id = uuid.uuid4().hex
        """The id this replica holds (or last tried to hold) its lock under."""
        self.producer: str | None = None
        """The id this replica writes into its rows: set while its lock is held."""
        self.gone: set[str] = set()
        """Producers found gone: a gone process never comes back, so this only grows
        (by one id per dead process or lost lock)."""
        self._own: set[str] = set()
        """Every id this replica has held or tried to: never tested, its rows are
        its own (one per lost lock, not per failed retry)."""
        self.lost = 0
        """How many times this replica found its lock lost (``keep``)."""
        self._on_change: Callable[[str | None], None] = lambda producer: None
        self._keeper: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def available(self) -> bool:
        return self._lock is not None

    async def start(
        self,
        *,
        keep_every: float | None = None,
        on_change: Callable[[str | None], None] = lambda producer: None,
    ) -> None:
        """Hold the lock; a failure leaves this replica on heartbeats alone
        until ``keep`` holds one. With ``keep_every`` (seconds), ``keep`` runs
        that often, and ``on_change`` is told each new ``producer``."""
        if self._lock is None:
            return
        self._on_change = on_change
        await self._hold()
        if keep_every is not None:
            self._keeper = asyncio.create_task(self._keep_every(keep_every), name="presence")

    async def _hold(self) -> None:
        assert self._lock is not None
        self._own.add(self.replica_id)
        try:
            await self._lock.hold(self.replica_id)
        except Exception:
            # Said once per outage, not at every retry.
            logger.log(
                logging.DEBUG if self._failing else logging.WARNING,
                "cannot hold a presence lock: this replica's turns will read dead only "
                "after the dead threshold until it holds one",
                exc_info=True,
            )
            self._failing = True
            self.producer = None
            return
        self._failing = False
        self.producer = self.replica_id

    async def keep(self) -> bool:
        """Check that the lock this replica names in its rows is still held; if
        it was lost (or never taken), hold a new one under a new id. Returns
        whether ``producer`` changed (``on_change`` has then been told)."""
        if self._lock is None:
            return False
        before = self.producer
        if before is not None and await self._lock.is_held():
            return False
        if before is not None:
            self.lost += 1
            logger.warning(
                "presence lock of replica %s lost (its connection ended): holding a new "
                "one; turns of this replica found dead meanwhile are taken over (fenced)",
                before,
            )
            await self._release_quietly()
            # Others may have read the lost id gone, for good: never hold it again.
            # An id never held (a hold that failed) is tried again as it is.
            self.replica_id = uuid.uuid4().hex
        await self._hold()
        if self.producer == before:
            return False
        self._on_change(self.producer)
        return True

    async def _keep_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.keep()
            except Exception:
                logger.warning("presence check failed; retrying", exc_info=True)

    async def _release_quietly(self) -> None:
        assert self._lock is not None
        try:
            await self._lock.release()
        except Exception:
            logger.debug("releasing a lost presence lock failed", exc_info=True)

    async def find_gone(self, producers: Collection[str]) -> set[str]:
        """Those of ``producers`` that are gone (and remember them)."""
        unknown = {p for p in producers if is_replica_id(p)} - self.gone - self._own
        if unknown and self._lock is not None:
            try:
                self.gone |= await self._lock.find_free(unknown)
            except Exception:
                # Not knowing is "held": the turns wait out the dead threshold.
                logger.warning("cannot test presence locks; retrying", exc_info=True)
        return {p for p in producers if p in self.gone}

    async def aclose(self) -> None:
        await background.stop(self._keeper)
        self._keeper = None
        if self._lock is not None and self.producer is not None:
            await self._lock.release()
        self.producer = None
