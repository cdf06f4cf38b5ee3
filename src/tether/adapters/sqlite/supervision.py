"""Supervision rows, compare-and-swapped on their epoch by single statements."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import ValidationError

from tether.adapters.flock_presence import FlockPresenceLock
from tether.adapters.sqlite import _codec, queries
from tether.adapters.sqlite._codec import RowKey
from tether.adapters.sqlite._store import SQLiteStore, wake_channel
from tether.adapters.sqlite.database import Lane, SQLiteDatabase
from tether.adapters.unix_datagrams import DEAD_TURNS_KEY, conversation_key
from tether.domain.chat_stream_recording_store import ChangeSubscription, StreamChange
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    PresenceLock,
    StaleTurn,
    SupervisionSwap,
)
from tether.domain.store_errors import StoreCorruptedError


class SQLiteChatStreamSupervisionStore(SQLiteStore, ChatStreamSupervisionStore):
    """``ChatStreamSupervisionStore`` in the ``stream_supervision`` table.

    The epoch guard is in the statement itself: a claim is ``INSERT ... SELECT
    ... WHERE epoch > last epoch ON CONFLICT DO NOTHING``, any other swap
    ``UPDATE ... WHERE epoch = expected``, a delete ``DELETE ... WHERE
    message_id = ? AND epoch = ?``; the row count says whether it wrote. Each
    runs in a ``BEGIN IMMEDIATE`` transaction on the stream lane (atomic, not
    fsynced: the row is rewritten every second). ``compare_and_swap_many`` runs
    a whole batch of swaps in one transaction, each still guarded by its own
    epoch.

    Epochs only grow: every write that succeeds also raises the conversation's
    row in ``stream_epoch``, in the same transaction, and ``delete`` leaves
    that row, so ``last_epoch`` outlives the supervision row and a claim can
    never reuse an epoch granted before the row was removed.

    A heartbeat is stored as ``isoformat()`` text (``heartbeat_at``, what reads
    return); SQLite derives integer microseconds since 1970 from it
    (``heartbeat_us``, a generated column), which SQL orders by:
    ``list_stale_running`` is one range read of the ``(status, heartbeat_us)``
    index.

    Push: every write that changes a row's epoch (a claim, a takeover, a
    cancel, a verdict) and every delete is announced, once committed, to the
    replicas sharing the database (``tether.adapters.unix_datagrams``), where
    the recording store's ``subscribe`` hears it; heartbeats are not. So is
    ``announce_dead_turns``.
    """

    def __init__(self, database: SQLiteDatabase) -> None:
        super().__init__(database)
        self._channel = wake_channel(database)

    def presence_lock(self) -> PresenceLock:
        """An ``flock`` per replica beside the database file, which every
        replica sharing it reaches on the same host (``tether.runtime.presence``)."""
        path = self._database.path
        return FlockPresenceLock(path.with_name(f"{path.name}.presence"))

    async def compare_and_swap(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        expected_epoch: int | None,
        supervision: ChatStreamSupervision,
    ) -> bool:
        """Write ``supervision`` iff the row's epoch is ``expected_epoch`` (None: no
        row, and ``supervision.epoch`` above ``last_epoch``), atomically with the
        check; an accepted write raises ``last_epoch`` in the same transaction."""
        swap = SupervisionSwap(tenant, requester_uuid, session_id, expected_epoch, supervision)
        (wrote,) = await self._database.write(Lane.STREAM, lambda c: _swap_all(c, [swap]))
        self._announce_swaps([swap], [wrote])
        return wrote

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        """Every swap in one transaction (one lock, one commit); one result per
        swap, in order. A later swap of the same row sees the earlier ones."""
        if not swaps:
            return []
        batch = list(swaps)
        wrote = await self._database.write(Lane.STREAM, lambda c: _swap_all(c, batch))
        self._announce_swaps(batch, wrote)
        return wrote

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written for the conversation, also after its row
        was deleted; ``0`` when none was."""
        where = RowKey(tenant, requester_uuid, session_id).params()
        found = await self._database.read(
            Lane.STREAM, lambda c: c.execute(queries.SUPERVISION_LAST_EPOCH, where).fetchone()
        )
        return 0 if found is None else int(found[0])

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        """The current row, or None; a row that cannot be read back raises
        ``StoreCorruptedError``."""
        row = RowKey(tenant, requester_uuid, session_id)
        return await self._database.read(Lane.STREAM, lambda c: _read(c, row))

    async def find_by_message_id(
        self, tenant: str, requester_uuid: str | None, message_id: str
    ) -> str | None:
        """The requester's session whose row holds ``message_id``, or None: one
        read by the ``stream_supervision_by_message`` index."""
        values = {
            "tenant": _codec.key(tenant),
            "user": _codec.key(requester_uuid),
            "message_id": _codec.key(message_id),
        }
        found = await self._database.read(
            Lane.STREAM,
            lambda c: c.execute(queries.SUPERVISION_FIND_BY_MESSAGE, values).fetchone(),
        )
        if found is None:
            return None
        return _codec.text(found[0], "a stream_supervision row's session_id")

    async def list_stale_running(self, heartbeat_before: datetime, limit: int) -> list[StaleTurn]:
        """RUNNING rows whose heartbeat is older than ``heartbeat_before``, oldest
        first, at most ``limit``: one read, in order, of the
        ``stream_supervision_by_heartbeat`` index. A naive bound is UTC, as a
        row's heartbeat is; a listed row that cannot be read back raises
        ``StoreCorruptedError``."""
        if limit <= 0:
            return []  # SQLite reads a negative LIMIT as none
        if heartbeat_before.tzinfo is None:
            heartbeat_before = heartbeat_before.replace(tzinfo=UTC)
        values = {
            "running": ChatStreamStatus.RUNNING.value,
            "before_us": _codec.microseconds(heartbeat_before),
            "limit": limit,
        }
        found = await self._database.read(
            Lane.STREAM, lambda c: c.execute(queries.SUPERVISION_LIST_STALE, values).fetchall()
        )
        return [_stale(*columns) for columns in found]

    async def delete(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_id: str,
        epoch: int,
    ) -> None:
        """Remove the row iff it still holds exactly ``message_id`` at ``epoch``;
        its epoch stays, as ``last_epoch``."""
        values = {
            **RowKey(tenant, requester_uuid, session_id).params(),
            "message_id": _codec.key(message_id),
            "epoch": epoch,
        }
        removed = await self._database.write(
            Lane.STREAM, lambda c: c.execute(queries.SUPERVISION_DELETE, values).rowcount
        )
        if removed:
            key = conversation_key(tenant, requester_uuid, session_id)
            self._channel.announce([(key, StreamChange.SUPERVISION)])

    async def announce_dead_turns(self) -> None:
        """Wake the takeover loop of every replica sharing the database."""
        self._channel.announce([(DEAD_TURNS_KEY, StreamChange.SUPERVISION)])

    def subscribe_dead_turns(self) -> ChangeSubscription:
        """Hear ``announce_dead_turns`` of every replica sharing the database."""
        return self._channel.subscribe(DEAD_TURNS_KEY)

    async def aclose(self) -> None:
        """Close this store's socket, and give back its hold on the database."""
        await self._channel.aclose()
        await super().aclose()

    def _announce_swaps(self, swaps: list[SupervisionSwap], wrote: list[bool]) -> None:
        # A new owner or a verdict; heartbeats (the same epoch) go unannounced.
        self._channel.announce(
            (conversation_key(s.tenant, s.requester_uuid, s.session_id), StreamChange.SUPERVISION)
            for s, written in zip(swaps, wrote, strict=True)
            if written and s.supervision.epoch != s.expected_epoch
        )


