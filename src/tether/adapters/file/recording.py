"""Stream recordings as JSON files, epoch-fenced under a file lock."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tether.adapters.file._files import (
    locked_row,
    read_json,
    remove_file,
    run_in_thread,
    write_json,
)
from tether.adapters.file._paths import RowFiles, row_files, store_root
from tether.adapters.file.kept_numbers import KeptNumber, KeptNumbers
from tether.adapters.unix_datagrams import PushesOnThisHost, UnixDatagramChannel, conversation_key
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
    StreamChange,
)
from tether.domain.store_errors import StoreCorruptedError
from tether.domain.tombstones import TombstoneKey

_FENCE = "fence"
"""The key of the conversation's fence, kept in the record's document."""
_RECORDING = "stream-recording"
_FENCES = "stream-recording-fence"


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
    accepted put or ``fence``, written in the same replace. With no record,
    the fence is kept under the conversation's tombstone, in
    ``{base_path}/stream-recording-fence/{tombstone[:2]}/{tombstone}.json`` as
    ``{"fence": n}`` (``tether.adapters.file.kept_numbers``: a keyed hash,
    ``TETHER_TOMBSTONE_KEY``): ``delete`` writes it there before it removes the
    document, and a ``fence`` of a conversation with no record raises it
    there, so the fence outlives the record and nothing left names the
    conversation. A document without the key (written before fences were
    kept) is fenced at its record's epoch; one holding only ``{"fence": n}``
    (an earlier release's, at the record's path) fences too, and moves under
    the tombstone the next time a locked step finds it with no record to
    write. A step that leaves no record removes the lock file too, with the
    directories named after the ids it leaves empty (``_files.locked_row``).

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
        tombstone_key: TombstoneKey | None = None,
    ) -> None:
        """``tombstone_key`` names the files of the fences kept after a record
        (default: ``TETHER_TOMBSTONE_KEY``; see ``domain.tombstones``)."""
        self._base = store_root(base_path)
        self._fences = KeptNumbers(
            self._base, _FENCES, _FENCE, tombstone_key or TombstoneKey.from_env()
        )
        self._channel = UnixDatagramChannel(wake_directory or self._base.parent / ".tether-wake")

    async def open(self) -> None:
        """Record the tombstone key's check value, or refuse a store kept
        under another key (``StoreError``), before the first request."""
        await run_in_thread(self._fences.verify)

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

    def _files(self, tenant: str, requester_uuid: str | None, session_id: str) -> _RowFiles:
        files = row_files(self._base, _RECORDING, tenant, requester_uuid or "", session_id)
        kept = self._fences.of(tenant, requester_uuid, session_id)
        return _RowFiles(files.data, files.lock, files.top, kept)


@dataclass(frozen=True)
class _RowFiles(RowFiles):
    """A record's files, and where its fence is kept once the record is gone."""

    kept: KeptNumber


@dataclass(frozen=True)
class _Stored:
    """What a locked step finds of a conversation."""

    record: RecordedStreamEvent | None
    fence: int
    """The record's document's fence, or, with no record, the kept one (and
    an earlier release's fence document's, if there is one)."""
    named_fence: bool
    """Whether the record's path holds an earlier release's fence document."""


def _load(files: _RowFiles) -> _Stored:
    """The record and the conversation's fence.

    A record's document holds the fence: a put with no record writes it at
    or above the kept one, which is only written while there is no record."""
    path = files.data
    document = read_json(path)
    if document is None:
        return _Stored(None, files.kept.read(), named_fence=False)
    if isinstance(document, dict) and document.keys() == {_FENCE}:
        return _Stored(None, max(_fence_of(path, document), files.kept.read()), named_fence=True)
    return _Stored(*_parse(path, document), named_fence=False)


def _parse(path: Path, document: Any) -> tuple[RecordedStreamEvent, int]:
    """The record of a document read at ``path``, and the fence it holds."""
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
    # Lock-free, as the store's reads are: the record alone needs no kept fence.
    document = read_json(path)
    if document is None or (isinstance(document, dict) and document.keys() == {_FENCE}):
        return None
    return _parse(path, document)[0]


def _put(files: _RowFiles, epoch: int, document: dict[str, Any]) -> None:
    # ``locked_row``: a refused put of a conversation with no record leaves
    # no lock file named after it.
    with locked_row(files):
        stored = _load(files)
        fence = stored.fence
        if epoch < fence:
            _keep_named_fence(files, stored)
            raise RecordingFencedError(
                f"recording is fenced at epoch {fence}; a write at epoch {epoch} is refused"
            )
        write_json(files.data, {**document, _FENCE: epoch}, durable=False)


def _put_all(batch: Sequence[tuple[_RowFiles, int, dict[str, Any]]]) -> list[bool]:
    results: list[bool] = []
    for files, epoch, document in batch:
        try:
            _put(files, epoch, document)
        except RecordingFencedError:
            results.append(False)
        else:
            results.append(True)
    return results


def _fence(files: _RowFiles, epoch: int) -> None:
    with locked_row(files):
        stored = _load(files)
        if stored.record is not None:
            if epoch > stored.fence:  # a fence never goes down
                document = stored.record.model_dump(mode="json")
                write_json(files.data, {**document, _FENCE: epoch}, durable=False)
            return
        # A fence never goes down; an earlier release's fence document moves.
        if epoch > stored.fence or stored.named_fence:
            files.kept.write(max(epoch, stored.fence))
        if stored.named_fence:
            remove_file(files.data, durable=False)


def _delete(files: _RowFiles, message_id: str) -> bool:
    # ``locked_row``: with the record gone, its lock file and directories go too.
    with locked_row(files):
        stored = _load(files)
        record = stored.record
        if record is None or record.message_id != message_id:
            _keep_named_fence(files, stored)
            return False
        # Only the fence stays, kept first: a paused producer must not record
        # again, also should this process die between the two.
        files.kept.write(stored.fence)
        remove_file(files.data, durable=False)
        return True


def _keep_named_fence(files: _RowFiles, stored: _Stored) -> None:
    """Move an earlier release's fence document, found at the record's path
    with no record to write there, under the conversation's tombstone."""
    if stored.named_fence:
        files.kept.write(stored.fence)
        remove_file(files.data, durable=False)
