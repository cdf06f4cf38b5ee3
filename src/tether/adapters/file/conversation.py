"""Conversations as one durable JSON document each, for local work and single nodes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tether.adapters.conversation_record import (
    Append,
    Clock,
    ConversationRecord,
    Removal,
    page,
    stale_page,
    stamp,
    utc_now,
)
from tether.adapters.file._files import (
    locked_row,
    read_model,
    remove_file,
    run_in_thread,
    write_json,
)
from tether.adapters.file._paths import (
    RowFiles,
    child_path,
    encode_component,
    row_files,
    store_root,
)
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationPage,
    ConversationSummary,
    LastTurnStatus,
    normalize_owner,
)
from tether.domain.chat_message import ChatMessage, ConversationContext

_PREFIX = "conversations"


class LocalFileChatConversationStore(ChatConversationStore):
    """``ChatConversationStore`` on a directory, shared safely by any number of processes.

    One document per conversation, ``{base_path}/conversations/{tenant}/{session_id}.json``
    with every id escaped; it holds the messages and the metadata together, so
    one atomic replace changes both, and the fence (``fence_epoch``) with them.
    Every write holds an exclusive ``flock`` on the sibling ``.lock`` file across
    read, ownership check and write, and is durable (fsynced, directory too) when
    it returns. A step that leaves no document (a delete, a write to a missing
    conversation) removes the lock file too, and the tenant's directory if it
    leaves it empty (``_files.locked_row``): a deleted conversation leaves no
    file or directory named after its id or tenant. Its fence goes with it,
    as on the other backends. Listing scans the tenant's directory and reads each document:
    correct rather than fast, which suits local work and single nodes. ``clock``
    stamps ``created_at``/``updated_at``.
    """

    def __init__(self, base_path: str | os.PathLike[str], clock: Clock = utc_now) -> None:
        self._base = store_root(base_path)
        self._clock = clock

    async def append_messages(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        agent_identifier: str,
        messages: list[ChatMessage],
        user_roles: list[str] | None = None,
        user_tenants: list[str] | None = None,
        user_agent_id: str | None = None,
        bot_params: dict[str, Any] | None = None,
        last_turn_status: LastTurnStatus | None = None,
        create_if_absent: bool = True,
        conversation_context: ConversationContext | None = None,
    ) -> None:
        """Append ``messages``, creating the conversation unless ``create_if_absent`` is False."""
        change = Append(
            tenant=tenant,
            requester_uuid=requester_uuid,
            session_id=session_id,
            agent_identifier=agent_identifier,
            messages=messages,
            user_roles=user_roles,
            user_tenants=user_tenants,
            user_agent_id=user_agent_id,
            bot_params=bot_params,
            last_turn_status=last_turn_status,
            create_if_absent=create_if_absent,
            conversation_context=conversation_context,
        )
        await run_in_thread(self._append, self._files(tenant, session_id), change)

    async def append_fenced(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        agent_identifier: str,
        messages: list[ChatMessage],
        *,
        epoch: int,
        user_roles: list[str] | None = None,
        user_tenants: list[str] | None = None,
        bot_params: dict[str, Any] | None = None,
        last_turn_status: LastTurnStatus | None = None,
        create_if_absent: bool = True,
        conversation_context: ConversationContext | None = None,
    ) -> bool:
        """``append_messages`` fenced by ``epoch``, idempotent by ``message_id``,
        under the document's lock."""
        change = Append(
            tenant=tenant,
            requester_uuid=requester_uuid,
            session_id=session_id,
            agent_identifier=agent_identifier,
            messages=messages,
            user_roles=user_roles,
            user_tenants=user_tenants,
            user_agent_id=None,
            bot_params=bot_params,
            last_turn_status=last_turn_status,
            create_if_absent=create_if_absent,
            conversation_context=conversation_context,
        )
        return await run_in_thread(
            self._append_fenced, self._files(tenant, session_id), change, epoch
        )

    async def remove_fenced(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_ids: Sequence[str],
        *,
        epoch: int,
        last_turn_status: LastTurnStatus | None = None,
    ) -> bool:
        """Remove the messages with those ids, fenced by ``epoch`` (a rollback):
        read, fence check and one atomic replace under the document's lock, as
        ``append_fenced`` does; durable when it returns."""
        removal = Removal.of(requester_uuid, message_ids, last_turn_status)
        return await run_in_thread(
            self._remove_fenced, self._files(tenant, session_id), removal, epoch
        )

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Raise the conversation's fence to ``epoch``; a no-op when it is missing."""
        await run_in_thread(_fence, self._files(tenant, session_id), epoch)

    async def set_last_turn_status(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        last_turn_status: LastTurnStatus,
    ) -> None:
        """Set the last turn's status (owner only); a no-op when no conversation exists."""
        files = self._files(tenant, session_id)
        await run_in_thread(self._set_status, files, requester_uuid, last_turn_status)

    async def get_transcript(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> list[ChatMessage]:
        """The messages (owner, or anyone when shared); ``[]`` when missing."""
        record = await run_in_thread(
            _read_readable, self._files(tenant, session_id), requester_uuid
        )
        return [] if record is None else record.messages

    async def get_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ConversationSummary | None:
        """The summary (owner, or anyone when shared); None when missing."""
        record = await run_in_thread(
            _read_readable, self._files(tenant, session_id), requester_uuid
        )
        return None if record is None else record.summary()

    async def list_conversations(
        self,
        tenant: str,
        requester_uuid: str | None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """The requester's own conversations in ``tenant``, most recently updated first."""
        directory = child_path(self._base, encode_component(_PREFIX), encode_component(tenant))
        owner = normalize_owner(requester_uuid)
        records = await run_in_thread(_scan, directory)
        return page(
            (
                record
                for record in records
                if record.owner_uuid == owner and record.tenant == tenant
            ),
            limit,
            cursor,
        )

    async def list_stale_conversations(
        self, updated_before: datetime, limit: int = 100, cursor: str | None = None
    ) -> ConversationPage:
        """Every owner's conversations last updated before ``updated_before``,
        oldest first: a scan of every tenant's directory (retention runs rarely)."""
        root = child_path(self._base, encode_component(_PREFIX))
        records = await run_in_thread(_scan_all, root)
        return stale_page(records, updated_before, limit, cursor)

    async def set_shared(
        self, tenant: str, requester_uuid: str | None, session_id: str, shared: bool
    ) -> None:
        """Share or unshare (owner only); a no-op when no conversation exists."""
        await run_in_thread(
            self._set_shared, self._files(tenant, session_id), requester_uuid, shared
        )

    async def delete_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> bool:
        """Remove the conversation (owner only); returns whether one existed."""
        return await run_in_thread(_delete, self._files(tenant, session_id), requester_uuid)

    def _files(self, tenant: str, session_id: str) -> RowFiles:
        return row_files(self._base, _PREFIX, tenant, session_id)

    def _append(self, files: RowFiles, change: Append) -> None:
        with locked_row(files):
            current = read_model(files.data, ConversationRecord)
            updated = change.apply(current, stamp(self._clock))
            if updated is not None:
                _write(files, updated)

    def _append_fenced(self, files: RowFiles, change: Append, epoch: int) -> bool:
        with locked_row(files):
            current = read_model(files.data, ConversationRecord)
            updated, accepted = change.apply_fenced(current, stamp(self._clock), epoch)
            if updated is not None:
                _write(files, updated)
            return accepted

    def _remove_fenced(self, files: RowFiles, removal: Removal, epoch: int) -> bool:
        with locked_row(files):
            current = read_model(files.data, ConversationRecord)
            updated, accepted = removal.apply_fenced(current, stamp(self._clock), epoch)
            if updated is not None:
                _write(files, updated)
            return accepted

    def _set_status(
        self, files: RowFiles, requester_uuid: str | None, last_turn_status: LastTurnStatus
    ) -> None:
        with locked_row(files):
            record = read_model(files.data, ConversationRecord)
            if record is None:
                return
            record.require_owner(requester_uuid)
            record.last_turn_status = last_turn_status
            record.updated_at = stamp(self._clock)
            _write(files, record)

    def _set_shared(self, files: RowFiles, requester_uuid: str | None, shared: bool) -> None:
        with locked_row(files):
            record = read_model(files.data, ConversationRecord)
            if record is None:
                return
            record.require_owner(requester_uuid)
            record.shared = shared
            _write(files, record)


def _write(files: RowFiles, record: ConversationRecord) -> None:
    write_json(files.data, record.model_dump(mode="json"), durable=True)


def _read_readable(files: RowFiles, requester_uuid: str | None) -> ConversationRecord | None:
    # No lock: documents are replaced atomically, so a read is always whole.
    record = read_model(files.data, ConversationRecord)
    if record is not None:
        record.require_readable(requester_uuid)
    return record


def _fence(files: RowFiles, epoch: int) -> None:
    with locked_row(files):
        record = read_model(files.data, ConversationRecord)
        if record is not None and epoch > record.fence_epoch:
            record.fence_epoch = epoch
            _write(files, record)


def _delete(files: RowFiles, requester_uuid: str | None) -> bool:
    with locked_row(files):
        record = read_model(files.data, ConversationRecord)
        if record is None:
            return False
        record.require_owner(requester_uuid)
        # ``locked_row`` removes the lock file and the tenant's directory,
        # if this was its last conversation: nothing of it stays behind.
        return remove_file(files.data, durable=True)


def _scan_all(root: Path) -> list[ConversationRecord]:
    try:
        tenants = sorted(os.scandir(root), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []
    return [
        record
        for entry in tenants
        if entry.is_dir(follow_symlinks=False)
        for record in _scan(Path(entry.path))
    ]


def _scan(directory: Path) -> list[ConversationRecord]:
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []
    records: list[ConversationRecord] = []
    for entry in entries:
        # Temp files start with "." and lock files end in ".lock"; escaped names
        # never start with ".", so this picks exactly the documents.
        if entry.name.startswith(".") or not entry.name.endswith(".json"):
            continue
        record = read_model(Path(entry.path), ConversationRecord)
        if record is not None:  # deleted since the scan started
            records.append(record)
    return records
