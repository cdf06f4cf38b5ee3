"""Supervision rows as JSON files, compare-and-swapped under a file lock."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tether.adapters._files import (
    RowFiles,
    exclusive_lock,
    read_json,
    remove_file,
    remove_lock_file,
    row_files,
    run_in_executor,
    run_in_thread,
    store_root,
    write_json,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    SupervisionSwap,
)
from tether.domain.store_errors import StoreCorruptedError

_LAST_EPOCH = "last_epoch"
"""The key of the highest epoch ever written, kept in the row's document."""


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
    for the conversation, kept in the same replace as the row. ``delete`` leaves
    a tombstone holding only ``{"last_epoch": n}``, so epochs outlive their row
    (``last_epoch``) and a claim of a conversation with no row must be above it.
    A document without the key (written before epochs were kept) counts its
    row's epoch.

    ``find_by_message_id`` reads a small index file per turn,
    ``{base_path}/stream-supervision-by-message/{tenant}/{requester_uuid}/{message_id}.json``
    holding ``{"session_id": ...}``, written under the row's lock whenever a
    swap puts a new turn in the row (and the replaced turn's removed), removed
    with the row. ``delete`` also removes the row's lock file.

    ``compare_and_swap_many`` (a replica's heartbeats) runs the whole batch in
    one call on a thread of this store's own, each swap under its own row lock:
    a thousand thread hops per second would queue behind every other file
    write of the process (checkpoints and transcripts wait for fsync) in the
    default executor, and a late heartbeat reads as a dead producer.
    """

    def __init__(self, base_path: str | os.PathLike[str]) -> None:
        self._base = store_root(base_path)
        self._heartbeats: ThreadPoolExecutor | None = None

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
        document = supervision.model_dump(mode="json")
        return await run_in_thread(
            _compare_and_swap, files, expected_epoch, supervision.epoch, document
        )

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        """Each swap guarded on its own row, in order, in one thread call."""
        if not swaps:
            return []
        batch = [
            (
                self._files(s.tenant, s.requester_uuid, s.session_id),
                s.expected_epoch,
                s.supervision.epoch,
                s.supervision.model_dump(mode="json"),
            )
            for s in swaps
        ]
        if self._heartbeats is None:
            # Created on first use: a store that never batches starts no thread.
            self._heartbeats = ThreadPoolExecutor(1, thread_name_prefix="tether-file-heartbeats")
        return await run_in_executor(self._heartbeats, functools.partial(_swap_all, batch))

    async def aclose(self) -> None:
        """Wait for a heartbeat batch still on the store's thread, then stop it.

        A batch whose caller was cancelled (a shutdown) goes on writing in its
        thread; closing waits for it, so nothing lands after the store is closed.
        """
        executor, self._heartbeats = self._heartbeats, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True)

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        """The current row, or None. Lock-free: replace makes every read whole."""
        files = self._files(tenant, requester_uuid, session_id)
        return await run_in_thread(_read_row, files.data)

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written, also after the row was deleted; 0 if none.
        Lock-free, as ``read``."""
        files = self._files(tenant, requester_uuid, session_id)
        return await run_in_thread(_read_last_epoch, files.data)

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
        await run_in_thread(_delete, files, message_id, epoch)

    async def find_by_message_id(
        self, tenant: str, requester_uuid: str | None, message_id: str
    ) -> str | None:
        """The requester's session whose row holds ``message_id``: the turn's
        index file, checked against the row it names. Lock-free, as ``read``."""
        index = self._index(tenant, requester_uuid, message_id)
        return await run_in_thread(
            _find, index, lambda session: self._files(tenant, requester_uuid, session), message_id
        )

    def _files(self, tenant: str, requester_uuid: str | None, session_id: str) -> _RowFiles:
        files = row_files(
            self._base, "stream-supervision", tenant, requester_uuid or "", session_id
        )
        return _RowFiles(
            files.data,
            files.lock,
            session_id,
            functools.partial(self._index, tenant, requester_uuid),
        )

    def _index(self, tenant: str, requester_uuid: str | None, message_id: str) -> Path:
        return row_files(self._base, _BY_MESSAGE, tenant, requester_uuid or "", message_id).data


_BY_MESSAGE = "stream-supervision-by-message"


@dataclass(frozen=True)
class _RowFiles(RowFiles):
    """A row's files, its session, and where the index file of each of its turns lives."""

    session_id: str
    index: Callable[[str], Path]


def _find(index: Path, files_of: Callable[[str], RowFiles], message_id: str) -> str | None:
    document = read_json(index)
    if not isinstance(document, dict) or not isinstance(document.get("session_id"), str):
        return None
    session_id: str = document["session_id"]
    row, _ = _load(files_of(session_id).data)
    return session_id if row is not None and row.message_id == message_id else None


def _load(path: Path) -> tuple[ChatStreamSupervision | None, int]:
    """The row (None: no row, or a tombstone) and the highest epoch ever written."""
    document = read_json(path)
    if document is None:
        return None, 0
    if isinstance(document, dict) and document.keys() == {_LAST_EPOCH}:
        return None, _epoch_of(path, document)
    try:
        row = ChatStreamSupervision.model_validate(document)
    except ValidationError as exc:
        raise StoreCorruptedError(
            f"{path} does not hold a valid ChatStreamSupervision ({exc}); left as is"
        ) from exc
    kept = _epoch_of(path, document) if _LAST_EPOCH in document else 0
    return row, max(row.epoch, kept)


def _epoch_of(path: Path, document: dict[str, Any]) -> int:
    epoch = document[_LAST_EPOCH]
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise StoreCorruptedError(f"{path} holds a {_LAST_EPOCH} that is no integer; left as is")
    return epoch


def _read_row(path: Path) -> ChatStreamSupervision | None:
    return _load(path)[0]


def _read_last_epoch(path: Path) -> int:
    return _load(path)[1]


def _compare_and_swap(
    files: _RowFiles, expected_epoch: int | None, epoch: int, document: dict[str, Any]
) -> bool:
    with exclusive_lock(files.lock):
        current, last_epoch = _load(files.data)
        if (None if current is None else current.epoch) != expected_epoch:
            return False
        if current is None and epoch <= last_epoch:
            return False  # that epoch was granted before the row was removed
        stored = {**document, _LAST_EPOCH: max(last_epoch, epoch)}
        message_id = document["message_id"]
        if current is None or current.message_id != message_id:
            # A new turn in the row (not a heartbeat): index it first, so a
            # crash between the two leaves an index the lookup checks anyway.
            write_json(files.index(message_id), {"session_id": files.session_id}, durable=False)
        write_json(files.data, stored, durable=False)
        if current is not None and current.message_id != message_id:
            _unindex(files, current.message_id)
        return True


def _unindex(files: _RowFiles, message_id: str) -> None:
    """Remove the index file of ``message_id`` if it names this row."""
    index = files.index(message_id)
    document = read_json(index)
    if isinstance(document, dict) and document.get("session_id") == files.session_id:
        remove_file(index, durable=False)


def _swap_all(batch: Sequence[tuple[_RowFiles, int | None, int, dict[str, Any]]]) -> list[bool]:
    return [
        _compare_and_swap(files, expected, epoch, document)
        for files, expected, epoch, document in batch
    ]


def _delete(files: _RowFiles, message_id: str, epoch: int) -> None:
    with exclusive_lock(files.lock):
        current, last_epoch = _load(files.data)
        if current is not None and (current.message_id, current.epoch) == (message_id, epoch):
            # A tombstone, not a removal: the conversation's epochs outlive the row.
            write_json(files.data, {_LAST_EPOCH: last_epoch}, durable=False)
            _unindex(files, message_id)
            current = None
        if current is None:
            # Nothing left to guard but the tombstone: the lock file goes too.
            remove_lock_file(files.lock)