def _swap_all(connection: sqlite3.Connection, swaps: list[SupervisionSwap]) -> list[bool]:
    results: list[bool] = []
    for swap in swaps:
        row = swap.supervision
        values: dict[str, object] = {
            **RowKey(swap.tenant, swap.requester_uuid, swap.session_id).params(),
            "epoch": row.epoch,
            "message_id": _codec.key(row.message_id),
            "status": row.status.value,
            "heartbeat_at": row.heartbeat_at.isoformat(),
            "producer": row.producer,
        }
        if swap.expected_epoch is None:
            cursor = connection.execute(queries.SUPERVISION_CLAIM, values)
        else:
            values["expected_epoch"] = swap.expected_epoch
            cursor = connection.execute(queries.SUPERVISION_SWAP, values)
        wrote = cursor.rowcount == 1
        if wrote:
            # Same transaction as the write: no reader, and no claim after a
            # delete, can ever see the row's epoch without it being remembered.
            connection.execute(queries.SUPERVISION_RECORD_EPOCH, values)
        results.append(wrote)
    return results


def _read(connection: sqlite3.Connection, row: RowKey) -> ChatStreamSupervision | None:
    found = connection.execute(queries.SUPERVISION_READ, row.params()).fetchone()
    if found is None:
        return None
    return _supervision(row.describe("stream_supervision"), *found)


def _stale(
    tenant: object,
    requester_uuid: object,
    session_id: object,
    epoch: object,
    message_id: object,
    status: object,
    heartbeat_at: object,
    producer: object,
) -> StaleTurn:
    what = "a stream_supervision row"
    row = RowKey(
        _codec.text(tenant, f"{what}'s tenant"),
        _codec.text(requester_uuid, f"{what}'s requester_uuid"),
        _codec.text(session_id, f"{what}'s session_id"),
    )
    return StaleTurn(
        row.tenant,
        row.user or None,  # the anonymous requester is stored as ""
        row.session,
        _supervision(
            row.describe("stream_supervision"), epoch, message_id, status, heartbeat_at, producer
        ),
    )


def _supervision(
    what: str,
    epoch: object,
    message_id: object,
    status: object,
    heartbeat_at: object,
    producer: object,
) -> ChatStreamSupervision:
    try:
        return ChatStreamSupervision.model_validate(
            {
                "epoch": epoch,
                "message_id": _codec.text(message_id, what),
                "status": status,
                "heartbeat_at": heartbeat_at,
                "producer": producer,
            }
        )
    except ValidationError as exc:
        raise StoreCorruptedError(
            f"{what} does not hold a valid supervision row ({exc}); left as is"
        ) from exc
