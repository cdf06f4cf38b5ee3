"""MCP OAuth rows as files, for local work and single-node deployments.

Layout under the base directory (every id escaped by ``encode_component``)::

    integrations/{tenant}/{user_uuid}/{server_name}.json   one sealed record
    states/{sha256(state)}.json                            state -> record pointer
    clients/{tenant}/{server_name}.json                    sealed client info

Writes replace files atomically and durably; a record, its state pointer and a
compare-and-swap are serialized by the record's ``.lock`` file (client info by
its own), so any number of processes may share the directory. The pointer is
written before the record and checked against it on every lookup, so a crash
between the two leaves at worst a stale pointer, which reads as "no such state"
and is removed later. State files are named by a hash: listing the directory
reveals no state.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from tether.adapters.file._files import (
    exclusive_lock,
    read_json,
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
from tether.adapters.mcp._codec import RecordCodec
from tether.adapters.mcp.encryption import NO_KEY_MESSAGE, MCPOAuthCipher
from tether.adapters.mcp.records import MCPOAuthClientInfoRecord, MCPUserIntegrationRecord
from tether.adapters.mcp.repository import MCPOAuthRepository, is_tombstone


class LocalFileMCPOAuthRepository(MCPOAuthRepository):
    """``MCPOAuthRepository`` on a directory shared safely by any number of processes.

    ``cipher`` seals credentials (default: keys from ``TETHER_MCP_ENCRYPTION_KEYS``).
    """

    compare_and_swap_is_atomic: ClassVar[bool] = True

    def __init__(
        self, base_path: str | os.PathLike[str], cipher: MCPOAuthCipher | None = None
    ) -> None:
        self.base_path = store_root(base_path)
        self._codec = RecordCodec(cipher if cipher is not None else MCPOAuthCipher.from_env())

    def credentials_problem(self) -> str | None:
        return None if self._codec.cipher.configured else NO_KEY_MESSAGE

    async def list_user_integrations(
        self, tenant: str, user_uuid: str, server_names: Sequence[str] | None = None
    ) -> list[MCPUserIntegrationRecord]:
        records = await run_in_thread(self._list_integrations, tenant, user_uuid)
        wanted = None if server_names is None else set(server_names)
        return sorted(
            (r for r in records if wanted is None or r.server_name in wanted),
            key=lambda r: r.server_name,
        )

    async def get_user_integration(
        self, tenant: str, user_uuid: str, server_name: str
    ) -> MCPUserIntegrationRecord | None:
        return await run_in_thread(
            self._read_integration, self._row(tenant, user_uuid, server_name)
        )

    async def find_user_integration_by_pending_state(
        self, state: str
    ) -> MCPUserIntegrationRecord | None:
        return await run_in_thread(self._find_by_state, state)

    async def save_user_integration(self, record: MCPUserIntegrationRecord) -> None:
        # Seal before touching anything: a record that cannot be stored changes nothing.
        document = self._codec.integration_document(record)
        await run_in_thread(self._locked_write, record, document, None, unconditional=True)

    async def delete_user_integration(self, tenant: str, user_uuid: str, server_name: str) -> bool:
        return await run_in_thread(self._locked_delete, self._row(tenant, user_uuid, server_name))

    async def compare_and_swap_user_integration(
        self, record: MCPUserIntegrationRecord, expected_revision: str | None
    ) -> bool:
        document = None if is_tombstone(record) else self._codec.integration_document(record)
        return await run_in_thread(
            self._locked_write, record, document, expected_revision, unconditional=False
        )

    async def list_client_info(
        self, tenant: str, server_names: Sequence[str] | None = None
    ) -> list[MCPOAuthClientInfoRecord]:
        records = await run_in_thread(self._list_client_info, tenant)
        wanted = None if server_names is None else set(server_names)
        return sorted(
            (r for r in records if wanted is None or r.server_name in wanted),
            key=lambda r: r.server_name,
        )

    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        path = row_files(self.base_path, "clients", tenant, server_name).data
        document = await run_in_thread(read_json, path)
        return None if document is None else self._codec.client_info(document, str(path))

    async def save_client_info(self, record: MCPOAuthClientInfoRecord) -> None:
        document = self._codec.client_info_document(record)
        files = row_files(self.base_path, "clients", record.tenant, record.server_name)
        await run_in_thread(self._locked_client_write, files, document, None, unconditional=True)

    async def compare_and_swap_client_info(
        self, record: MCPOAuthClientInfoRecord, expected: MCPOAuthClientInfoRecord | None
    ) -> bool:
        document = self._codec.client_info_document(record)
        files = row_files(self.base_path, "clients", record.tenant, record.server_name)
        return await run_in_thread(
            self._locked_client_write, files, document, expected, unconditional=False
        )

    # ------------------------------------------------------------ blocking steps

    def _row(self, tenant: str, user_uuid: str, server_name: str) -> RowFiles:
        return row_files(self.base_path, "integrations", tenant, user_uuid, server_name)

    def _state_file(self, state: str) -> Path:
        digest = hashlib.sha256(state.encode("utf-8", "surrogatepass")).hexdigest()
        return row_files(self.base_path, "states", digest).data

    def _read_integration(self, files: RowFiles) -> MCPUserIntegrationRecord | None:
        document = read_json(files.data)
        return None if document is None else self._codec.integration(document, str(files.data))

    def _list_integrations(self, tenant: str, user_uuid: str) -> list[MCPUserIntegrationRecord]:
        directory = child_path(
            self.base_path, "integrations", encode_component(tenant), encode_component(user_uuid)
        )
        return [
            self._codec.integration(document, str(path)) for path, document in _documents(directory)
        ]

    def _list_client_info(self, tenant: str) -> list[MCPOAuthClientInfoRecord]:
        directory = child_path(self.base_path, "clients", encode_component(tenant))
        return [
            self._codec.client_info(document, str(path)) for path, document in _documents(directory)
        ]

    def _find_by_state(self, state: str) -> MCPUserIntegrationRecord | None:
        pointer = read_json(self._state_file(state))
        if not isinstance(pointer, dict):
            return None
        try:
            files = self._row(
                str(pointer["tenant"]), str(pointer["user_uuid"]), str(pointer["server_name"])
            )
        except KeyError:
            return None
        record = self._read_integration(files)
        # The pointer is only a hint; the record decides.
        if record is None or record.pending is None or record.pending.state != state:
            return None
        return record

    def _locked_write(
        self,
        record: MCPUserIntegrationRecord,
        document: dict[str, Any] | None,
        expected_revision: str | None,
        *,
        unconditional: bool,
    ) -> bool:
        files = self._row(record.tenant, record.user_uuid, record.server_name)
        with exclusive_lock(files.lock):
            current = read_json(files.data)
            if not unconditional:
                current_revision = current.get("revision") if isinstance(current, dict) else None
                if (current is None) != (expected_revision is None):
                    return False
                if current is not None and current_revision != expected_revision:
                    return False
            old_state = _pending_state(current)
            if document is None:
                remove_file(files.data, durable=True)
            else:
                new_state = record.pending.state if record.pending is not None else None
                if new_state is not None and new_state != old_state:
                    pointer = {
                        "tenant": record.tenant,
                        "user_uuid": record.user_uuid,
                        "server_name": record.server_name,
                    }
                    write_json(self._state_file(new_state), pointer, durable=True)
                write_json(files.data, document, durable=True)
                if new_state == old_state:
                    return True
            if old_state is not None:
                remove_file(self._state_file(old_state), durable=False)
            return True

    def _locked_client_write(
        self,
        files: RowFiles,
        document: dict[str, Any],
        expected: MCPOAuthClientInfoRecord | None,
        *,
        unconditional: bool,
    ) -> bool:
        with exclusive_lock(files.lock):
            if not unconditional:
                current = read_json(files.data)
                if (current is None) != (expected is None):
                    return False
                if isinstance(current, dict) and expected is not None:
                    if current.get("revision") != expected.revision:
                        return False
            write_json(files.data, document, durable=True)
            return True

    def _locked_delete(self, files: RowFiles) -> bool:
        with exclusive_lock(files.lock):
            old_state = _pending_state(read_json(files.data))
            existed = remove_file(files.data, durable=True)
            if old_state is not None:
                remove_file(self._state_file(old_state), durable=False)
            return existed


def _pending_state(document: Any) -> str | None:
    if isinstance(document, dict) and isinstance(document.get("pending"), dict):
        state = document["pending"].get("state")
        return state if isinstance(state, str) else None
    return None


def _documents(directory: Path) -> list[tuple[Path, Any]]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        # Temp files of a write in progress start with a dot; locks end in .lock.
        if name.startswith(".") or not name.endswith(".json"):
            continue
        path = directory / name
        document = read_json(path)
        if document is not None:
            found.append((path, document))
    return found
