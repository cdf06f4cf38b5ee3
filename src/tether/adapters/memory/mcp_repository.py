"""An in-memory ``MCPOAuthRepository``, for one process (tests, demos).

It stores the same sealed documents as the durable repositories, so it also
refuses credentials without a key and never holds a token in clear.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from tether.adapters.mcp._codec import RecordCodec
from tether.adapters.mcp.encryption import NO_KEY_MESSAGE, MCPOAuthCipher
from tether.adapters.mcp.records import MCPOAuthClientInfoRecord, MCPUserIntegrationRecord
from tether.adapters.mcp.repository import MCPOAuthRepository, is_tombstone

_Key = tuple[str, str, str]


class InMemoryMCPOAuthRepository(MCPOAuthRepository):
    """Rows in dictionaries; every method completes without awaiting, so each is atomic."""

    compare_and_swap_is_atomic: ClassVar[bool] = True

    def __init__(self, cipher: MCPOAuthCipher | None = None) -> None:
        self._codec = RecordCodec(cipher if cipher is not None else MCPOAuthCipher.from_env())
        self._integrations: dict[_Key, dict[str, Any]] = {}
        self._by_state: dict[str, _Key] = {}
        self._client_info: dict[tuple[str, str], dict[str, Any]] = {}

    def credentials_problem(self) -> str | None:
        return None if self._codec.cipher.configured else NO_KEY_MESSAGE

    async def list_user_integrations(
        self, tenant: str, user_uuid: str, server_names: Sequence[str] | None = None
    ) -> list[MCPUserIntegrationRecord]:
        wanted = None if server_names is None else set(server_names)
        keys = sorted(
            key
            for key in self._integrations
            if key[:2] == (tenant, user_uuid) and (wanted is None or key[2] in wanted)
        )
        return [self._decode(key) for key in keys]

    async def get_user_integration(
        self, tenant: str, user_uuid: str, server_name: str
    ) -> MCPUserIntegrationRecord | None:
        key = (tenant, user_uuid, server_name)
        return self._decode(key) if key in self._integrations else None

    async def find_user_integration_by_pending_state(
        self, state: str
    ) -> MCPUserIntegrationRecord | None:
        key = self._by_state.get(state)
        return None if key is None else self._decode(key)

    async def save_user_integration(self, record: MCPUserIntegrationRecord) -> None:
        self._put(record)

    async def delete_user_integration(self, tenant: str, user_uuid: str, server_name: str) -> bool:
        return self._remove((tenant, user_uuid, server_name))

    async def compare_and_swap_user_integration(
        self, record: MCPUserIntegrationRecord, expected_revision: str | None
    ) -> bool:
        key = (record.tenant, record.user_uuid, record.server_name)
        current = self._integrations.get(key)
        if (current is None) != (expected_revision is None):
            return False
        if current is not None and current.get("revision") != expected_revision:
            return False
        if is_tombstone(record):
            self._remove(key)
        else:
            self._put(record)
        return True

    async def list_client_info(
        self, tenant: str, server_names: Sequence[str] | None = None
    ) -> list[MCPOAuthClientInfoRecord]:
        wanted = None if server_names is None else set(server_names)
        keys = sorted(
            key
            for key in self._client_info
            if key[0] == tenant and (wanted is None or key[1] in wanted)
        )
        return [self._codec.client_info(self._client_info[key], "memory") for key in keys]

    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        document = self._client_info.get((tenant, server_name))
        return None if document is None else self._codec.client_info(document, "memory")

    async def save_client_info(self, record: MCPOAuthClientInfoRecord) -> None:
        document = self._codec.client_info_document(record)
        self._client_info[(record.tenant, record.server_name)] = document

    async def compare_and_swap_client_info(
        self, record: MCPOAuthClientInfoRecord, expected: MCPOAuthClientInfoRecord | None
    ) -> bool:
        key = (record.tenant, record.server_name)
        current = self._client_info.get(key)
        if (current is None) != (expected is None):
            return False
        if current is not None and expected is not None:
            if current.get("revision") != expected.revision:
                return False
        self._client_info[key] = self._codec.client_info_document(record)
        return True

    def raw_documents(self) -> Iterable[dict[str, Any]]:
        """Every stored document as held (sealed), for tests that look for plaintext."""
        yield from self._integrations.values()
        yield from self._client_info.values()

    def _decode(self, key: _Key) -> MCPUserIntegrationRecord:
        return self._codec.integration(self._integrations[key], "memory")

    def _put(self, record: MCPUserIntegrationRecord) -> None:
        # Encode first: a record that cannot be sealed changes nothing.
        document = self._codec.integration_document(record)
        key = (record.tenant, record.user_uuid, record.server_name)
        self._drop_state(key)
        self._integrations[key] = document
        if record.pending is not None:
            self._by_state[record.pending.state] = key

    def _remove(self, key: _Key) -> bool:
        self._drop_state(key)
        return self._integrations.pop(key, None) is not None

    def _drop_state(self, key: _Key) -> None:
        previous = self._integrations.get(key)
        pending = None if previous is None else previous.get("pending")
        if pending is not None and self._by_state.get(pending["state"]) == key:
            del self._by_state[pending["state"]]
