"""Stream recordings as JSON files, epoch-fenced under a file lock."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tether.adapters._files import (
    RowFiles,
    exclusive_lock,
    read_json,
    remove_lock_file,
    row_files,
    run_in_thread,
    store_root,
    write_json,
)
from tether.adapters.unix_datagrams import PushesOnThisHost, UnixDatagramChannel, conversation_key
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
    StreamChange,
)
from tether.domain.store_errors import StoreCorruptedError

_FENCE = "fence"
"""The key of the conversation's fence, kept in the record's document."""


class LocalFileChatStreamRecordingStore(PushesOnThisHost, ChatStreamRecordingStore):
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

    The document is the record plus ``"fence"``, the highest epoch of any
    accepted put or ``fence``, written in the same replace. ``delete`` and a
    ``fence`` of a conversation with no record leave a document holding only
    ``{"fence": n}``, so the fence outlives the record. A document without the
    key (written before fences were kept) is fenced at its record's epoch.
    ``delete`` also removes the lock file once no record is left.

    Push: every accepted put and every delete that removed a record is
    announced to the replicas on this host as Unix datagrams in
    ``wake_directory`` (default: ``.tether-wake`` beside ``base_path``, where the
    supervision store beside it announces too; see
    ``tether.adapters.unix_datagrams``), and so are watches and deltas.
    """

    def __init__(
        self,
        base_path: str | os.PathLike[str],
        *,
        wake_directory: str | os.PathLike[str] | None = None,
    ) -> None:
        self._base = store_root(base_path)
        self._channel = UnixDatagramChannel(wake_directory or self._base.parent / ".tether-wake")

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the stored epoch is higher."""
        files = self._files(tenant, requester_uuid, session_id)
        document = event.model_dump(mode="json")
        await run_in_thread(_put, files, event.epoch, document)
        self._announce([(tenant, requester_uuid, session_id)])

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
        written = await run_in_thread(_put_all, batch)
        self._announce(
            (put.tenant, put.requester_uuid, put.session_id)
            for put, wrote in zip(puts, written, strict=True)
            if wrote
        )
        return written

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """The stored record, or None. Lock-free: replace makes every read whole."""
        files = self._files(tenant, requester_uuid, session_id)
        return await run_in_thread(_read_record, files.data)

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record iff it still belongs to ``message_id``."""
        files = self._files(tenant, requester_uuid, session_id)
        if await run_in_thread(_delete, files, message_id):
            self._announce([(tenant, requester_uuid, session_id)])

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse later puts below ``epoch``; the record is unchanged."""
        files = self._files(tenant, requester_uuid, session_id)
        await run_in_thread(_fence, files, epoch)

    async def aclose(self) -> None:
        """Close this store's socket (it has nothing else open)."""
        await self._channel.aclose()

    def _announce(self, conversations: Iterable[tuple[str, str | None, str]]) -> None:
        self._channel.announce(
            (conversation_key(*conversation), StreamChange.RECORDING)
            for conversation in conversations
        )

    def _files(self, tenant: str, requester_uuid: str | None, session_id: str) -> RowFiles:
        return row_files(self._base, "stream-recording", tenant, requester_uuid or "", session_id)


def _load(path: Path) -> tuple[RecordedStreamEvent | None, int]:
    """The record (None: no record, or only a fence) and the conversation's fence."""
    document = read_json(path)
    if document is None:
        return None, 0
    if isinstance(document, dict) and document.keys() == {_FENCE}:
        return None, _fence_of(path, document)
    try:
        record = RecordedStreamEvent.model_validate(document)
    except ValidationError as exc:
        raise StoreCorruptedError(
            f"{path} does not hold a valid RecordedStreamEvent ({exc}); left as is"
        ) from exc
    kept = _fence_of(path, document) if _FENCE in document else 0
    return record, max(record.epoch, kept)


def _fence_of(path: Path, document: dict[str, Any]) -> int:
    fence = document[_FENCE]
    if not isinstance(fence, int) or isinstance(fence, bool):
        raise StoreCorruptedError(f"{path} holds a {_FENCE} that is no integer; left as is")
    return fence


def _read_record(path: Path) -> RecordedStreamEvent | None:
    return _load(path)[0]


def _put(files: RowFiles, epoch: int, document: dict[str, Any]) -> None:
    with exclusive_lock(files.lock):
        _, fence = _load(files.data)
        if epoch < fence:
            raise RecordingFencedError(
                f"recording is fenced at epoch {fence}; a write at epoch {epoch} is refused"
            )
        write_json(files.data, {**document, _FENCE: epoch}, durable=False)


def _put_all(batch: Sequence[tuple[RowFiles, int, dict[str, Any]]]) -> list[bool]:
    results: list[bool] = []
    for files, epoch, document in batch:
        try:
            _put(files, epoch, document)
        except RecordingFencedError:
            results.append(False)
        else:
            results.append(True)
    return results


def _fence(files: RowFiles, epoch: int) -> None:
    with exclusive_lock(files.lock):
        current, fence = _load(files.data)
        if epoch <= fence:
            return  # a fence never goes down
        document = {} if current is None else current.model_dump(mode="json")
        write_json(files.data, {**document, _FENCE: epoch}, durable=False)


def _delete(files: RowFiles, message_id: str) -> bool:
    removed = False
    with exclusive_lock(files.lock):
        current, fence = _load(files.data)
        if current is not None and current.message_id == message_id:
            # Only the fence stays: a paused producer must not record again.
            write_json(files.data, {_FENCE: fence}, durable=False)
            current, removed = None, True
        if current is None:
            # Nothing left to guard but the fence: the lock file goes too.
            remove_lock_file(files.lock)
    return removed
