"""Supervision rows in PostgreSQL: every write one epoch-guarded statement (a claim's in a
transaction of its own)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import DictRow
from pydantic import ValidationError

from tether.adapters.postgres import queries, queries_supervision
from tether.adapters.postgres._keys import (
    DEAD_TURNS_KEY,
    check_ids,
    session_key,
    written_per_item,
)
from tether.adapters.postgres._store import PostgresStore
from tether.adapters.postgres.presence import PostgresPresenceLock
from tether.domain.chat_stream_recording_store import ChangeSubscription
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    PresenceLock,
    StaleTurn,
    SupervisionSwap,
)
from tether.domain.store_errors import StoreCorruptedError, StoreError

# A batch with claims is sent again when a claim turned out stale (see
# ``_StaleClaimError``); each retry follows the commit that made it stale, which
# its fresh snapshot then sees, so a second attempt almost always settles it.
_STALE_ATTEMPTS = 3


class _StaleClaimError(Exception):
    """A claim passed the epoch check of its statement's snapshot, but a higher or
    equal epoch was committed meanwhile: raised inside the claim's transaction,
    so that the claim is rolled back."""


class PostgresChatStreamSupervisionStore(PostgresStore, ChatStreamSupervisionStore):
    """``ChatStreamSupervisionStore`` on PostgreSQL, correct across any number of replicas.

    Table ``tether_stream_supervision``, one row per conversation. Each write is a
    single statement whose guard and write PostgreSQL performs atomically: a claim
    is ``INSERT ... ON CONFLICT DO NOTHING``, a swap is ``UPDATE ... WHERE epoch =
    expected``, and a delete is ``DELETE ... WHERE message_id = ... AND epoch = ...``.
    Racing writers therefore see exactly one winner per epoch. Every write that
    changes the epoch (a claim, a takeover, a cancel, a verdict, a hand-off) and
    every delete sends ``pg_notify`` for the conversation in the same statement,
    which is what wakes followers on other replicas; a heartbeat (a swap at the
    same epoch) sends none.

    Epochs only grow: ``tether_stream_supervision_epoch`` keeps the highest
    epoch ever written per conversation, raised by every claim and takeover in
    the same statement as the row, and kept when ``delete`` removes the row. A
    claim (``expected_epoch=None``) whose epoch is not above it is refused. A
    claim is the one write that runs in a transaction: its insert checks the
    epoch in the statement's snapshot, and the epoch table's upsert in the same
    statement, which locks and re-reads the newest epoch, rolls it back in the
    rare race where a higher epoch committed in between.

    Claims, takeovers and status changes are durable commits. Heartbeats (a
    RUNNING swap at the same epoch) skip the fsync wait; see ``PostgresDatabase``.
    """

    def for_another_loop(self) -> PostgresChatStreamSupervisionStore:
        """This store on a database of one connection of its own (see the base class)."""
        return type(self)(self._database.with_one_connection())

    async def announce_dead_turns(self) -> None:
        """A NOTIFY that wakes every replica's takeover loop (see the base class)."""
        payload = f"{DEAD_TURNS_KEY.hex()}:{queries.SUPERVISION_CHANGE}"
        await self._database.execute(queries.PUBLISH, {"payloads": [payload]})

    def subscribe_dead_turns(self) -> ChangeSubscription:
        """Hear ``announce_dead_turns`` on the database's shared LISTEN connection
        (starting it if needed; while it is down, ``wait`` sleeps: the loop scans)."""
        return self._database.subscribe(DEAD_TURNS_KEY)

    def presence_lock(self) -> PresenceLock:
        """A session-level advisory lock per replica, on a connection of its own
        (``tether.adapters.postgres.presence``)."""
        return PostgresPresenceLock(self._database)

    async def compare_and_swap(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        expected_epoch: int | None,
        supervision: ChatStreamSupervision,
    ) -> bool:
        """Write ``supervision`` iff the row's epoch is ``expected_epoch`` (None: no
        row, and ``supervision.epoch`` above every epoch ever written), atomically
        with that check; the epoch table is raised in the same transaction."""
        params = _row_params(tenant, requester_uuid, session_id, supervision)
        if expected_epoch is None:
            return await self._claim(params)
        params["expected_epoch"] = expected_epoch
        params["relaxed_commit"] = _is_heartbeat(expected_epoch, supervision)
        row = await self._database.fetch_one(queries_supervision.SWAP_SUPERVISION, params)
        return row is not None and row["written"] == 1

    async def _claim(self, params: dict[str, Any]) -> bool:
        async def claim(cursor: AsyncCursor[DictRow]) -> bool:
            await cursor.execute(queries_supervision.CLAIM_SUPERVISION, params)
            row = await cursor.fetchone()
            if row is None or row["written"] != 1:
                return False
            if row["raised"] != 1:
                raise _StaleClaimError
            return True

        try:
            return await self._database.transact(claim)
        except _StaleClaimError:
            # The epoch was granted meanwhile: the claim is refused, and undone.
            return False

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        """Independent compare-and-swaps in one round trip; one result per swap, in order.

        One statement over ``unnest()`` arrays, each swap guarded on its own row
        and claims on the epoch table too, as in ``compare_and_swap``. Swaps of
        the same conversation are applied in order: the batch is cut into rounds
        where no conversation repeats, one statement each (so a batch of distinct
        conversations, the heartbeat case, is one round trip). A round with a
        claim runs in a transaction, sent again if a claim in it was stale.
        """

        async def write_round(batch: list[tuple[int, Any, bytes]]) -> list[Any]:
            params = _batch_params(batch)
            if all(swap.expected_epoch is not None for _, swap, _ in batch):
                # No claim, nothing to roll back: one autocommit statement.
                return await self._database.fetch_all(
                    queries_supervision.SWAP_SUPERVISION_MANY, params
                )
            return await self._claim_round(params)

        return await written_per_item(swaps, write_round)

    async def _claim_round(self, params: dict[str, Any]) -> list[DictRow]:
        async def write(cursor: AsyncCursor[DictRow]) -> list[DictRow]:
            await cursor.execute(queries_supervision.SWAP_SUPERVISION_MANY, params)
            rows = await cursor.fetchall()
            if any(row["stale"] for row in rows):
                raise _StaleClaimError
            return rows

        for _ in range(_STALE_ATTEMPTS):
            try:
                return await self._database.transact(write)
            except _StaleClaimError:
                continue  # rolled back whole; the next snapshot refuses the stale claim
        raise StoreError(
            "a batch of supervision claims kept racing newer epochs; nothing was written, retry"
        )

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written for the conversation, ``0`` when none;
        kept when the row is deleted."""
        key = session_key(tenant, requester_uuid, session_id)
        row = await self._database.fetch_one(
            queries_supervision.LAST_SUPERVISION_EPOCH, {"key": key}
        )
        return 0 if row is None else int(row["epoch"])

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        """The current row, or None."""
        key = session_key(tenant, requester_uuid, session_id)
        row = await self._database.fetch_one(queries_supervision.READ_SUPERVISION, {"key": key})
        if row is None:
            return None
        try:
            return ChatStreamSupervision.model_validate(row)
        except ValidationError as error:
            raise StoreCorruptedError(
                f"tether_stream_supervision row for {(tenant, requester_uuid, session_id)!r} "
                f"is not a valid supervision row ({error}); left as is"
            ) from error

    async def find_by_message_id(
        self, tenant: str, requester_uuid: str | None, message_id: str
    ) -> str | None:
        """The requester's session whose row holds ``message_id``, or None: one
        read by the ``tether_stream_supervision_by_message`` index."""
        try:
            check_ids(tenant, requester_uuid or "", message_id)
        except ValueError:
            return None  # an id no text column can hold is in no row
        row = await self._database.fetch_one(
            queries_supervision.FIND_SUPERVISION_BY_MESSAGE,
            {"message_id": message_id, "tenant": tenant, "requester_uuid": requester_uuid or ""},
        )
        return None if row is None else str(row["session_id"])

    async def list_stale_running(self, heartbeat_before: datetime, limit: int) -> list[StaleTurn]:
        """RUNNING rows whose heartbeat is older than ``heartbeat_before``, oldest
        first, at most ``limit``: one ordered read of the partial index
        ``tether_stream_supervision_running_by_heartbeat``, which stops at the
        first heartbeat not older, so live turns cost nothing. A naive bound is
        UTC, as a row's heartbeat is; a listed row that cannot be read back
        raises ``StoreCorruptedError``."""
        if limit <= 0:
            return []
        if heartbeat_before.tzinfo is None:
            heartbeat_before = heartbeat_before.replace(tzinfo=UTC)
        rows = await self._database.fetch_all(
            queries_supervision.LIST_STALE_SUPERVISION,
            {"heartbeat_before": heartbeat_before, "limit": limit},
        )
        return [_stale_turn(row) for row in rows]

    async def server_time(self) -> datetime:
        """The server's clock (``clock_timestamp()``), in UTC: one round trip."""
        row = await self._database.fetch_one(queries_supervision.SERVER_TIME, {})
        if row is None or not isinstance(row["now"], datetime):
            raise StoreError("PostgreSQL did not answer clock_timestamp() with a time")
        now: datetime = row["now"]
        return now.astimezone(UTC)

    async def delete(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_id: str,
        epoch: int,
    ) -> None:
        """Remove the row iff it still holds exactly ``message_id`` at ``epoch``,
        atomically with that check; its epoch stays in the epoch table."""
        check_ids(message_id)
        key = session_key(tenant, requester_uuid, session_id)
        await self._database.execute(
            queries_supervision.DELETE_SUPERVISION,
            {"key": key, "message_id": message_id, "epoch": epoch},
        )


