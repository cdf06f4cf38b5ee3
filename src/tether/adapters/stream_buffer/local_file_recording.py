"""Stream recordings as JSON files, epoch-fenced under a file lock."""

from __future__ import annotations

import os
from collections.abc import Sequence

from tether.adapters._files import (
    RowFiles,
    exclusive_lock,
    read_model,
    remove_file,
    row_files,
    run_in_thread,
    store_root,
    write_json,
)
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
)


class LocalFileChatStreamRecordingStore(ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` on a directory, correct across processes.

    One overwritten file per conversation,
    ``{base_path}/stream-recording/{tenant}/{requester_uuid}/{session_id}.json`` with every id
    escaped. ``put`` and ``delete`` hold an exclusive ``flock`` on the sibling
    ``.lock`` file while they read the stored record and decide, so the epoch
    fence cannot be raced. Writes replace the file atomically (followers never
    see a torn record) but skip fsync: a recording is rewritten every half second.
    ``put_many`` makes a batch of puts in one thread call, each under its own
    lock (the cost is the files, not the round trips: a thread hop per put
    would add a queue of a thousand hops behind the event loop's other work).
    """

    def __init__(self, base_path: str | os.PathLike[str]) -> None:
        self._base = store_root(base_path)

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the stored epoch is higher."""
        files = self._files(tenant, requester_uuid, session_id)
        document = event.model_dump(mode="json")
        await run_in_thread(_put, files, event.epoch, document)

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Every put, in order, in one thread call; True per written put, False per
        fenced one."""
        if not puts:
            return []
        batch = [
            (
                self._files(put.tenant, put.requester_uuid, put.session_id),
                put.event.epoch,
                put.event.model_dump(mode="json"),
            )
            for put in puts
        ]
        return await run_in_thread(_put_all, batch)

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """The stored record, or None. Lock-free: replace makes every read whole."""
        files = self._files(tenant, requester_uuid, session_id)
        return await run_in_thread(read_model, files.data, RecordedStreamEvent)

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record iff it still belongs to ``message_id``."""
        files = self._files(tenant, requester_uuid, session_id)
        await run_in_thread(_delete, files, message_id)

    def _files(self, tenant: str, requester_uuid: str | None, session_id: str) -> RowFiles:
        return row_files(self._base, "stream-recording", tenant, requester_uuid or "", session_id)


def _put(files: RowFiles, epoch: int, document: object) -> None:
    with exclusive_lock(files.lock):
        current = read_model(files.data, RecordedStreamEvent)
        if current is not None and epoch < current.epoch:
            raise RecordingFencedError(
                f"recording is at epoch {current.epoch}; a write at epoch {epoch} is fenced"
            )
        write_json(files.data, document, durable=False)


def _put_all(batch: Sequence[tuple[RowFiles, int, object]]) -> list[bool]:
    results: list[bool] = []
    for files, epoch, document in batch:
        try:
            _put(files, epoch, document)
        except RecordingFencedError:
            results.append(False)
        else:
            results.append(True)
    return results


def _delete(files: RowFiles, message_id: str) -> None:
    with exclusive_lock(files.lock):
        current = read_model(files.data, RecordedStreamEvent)
        if current is not None and current.message_id == message_id:
            remove_file(files.data, durable=False)
