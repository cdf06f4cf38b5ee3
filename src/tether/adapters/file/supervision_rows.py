"""A supervision row's files, and the steps run on them under the row's lock.

The row's document is the ``ChatStreamSupervision`` plus ``"last_epoch"``, the
highest epoch ever written for the conversation, and the conversation's ids
(``IDS``: a long id is hashed in the path). Each turn the row holds has an
index file naming the row's session (``find_session``). A locked step reads,
checks and writes within one ``flock`` (``_files.locked_row``); reads take no
lock, as replace makes every read whole. ``LocalFileChatStreamSupervisionStore``
runs these steps in threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tether.adapters.file._files import (
    locked_row,
    read_json,
    remove_empty_directories,
    remove_file,
    write_json,
)
from tether.adapters.file._paths import RowFiles
from tether.adapters.file.kept_numbers import KeptNumber
from tether.domain.chat_stream_supervision_store import ChatStreamSupervision
from tether.domain.store_errors import StoreCorruptedError

LAST_EPOCH = "last_epoch"
"""The key of the highest epoch ever written, kept in the row's document."""
IDS = ("tenant", "requester_uuid", "session_id")
"""The keys of the conversation's ids, kept in the row's document (a long id
is hashed in the file's path, so the path alone does not always give it back)."""


@dataclass(frozen=True)
class SupervisionRowFiles(RowFiles):
    """A row's files, its session, where the index file of each of its turns
    lives, and where its epoch is kept once the row is gone."""

    session_id: str
    index: Callable[[str], RowFiles]
    kept: KeptNumber


def find_session(
    index: RowFiles, files_of: Callable[[str], RowFiles], message_id: str
) -> str | None:
    """The session named by the turn's ``index`` file, if its row (found by
    ``files_of``) still holds ``message_id``."""
    document = read_json(index.data)
    if not isinstance(document, dict) or not isinstance(document.get("session_id"), str):
        return None
    session_id: str = document["session_id"]
    row = read_row(files_of(session_id).data)
    return session_id if row is not None and row.message_id == message_id else None


def document_of(
    tenant: str, requester_uuid: str | None, session_id: str, supervision: ChatStreamSupervision
) -> dict[str, Any]:
    """What a swap stores (but ``"last_epoch"``): the row, then its conversation's ids."""
    ids = dict(zip(IDS, (tenant, requester_uuid or "", session_id), strict=True))
    return {**supervision.model_dump(mode="json"), **ids}


@dataclass(frozen=True)
class _Stored:
    """What a locked step finds of a conversation."""

    row: ChatStreamSupervision | None
    last_epoch: int
    """The highest epoch ever written: the row's document's, or, with no row,
    the kept one (and an earlier release's tombstone's, if there is one)."""
    named_tombstone: bool
    """Whether the row's path holds an earlier release's tombstone."""


def _load(files: SupervisionRowFiles) -> _Stored:
    """The row and the highest epoch ever written.

    A row's document holds the highest epoch: a claim with no row writes it
    above the kept one, which is only written as the row goes."""
    document = read_json(files.data)
    if document is None:
        return _Stored(None, files.kept.read(), named_tombstone=False)
    row, last_epoch = parse_row(files.data, document)
    if row is not None:
        return _Stored(row, last_epoch, named_tombstone=False)
    return _Stored(None, max(last_epoch, files.kept.read()), named_tombstone=True)


def parse_row(path: Path, document: Any) -> tuple[ChatStreamSupervision | None, int]:
    """The row of a document read at ``path`` (None: an earlier release's
    tombstone) and the highest epoch it holds."""
    if isinstance(document, dict) and document.keys() == {LAST_EPOCH}:
        return None, _epoch_of(path, document)
    try:
        row = ChatStreamSupervision.model_validate(document)
    except ValidationError as exc:
        raise StoreCorruptedError(
            f"{path} does not hold a valid ChatStreamSupervision ({exc}); left as is"
        ) from exc
    kept = _epoch_of(path, document) if LAST_EPOCH in document else 0
    return row, max(row.epoch, kept)