def _stale_turn(row: DictRow) -> StaleTurn:
    ids = (row["tenant"], row["requester_uuid"], row["session_id"])
    try:
        supervision = ChatStreamSupervision.model_validate(
            {
                field: row[field]
                for field in ("status", "heartbeat_at", "message_id", "epoch", "producer")
            }
        )
    except ValidationError as error:
        raise StoreCorruptedError(
            f"tether_stream_supervision row for {ids!r} is not a valid supervision row "
            f"({error}); left as is"
        ) from error
    return StaleTurn(ids[0], ids[1] or None, ids[2], supervision)


def _is_heartbeat(expected_epoch: int | None, supervision: ChatStreamSupervision) -> bool:
    # Only a renewal of the lease already held may skip the fsync wait; a claim,
    # a takeover or a terminal status must survive a server crash.
    return expected_epoch == supervision.epoch and supervision.status is ChatStreamStatus.RUNNING


def _check_row_ids(supervision: ChatStreamSupervision) -> None:
    # The row's text columns besides the ids of its key (``session_key`` checks those).
    check_ids(supervision.message_id, supervision.producer or "")


def _row_params(
    tenant: str,
    requester_uuid: str | None,
    session_id: str,
    supervision: ChatStreamSupervision,
) -> dict[str, Any]:
    _check_row_ids(supervision)
    return {
        "key": session_key(tenant, requester_uuid, session_id),
        "tenant": tenant,
        "requester_uuid": requester_uuid or "",
        "session_id": session_id,
        "status": supervision.status.value,
        "heartbeat_at": supervision.heartbeat_at,
        "message_id": supervision.message_id,
        "epoch": supervision.epoch,
        "producer": supervision.producer,
    }


def _batch_params(swaps: list[tuple[int, SupervisionSwap, bytes]]) -> dict[str, Any]:
    for _, swap, _ in swaps:
        _check_row_ids(swap.supervision)
    return {
        "keys": [key for _, _, key in swaps],
        "tenants": [swap.tenant for _, swap, _ in swaps],
        "requester_uuids": [swap.requester_uuid or "" for _, swap, _ in swaps],
        "session_ids": [swap.session_id for _, swap, _ in swaps],
        "expected_epochs": [swap.expected_epoch for _, swap, _ in swaps],
        "statuses": [swap.supervision.status.value for _, swap, _ in swaps],
        "heartbeats": [swap.supervision.heartbeat_at for _, swap, _ in swaps],
        "message_ids": [swap.supervision.message_id for _, swap, _ in swaps],
        "epochs": [swap.supervision.epoch for _, swap, _ in swaps],
        "producers": [swap.supervision.producer for _, swap, _ in swaps],
        "relaxed_commit": all(
            _is_heartbeat(swap.expected_epoch, swap.supervision) for _, swap, _ in swaps
        ),
    }
