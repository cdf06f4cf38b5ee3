"""MCP OAuth rows in the PostgreSQL database of the PostgreSQL backend, in tables of their own.

The repository works over a ``tether.adapters.postgres.PostgresDatabase``: the
one the other stores of the same URL share (its pool; ``tether serve`` passes
it), or one of its own (``from_url``). Its tables are created at open by the
idempotent DDL of ``queries_mcp`` (where all of its SQL is), in one transaction
holding an advisory lock of its own, so replicas starting together do not race;
the backend's migrations and schema version are not touched.

Each row holds the sealed ``RecordCodec`` document (credentials encrypted) as
jsonb, the ids as text, and SHA-256 keys for lookups, so ids of any length fit
a B-tree: the primary key over (tenant, user, server), an owner key over
(tenant, user) for listing, and a state key for the callback. Compare-and-swap
is one conditional statement. Ids and documents cannot hold NUL characters
(PostgreSQL text cannot); such ids are refused before any I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from psycopg import AsyncCursor
from psycopg.rows import DictRow

from tether.adapters.mcp._codec import RecordCodec
from tether.adapters.mcp.encryption import NO_KEY_MESSAGE, MCPOAuthCipher
from tether.adapters.mcp.records import MCPOAuthClientInfoRecord, MCPUserIntegrationRecord
from tether.adapters.mcp.repository import MCPOAuthRepository, is_tombstone
from tether.adapters.postgres import PostgresDatabase, queries_mcp


class PostgresMCPOAuthRepository(MCPOAuthRepository):
    """``MCPOAuthRepository`` on PostgreSQL, for any number of replicas on any hosts."""

    compare_and_swap_is_atomic: ClassVar[bool] = True

    def __init__(self, database: PostgresDatabase, cipher: MCPOAuthCipher | None = None) -> None:
        self.database = database
        self._codec = RecordCodec(cipher if cipher is not None else MCPOAuthCipher.from_env())
        self._holding = False

    @classmethod
    def from_url(cls, url: str, cipher: MCPOAuthCipher | None = None) -> PostgresMCPOAuthRepository:
        """Over a database (and pool) of its own at ``postgresql://...``."""
        return cls(PostgresDatabase.from_url(url), cipher)

    async def open(self) -> None:
        """Hold the shared database open and create this repository's tables if missing."""
        if self._holding:
            return
        await self.database.retain()
        self._holding = True
        try:
            ready = await self.database.fetch_one(queries_mcp.TABLES_EXIST, {})
            if ready is None or not ready["ready"]:
                await self.database.run(_create_tables, transaction=True)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._holding:
            self._holding = False
            await self.database.release()

    async def __aenter__(self) -> PostgresMCPOAuthRepository:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def credentials_problem(self) -> str | None:
        return None if self._codec.cipher.configured else NO_KEY_MESSAGE

    async def list_user_integrations(
        self, tenant: str, user_uuid: str, server_names: Sequence[str] | None = None
    ) -> list[MCPUserIntegrationRecord]:
        rows = await self.database.fetch_all(
            queries_mcp.LIST_INTEGRATIONS, {"owner_key": _key(tenant, user_uuid)}
        )
        records = [self._codec.integration(row["document"], _WHERE) for row in rows]
        wanted = None if server_names is None else set(server_names)
        return sorted(
            (r for r in records if wanted is None or r.server_name in wanted),
            key=lambda r: r.server_name,
        )

    async def get_user_integration(
        self, tenant: str, user_uuid: str, server_name: str
    ) -> MCPUserIntegrationRecord | None:
        row = await self.database.fetch_one(
            queries_mcp.GET_INTEGRATION, {"key": _key(tenant, user_uuid, server_name)}
        )
        return None if row is None else self._codec.integration(row["document"], _WHERE)

    async def find_user_integration_by_pending_state(
        self, state: str
    ) -> MCPUserIntegrationRecord | None:
        if "\x00" in state:
            return None  # no stored state holds NUL (PostgreSQL text cannot)
        row = await self.database.fetch_one(queries_mcp.FIND_BY_STATE, {"state_key": _key(state)})
        return None if row is None else self._codec.integration(row["document"], _WHERE)

    async def save_user_integration(self, record: MCPUserIntegrationRecord) -> None:
        await self.database.execute(queries_mcp.UPSERT_INTEGRATION, self._values(record))

    async def delete_user_integration(self, tenant: str, user_uuid: str, server_name: str) -> bool:
        row = await self.database.fetch_one(
            queries_mcp.DELETE_INTEGRATION, {"key": _key(tenant, user_uuid, server_name)}
        )
        return row is not None

    async def compare_and_swap_user_integration(
        self, record: MCPUserIntegrationRecord, expected_revision: str | None
    ) -> bool:
        if is_tombstone(record):
            key = {"key": _key(record.tenant, record.user_uuid, record.server_name)}
            if expected_revision is None:
                row = await self.database.fetch_one(queries_mcp.NO_INTEGRATION, key)
                return bool(row and row["written"])
            query = queries_mcp.DELETE_INTEGRATION_IF_REVISION
            values = {**key, "expected": expected_revision}
        elif expected_revision is None:
            query, values = queries_mcp.INSERT_INTEGRATION_IF_ABSENT, self._values(record)
        else:
            query = queries_mcp.UPDATE_INTEGRATION_IF_REVISION
            values = {**self._values(record), "expected": expected_revision}
        return await self.database.fetch_one(query, values) is not None

    async def list_client_info(
        self, tenant: str, server_names: Sequence[str] | None = None
    ) -> list[MCPOAuthClientInfoRecord]:
        rows = await self.database.fetch_all(queries_mcp.LIST_CLIENTS, {"tenant_key": _key(tenant)})
        records = [self._codec.client_info(row["document"], _CLIENTS) for row in rows]
        wanted = None if server_names is None else set(server_names)
        return sorted(
            (r for r in records if wanted is None or r.server_name in wanted),
            key=lambda r: r.server_name,
        )

    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        row = await self.database.fetch_one(
            queries_mcp.GET_CLIENT, {"key": _key(tenant, server_name)}
        )
        return None if row is None else self._codec.client_info(row["document"], _CLIENTS)

    async def save_client_info(self, record: MCPOAuthClientInfoRecord) -> None:
        await self.database.execute(queries_mcp.UPSERT_CLIENT, self._client_values(record))

    async def compare_and_swap_client_info(
        self, record: MCPOAuthClientInfoRecord, expected: MCPOAuthClientInfoRecord | None
    ) -> bool:
        values = self._client_values(record)
        if expected is None:
            return (
                await self.database.fetch_one(queries_mcp.INSERT_CLIENT_IF_ABSENT, values)
                is not None
            )
        values["expected"] = expected.revision
        return (
            await self.database.fetch_one(queries_mcp.UPDATE_CLIENT_IF_REVISION, values) is not None
        )

    def _client_values(self, record: MCPOAuthClientInfoRecord) -> dict[str, Any]:
        document = self._codec.client_info_document(record)
        return {
            "key": _key(record.tenant, record.server_name),
            "tenant_key": _key(record.tenant),
            "tenant": record.tenant,
            "server_name": record.server_name,
            "document": _dump(document),
        }

    def _values(self, record: MCPUserIntegrationRecord) -> dict[str, Any]:
        # Sealed before anything is sent: a record that cannot be stored changes nothing.
        document = self._codec.integration_document(record)
        return {
            "key": _key(record.tenant, record.user_uuid, record.server_name),
            "owner_key": _key(record.tenant, record.user_uuid),
            "state_key": _key(record.pending.state) if record.pending is not None else None,
            "tenant": record.tenant,
            "user_uuid": record.user_uuid,
            "server_name": record.server_name,
            "revision": record.revision,
            "document": _dump(document),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.database.display_url!r})"


_WHERE = "a tether_mcp_oauth_integrations row"
_CLIENTS = "a tether_mcp_oauth_clients row"


DATABASE_TYPE = PostgresDatabase
"""What ``tether serve`` may pass as the shared database."""


def mcp_oauth_repository_from_url(
    url: str, cipher: MCPOAuthCipher, database: PostgresDatabase | None = None
) -> PostgresMCPOAuthRepository:
    """For ``tether serve``: over ``database`` (the other stores' one) when given."""
    return PostgresMCPOAuthRepository(database or PostgresDatabase.from_url(url), cipher)


async def _create_tables(cursor: AsyncCursor[DictRow]) -> None:
    for statement in queries_mcp.CREATE_TABLES:
        await cursor.execute(
            statement, {"lock_key": queries_mcp.LOCK_KEY} if "%(" in statement else None
        )


def _key(*ids: str) -> bytes:
    """SHA-256 over the ids, each behind its length: injective, and B-tree sized."""
    digest = hashlib.sha256()
    for value in ids:
        if "\x00" in value:
            raise ValueError(f"PostgreSQL cannot store an id containing NUL: {value[:80]!r}")
        data = value.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.digest()


def _dump(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"))
