"""Supervision rows as JSON files, compare-and-swapped under a file lock."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tether.adapters._files import (
    RowFiles,
    exclusive_lock,
    read_model,
    remove_file,
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


class LocalFileChatStreamSupervisionStore(ChatStreamSupervisionStore):
    """``ChatStreamSupervisionStore`` on a directory, correct across processes.

    One file per conversation,
    ``{base_path}/stream-supervision/{tenant}/{requester_uuid}/{session_id}.json``
    with every id escaped. ``compare_and_swap`` and ``delete`` hold an exclusive
    ``flock`` on the row's sibling ``.lock`` file across read, check and write, so
    any number of processes sharing the directory see one winner per epoch.
    Writes are atomic (replace) but not fsynced: the row is rewritten every
    second, and on one node an OS crash takes every producer down with it.

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
        return await run_in_thread(_compare_and_swap, files, expected_epoch, document)

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        """Each swap guarded on its own row, in order, in one thread call."""
        if not swaps:
            return []
        batch = [
            (
                self._files(s.tenant, s.requester_uuid, s.session_id),
                s.expected_epoch,
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
        return await run_in_thread(read_model, files.data, ChatStreamSupervision)

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

    def _files(self, tenant: str, requester_uuid: str | None, session_id: str) -> RowFiles:
        return row_files(self._base, "stream-supervision", tenant, requester_uuid or "", session_id)


def _compare_and_swap(files: RowFiles, expected_epoch: int | None, document: object) -> bool:
    with exclusive_lock(files.lock):
        current = read_model(files.data, ChatStreamSupervision)
        if (None if current is None else current.epoch) != expected_epoch:
            return False
        write_json(files.data, document, durable=False)
        return True


def _swap_all(batch: Sequence[tuple[RowFiles, int | None, object]]) -> list[bool]:
    return [_compare_and_swap(files, expected, document) for files, expected, document in batch]


def _delete(files: RowFiles, message_id: str, epoch: int) -> None:
    with exclusive_lock(files.lock):
        current = read_model(files.data, ChatStreamSupervision)
        if current is not None and (current.message_id, current.epoch) == (message_id, epoch):
            remove_file(files.data, durable=False)
