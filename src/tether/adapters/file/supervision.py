"""Supervision rows as JSON files, compare-and-swapped under a file lock."""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import os
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tether.adapters.file._files import parse_json, run_in_executor, run_in_thread
from tether.adapters.file._paths import (
    RowFiles,
    child_path,
    decode_component,
    encode_component,
    row_files,
    store_root,
)
from tether.adapters.file.kept_numbers import KeptNumbers
from tether.adapters.file.supervision_rows import (
    IDS,
    LAST_EPOCH,
    SupervisionRowFiles,
    compare_and_swap,
    delete_row,
    document_of,
    find_session,
    parse_row,
    read_last_epoch,
    read_row,
    swap_all,
)
from tether.adapters.flock_presence import FlockPresenceLock
from tether.adapters.unix_datagrams import DEAD_TURNS_KEY, UnixDatagramChannel, conversation_key
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
from tether.domain.tombstones import TombstoneKey

logger = logging.getLogger(__name__)

_SUPERVISION = "stream-supervision"


class LocalFileChatStreamSupervisionStore(ChatStreamSupervisionStore):
    """``ChatStreamSupervisionStore`` on a directory, correct across processes.

    One file per conversation,
    ``{base_path}/stream-supervision/{tenant}/{requester_uuid}/{session_id}.json``
    with every id escaped. ``compare_and_swap`` and ``delete`` hold an exclusive
    ``flock`` on the row's sibling ``.lock`` file across read, check and write, so
    any number of processes sharing the directory see one winner per epoch.
    Writes are atomic (replace) but not fsynced: the row is rewritten every
    second, and on one node an OS crash takes every producer down with it.

    The document is the row plus ``"last_epoch"``, the highest epoch ever written
    for the conversation, kept in the same replace as the row, and the
    conversation's ids (``"tenant"``, ``"requester_uuid"``, ``"session_id"``:
    a long id is hashed in the path). ``delete`` first keeps that epoch under
    the conversation's tombstone, in
    ``{base_path}/stream-supervision-epoch/{tombstone[:2]}/{tombstone}.json``
    as ``{"last_epoch": n}`` (``tether.adapters.file.kept_numbers``: a keyed hash,
    ``TETHER_TOMBSTONE_KEY``), then removes the document, so epochs outlive
    their row (``last_epoch``), a claim of a conversation with no row must be
    above it, and nothing left names the conversation. A document without
    the key (written before epochs were kept) counts its row's epoch; one
    holding only ``{"last_epoch": n}`` (a tombstone an earlier release left
    at the row's path) counts too, and moves under the tombstone the next
    time a locked step finds it with no row to write.

    ``find_by_message_id`` reads a small index file per turn,
    ``{base_path}/stream-supervision-by-message/{tenant}/{requester_uuid}/{message_id}.json``
    holding ``{"session_id": ...}``, written under the row's lock whenever a
    swap puts a new turn in the row (and the replaced turn's removed), removed
    with the row. ``delete`` also removes the row's lock file, and a step that
    leaves no row removes it too, with the directories named after the ids
    it leaves empty (``_files.locked_row``).

    ``list_stale_running`` scans the directory in one thread call: a document
    too small to be a RUNNING row (an earlier release's tombstone) is not even
    opened, and a document whose ``"status"`` is another, or whose
    ``"heartbeat_at"`` is not older than the bound, is skipped on a look at its
    bytes; only the turns it lists are parsed. Their ids come from the
    document; one written before documents kept them gives them from its path
    (but for a hashed, long id).

    ``compare_and_swap_many`` (a replica's heartbeats) runs the whole batch in
    one call on a thread of this store's own, each swap under its own row lock:
    a thousand thread hops per second would queue behind every other file
    write of the process (checkpoints and transcripts wait for fsync) in the
    default executor, and a late heartbeat reads as a dead producer.

    Push: a swap that changes a row's epoch, and a delete, are announced to
    the replicas on this host through Unix datagrams in ``wake_directory``
    (default: ``.tether-wake`` beside ``base_path``, shared with the recording store
    beside it; ``tether.adapters.unix_datagrams``); heartbeats are not.
    """

    def __init__(
        self,
        base_path: str | os.PathLike[str],
        *,
        wake_directory: str | os.PathLike[str] | None = None,
        tombstone_key: TombstoneKey | None = None,
    ) -> None:
        """``tombstone_key`` names the files of the epochs kept after a row
        (default: ``TETHER_TOMBSTONE_KEY``; see ``domain.tombstones``)."""
        self._base = store_root(base_path)
        self._epochs = KeptNumbers(
            self._base, _EPOCHS, LAST_EPOCH, tombstone_key or TombstoneKey.from_env()
        )
        self._heartbeats: ThreadPoolExecutor | None = None
        self._channel = UnixDatagramChannel(wake_directory or self._base.parent / ".tether-wake")

    async def compare_and_swap(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        expected_epoch: int | None,
        supervision: ChatStreamSupervision,
    ) -> bool:
        """Write ``supervision`` iff the row's epoch is ``expected_epoch`` (None: no row)."""
        files = self._files(tenant, requester_uuid, session_id)
        document = document_of(tenant, requester_uuid, session_id, supervision)
        wrote = await run_in_thread(
            compare_and_swap, files, expected_epoch, supervision.epoch, document
        )
        swap = SupervisionSwap(tenant, requester_uuid, session_id, expected_epoch, supervision)
        self._announce([swap], [wrote])
        return wrote

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        """Each swap guarded on its own row, in order, in one thread call."""
        if not swaps:
            return []
        batch = [
            (
                self._files(s.tenant, s.requester_uuid, s.session_id),
                s.expected_epoch,
                s.supervision.epoch,
                document_of(s.tenant, s.requester_uuid, s.session_id, s.supervision),
            )
            for s in swaps
        ]
        if self._heartbeats is None:
            # Created on first use: a store that never batches starts no thread.
            self._heartbeats = ThreadPoolExecutor(1, thread_name_prefix="tether-file-heartbeats")
        wrote = await run_in_executor(self._heartbeats, functools.partial(swap_all, batch))
        self._announce(swaps, wrote)
        return wrote

    def _announce(self, swaps: Sequence[SupervisionSwap], wrote: list[bool]) -> None:
        # A new owner or a verdict; heartbeats (the same epoch) go unannounced.
        self._channel.announce(
            (conversation_key(s.tenant, s.requester_uuid, s.session_id), StreamChange.SUPERVISION)
            for s, written in zip(swaps, wrote, strict=True)
            if written and s.supervision.epoch != s.expected_epoch
        )

    async def open(self) -> None:
        """Record the tombstone key's check value, or refuse a store kept
        under another key (``StoreError``), before the first request."""
        await run_in_thread(self._epochs.verify)

    async def announce_dead_turns(self) -> None:
        """Wake the takeover loop of every replica on this host."""
        self._channel.announce([(DEAD_TURNS_KEY, StreamChange.SUPERVISION)])

    def subscribe_dead_turns(self) -> ChangeSubscription:
        """Hear ``announce_dead_turns`` of every replica on this host."""
        return self._channel.subscribe(DEAD_TURNS_KEY)

    async def aclose(self) -> None:
        """Wait for a heartbeat batch still on the store's thread, then stop it.

        A batch whose caller was cancelled (a shutdown) goes on writing in its
        thread; closing waits for it, so nothing lands after the store is closed.
        """
        executor, self._heartbeats = self._heartbeats, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True)
        await self._channel.aclose()

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        """The current row, or None. Lock-free: replace makes every read whole."""
        files = self._files(tenant, requester_uuid, session_id)
        return await run_in_thread(read_row, files.data)

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written, also after the row was deleted; 0 if none.
        Lock-free, as ``read``."""
        files = self._files(tenant, requester_uuid, session_id)
        return await run_in_thread(read_last_epoch, files)

    async def delete(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_id: str,
        epoch: int,
    ) -> None:
        """Remove the row iff it still holds exactly ``message_id`` at ``epoch``."""
        files = self._files(tenant, requester_uuid, session_id)
        if await run_in_thread(delete_row, files, message_id, epoch):
            key = conversation_key(tenant, requester_uuid, session_id)
            self._channel.announce([(key, StreamChange.SUPERVISION)])

    async def find_by_message_id(
        self, tenant: str, requester_uuid: str | None, message_id: str
    ) -> str | None:
        """The requester's session whose row holds ``message_id``: the turn's
        index file, checked against the row it names. Lock-free, as ``read``."""
        index = self._index(tenant, requester_uuid, message_id)
        return await run_in_thread(
            find_session,
            index,
            lambda session: self._files(tenant, requester_uuid, session),
            message_id,
        )

    async def list_stale_running(self, heartbeat_before: datetime, limit: int) -> list[StaleTurn]:
        """RUNNING rows whose heartbeat is older than ``heartbeat_before``, oldest
        first, at most ``limit``: a scan of the directory, in one thread call.
        A naive bound is UTC, as a row's heartbeat is; a document that could be
        a listed row but cannot be read raises ``StoreCorruptedError``."""
        if limit <= 0:
            return []
        if heartbeat_before.tzinfo is None:
            heartbeat_before = heartbeat_before.replace(tzinfo=UTC)
        root = child_path(self._base, _SUPERVISION)
        return await run_in_thread(_list_stale, root, heartbeat_before, limit)

    def presence_lock(self) -> PresenceLock:
        """An ``flock`` per replica under the store's directory: the processes
        sharing the directory share a host (``tether.runtime.presence``)."""
        return FlockPresenceLock(child_path(self._base, _PRESENCE))

    def _files(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> SupervisionRowFiles:
        files = row_files(self._base, _SUPERVISION, tenant, requester_uuid or "", session_id)
        return SupervisionRowFiles(
            files.data,
            files.lock,
            files.top,
            session_id,
            functools.partial(self._index, tenant, requester_uuid),
            self._epochs.of(tenant, requester_uuid, session_id),
        )

    def _index(self, tenant: str, requester_uuid: str | None, message_id: str) -> RowFiles:
        return row_files(self._base, _BY_MESSAGE, tenant, requester_uuid or "", message_id)


_BY_MESSAGE = "stream-supervision-by-message"
_EPOCHS = "stream-supervision-epoch"
_PRESENCE = "replica-presence"


# The listing's look at a document's bytes, before any parse. A swap writes
# compact JSON (``write_json``), and in JSON ``":"`` never occurs inside a
# string, so these match only the keys themselves; a document they do not
# match is parsed.
_STATUS = re.compile(rb'"status":"([^"\\]*)"')
_HEARTBEAT = re.compile(rb'"heartbeat_at":"([^"\\]*)"')
_RUNNING = ChatStreamStatus.RUNNING.value.encode("ascii")
_SMALLEST_RUNNING_ROW = len(b'{"status":"running","heartbeat_at":0,"message_id":"","epoch":0}')
"""No document shorter than this is a valid RUNNING row, however written (the
shortest value of each required key); an earlier release's tombstone is."""