def _epoch_of(path: Path, document: dict[str, Any]) -> int:
    epoch = document[LAST_EPOCH]
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise StoreCorruptedError(f"{path} holds a {LAST_EPOCH} that is no integer; left as is")
    return epoch


def read_row(path: Path) -> ChatStreamSupervision | None:
    """The row at ``path``, or None (no document, or an earlier release's tombstone)."""
    # Lock-free, as the store's reads are: the row alone needs no kept epoch.
    document = read_json(path)
    return None if document is None else parse_row(path, document)[0]


def read_last_epoch(files: SupervisionRowFiles) -> int:
    """The highest epoch ever written for the row's conversation; 0 if none."""
    # Lock-free: a delete keeps the epoch before it removes the row, so a
    # read that finds no row finds the kept epoch.
    return _load(files).last_epoch


def compare_and_swap(
    files: SupervisionRowFiles, expected_epoch: int | None, epoch: int, document: dict[str, Any]
) -> bool:
    """Write ``document`` (a row at ``epoch``) iff the row's epoch is
    ``expected_epoch`` (None: no row, and ``epoch`` above every one granted)."""
    with locked_row(files):
        stored = _load(files)
        current, last_epoch = stored.row, stored.last_epoch
        if (None if current is None else current.epoch) != expected_epoch:
            _keep_named_tombstone(files, stored)
            return False
        if current is None and epoch <= last_epoch:
            _keep_named_tombstone(files, stored)
            return False  # that epoch was granted before the row was removed
        written = {**document, LAST_EPOCH: max(last_epoch, epoch)}
        message_id = document["message_id"]
        if current is None or current.message_id != message_id:
            # A new turn in the row (not a heartbeat): index it first, so a
            # crash between the two leaves an index the lookup checks anyway.
            write_json(
                files.index(message_id).data, {"session_id": files.session_id}, durable=False
            )
        write_json(files.data, written, durable=False)
        if current is not None and current.message_id != message_id:
            _unindex(files, current.message_id)
        return True


def _unindex(files: SupervisionRowFiles, message_id: str) -> None:
    """Remove the index file of ``message_id`` if it names this row, and the
    directories (named after the tenant and the user) it leaves empty."""
    index = files.index(message_id)
    document = read_json(index.data)
    if isinstance(document, dict) and document.get("session_id") == files.session_id:
        remove_file(index.data, durable=False)
        remove_empty_directories(index.data, index.top)


def swap_all(
    batch: Sequence[tuple[SupervisionRowFiles, int | None, int, dict[str, Any]]],
) -> list[bool]:
    """``compare_and_swap`` of each ``(files, expected_epoch, epoch, document)``, in order."""
    return [
        compare_and_swap(files, expected, epoch, document)
        for files, expected, epoch, document in batch
    ]


def delete_row(files: SupervisionRowFiles, message_id: str, epoch: int) -> bool:
    """Remove the row iff it holds ``message_id`` at ``epoch``, keeping its epoch."""
    # ``locked_row``: with the row gone, its lock file and directories go too.
    with locked_row(files):
        stored = _load(files)
        current = stored.row
        if current is None or (current.message_id, current.epoch) != (message_id, epoch):
            _keep_named_tombstone(files, stored)
            return False
        # Kept first: the conversation's epochs outlive the row, also should
        # the process die between the two.
        files.kept.write(stored.last_epoch)
        remove_file(files.data, durable=False)
        _unindex(files, message_id)
        return True


def _keep_named_tombstone(files: SupervisionRowFiles, stored: _Stored) -> None:
    """Move an earlier release's tombstone, found at the row's path with no
    row to write there, under the conversation's tombstone."""
    if stored.named_tombstone:
        files.kept.write(stored.last_epoch)
        remove_file(files.data, durable=False)