def _list_stale(root: Path, before: datetime, limit: int) -> list[StaleTurn]:
    stale = (
        turn
        for tenant in _directories(root)
        for requester in _directories(tenant)
        for entry in _entries(requester)
        if entry.name.endswith(".json") and not entry.name.startswith(".")
        if (turn := _stale_turn(entry, before)) is not None
    )
    return heapq.nsmallest(limit, stale, key=lambda turn: turn.supervision.heartbeat_at)


def _entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            yield from entries
    except (FileNotFoundError, NotADirectoryError):
        return  # no row was ever written there


def _directories(directory: Path) -> Iterator[Path]:
    for entry in _entries(directory):
        if entry.is_dir():
            yield Path(entry.path)


def _stale_turn(entry: os.DirEntry[str], before: datetime) -> StaleTurn | None:
    """The row of ``entry`` if it is RUNNING with a heartbeat before ``before``."""
    path = Path(entry.path)
    try:
        if entry.stat().st_size < _SMALLEST_RUNNING_ROW:
            return None
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    status = _STATUS.search(raw)
    if status is not None:
        if status[1] != _RUNNING:
            return None
        heartbeat = _HEARTBEAT.search(raw)
        seen = None if heartbeat is None else _instant(heartbeat[1])
        if seen is not None and seen >= before:
            return None
    document = parse_json(path, raw)
    row, _ = parse_row(path, document)
    if row is None or row.status is not ChatStreamStatus.RUNNING or row.heartbeat_at >= before:
        return None
    ids = _ids(path, document)
    if ids is None:
        logger.warning(
            "%s: a turn whose producer died, written before rows kept their ids; its "
            "hashed path does not give them back, so it waits for a client's resume",
            path,
        )
        return None
    tenant, requester_uuid, session_id = ids
    return StaleTurn(tenant, requester_uuid or None, session_id, row)


def _instant(text: bytes) -> datetime | None:
    """An ISO heartbeat as an aware datetime; None when it does not read as one
    (the document is then parsed, as a pydantic model reads it)."""
    try:
        moment = datetime.fromisoformat(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return moment if moment.tzinfo is not None else None


def _ids(path: Path, document: dict[str, Any]) -> tuple[str, str, str] | None:
    """The conversation of the row at ``path``: from its document, or (for a
    document written before it kept them) from the path, where no id is hashed."""
    names = (path.parent.parent.name, path.parent.name, path.name.removesuffix(".json"))
    kept = [document.get(key) for key in IDS]
    if all(isinstance(value, str) for value in kept):
        tenant, requester_uuid, session_id = (str(value) for value in kept)
        if tuple(map(encode_component, (tenant, requester_uuid, session_id))) != names:
            raise StoreCorruptedError(f"{path} holds the ids of another conversation; left as is")
        return tenant, requester_uuid, session_id
    decoded = [decode_component(name) for name in names]
    if None in decoded:
        return None
    tenant, requester_uuid, session_id = (str(value) for value in decoded)
    return tenant, requester_uuid, session_id
