"""MCP OAuth rows in the SQLite database of the SQLite backend, in tables of their own.

The repository works over a ``tether.adapters.sqlite.SQLiteDatabase``: the one
the other SQLite stores of the same URL share (``tether serve`` passes it), or
one of its own (``from_url``). Its two tables are created by the idempotent DDL
of ``queries_mcp`` (where all of its SQL is) when it opens, inside a
``BEGIN IMMEDIATE`` transaction, so replicas opening at once do not race; the
backend's own schema version is not touched.

Every row holds the sealed document of ``RecordCodec`` (credentials encrypted),
plus the columns lookups need: the ids (as UTF-8 BLOBs, so any Python string,
NUL included, is stored exactly), the pending ``state`` and the ``revision``
compare-and-swap compares. Writes run on the durable lane: fsynced at commit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, ClassVar

from tether.adapters.mcp._codec import RecordCodec
from tether.adapters.mcp.encryption import NO_KEY_MESSAGE, MCPOAuthCipher
from tether.adapters.mcp.records import MCPOAuthClientInfoRecord, MCPUserIntegrationRecord
from tether.adapters.mcp.repository import MCPOAuthRepository, is_tombstone
from tether.adapters.sqlite import Lane, SQLiteDatabase, queries_mcp
from tether.domain.store_errors import StoreCorruptedError


class SQLiteMCPOAuthRepository(MCPOAuthRepository):
    """``MCPOAuthRepository`` on a SQLite database file, for processes on one host.

    Compare-and-swap is one ``BEGIN IMMEDIATE`` transaction, atomic across
    every process sharing the file. ``open``/``aclose`` take and give back one
    hold on the database (``setup_app`` calls them through the store).
    """

    compare_and_swap_is_atomic: ClassVar[bool] = True

    def __init__(self, database: SQLiteDatabase, cipher: MCPOAuthCipher | None = None) -> None:
        self.database = database
        self._codec = RecordCodec(cipher if cipher is not None else MCPOAuthCipher.from_env())
        self._holding = False

    @classmethod
    def from_url(cls, url: str, cipher: MCPOAuthCipher | None = None) -> SQLiteMCPOAuthRepository:
        """Over a database of its own on the file ``sqlite:///...`` names."""
        return cls(SQLiteDatabase.from_url(url), cipher)

    async def open(self) -> None:
        """Hold the database open and create this repository's tables if missing."""
        if self._holding:
            return
        await self.database.open()
        self._holding = True
        try:
            await self.database.write(Lane.DURABLE, _create_tables)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._holding:
            self._holding = False
            await self.database.aclose()

    async def __aenter__(self) -> SQLiteMCPOAuthRepository:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def credentials_problem(self) -> str | None:
        return None if self._codec.cipher.configured else NO_KEY_MESSAGE

    async def list_user_integrations(
        self, tenant: str, user_uuid: str, server_names: Sequence[str] | None = None
    ) -> list[MCPUserIntegrationRecord]:
        params = {"tenant": _id(tenant), "user": _id(user_uuid)}
        rows = await self.database.read(
            Lane.DURABLE, lambda c: c.execute(queries_mcp.LIST_INTEGRATIONS, params).fetchall()
        )
        records = [self._codec.integration(_json(row[0]), _WHERE) for row in rows]
        wanted = None if server_names is None else set(server_names)
        return [r for r in records if wanted is None or r.server_name in wanted]

    async def get_user_integration(
        self, tenant: str, user_uuid: str, server_name: str
    ) -> MCPUserIntegrationRecord | None:
        params = _row(tenant, user_uuid, server_name)
        row = await self.database.read(
            Lane.DURABLE, lambda c: c.execute(queries_mcp.GET_INTEGRATION, params).fetchone()
        )
        return None if row is None else self._codec.integration(_json(row[0]), _WHERE)

    async def find_user_integration_by_pending_state(
        self, state: str
    ) -> MCPUserIntegrationRecord | None:
        params = {"state": _id(state)}
        row = await self.database.read(
            Lane.DURABLE, lambda c: c.execute(queries_mcp.FIND_BY_STATE, params).fetchone()
        )
        return None if row is None else self._codec.integration(_json(row[0]), _WHERE)

    async def save_user_integration(self, record: MCPUserIntegrationRecord) -> None:
        values = self._values(record)
        await self.database.write(
            Lane.DURABLE, lambda c: _execute(c, queries_mcp.UPSERT_INTEGRATION, values)
        )

    async def delete_user_integration(self, tenant: str, user_uuid: str, server_name: str) -> bool:
        params = _row(tenant, user_uuid, server_name)
        deleted = await self.database.write(
            Lane.DURABLE, lambda c: c.execute(queries_mcp.DELETE_INTEGRATION, params).rowcount
        )
        return bool(deleted)

    async def compare_and_swap_user_integration(
        self, record: MCPUserIntegrationRecord, expected_revision: str | None
    ) -> bool:
        tombstone = is_tombstone(record)
        values = _row(record.tenant, record.user_uuid, record.server_name)
        if not tombstone:
            values = self._values(record)
        values["expected"] = expected_revision

        def swap(connection: sqlite3.Connection) -> bool:
            if expected_revision is None:
                if tombstone:
                    found = connection.execute(queries_mcp.EXISTS_INTEGRATION, values).fetchone()
                    return found is None
                query = queries_mcp.INSERT_INTEGRATION_IF_ABSENT
            elif tombstone:
                query = queries_mcp.DELETE_INTEGRATION_IF_REVISION
            else:
                query = queries_mcp.UPDATE_INTEGRATION_IF_REVISION
            return connection.execute(query, values).rowcount == 1

        return await self.database.write(Lane.DURABLE, swap)

    async def list_client_info(
        self, tenant: str, server_names: Sequence[str] | None = None
    ) -> list[MCPOAuthClientInfoRecord]:
        params = {"tenant": _id(tenant)}
        rows = await self.database.read(
            Lane.DURABLE, lambda c: c.execute(queries_mcp.LIST_CLIENTS, params).fetchall()
        )
        records = [self._codec.client_info(_json(row[0]), _CLIENTS) for row in rows]
        wanted = None if server_names is None else set(server_names)
        return [r for r in records if wanted is None or r.server_name in wanted]

    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        params = {"tenant": _id(tenant), "server": _id(server_name)}
        row = await self.database.read(
            Lane.DURABLE, lambda c: c.execute(queries_mcp.GET_CLIENT, params).fetchone()
        )
        return None if row is None else self._codec.client_info(_json(row[0]), _CLIENTS)

    async def save_client_info(self, record: MCPOAuthClientInfoRecord) -> None:
        values = {
            "tenant": _id(record.tenant),
            "server": _id(record.server_name),
            "document": _dump(self._codec.client_info_document(record)),
        }
        await self.database.write(
            Lane.DURABLE, lambda c: _execute(c, queries_mcp.UPSERT_CLIENT, values)
        )

    async def compare_and_swap_client_info(
        self, record: MCPOAuthClientInfoRecord, expected: MCPOAuthClientInfoRecord | None
    ) -> bool:
        values: dict[str, Any] = {
            "tenant": _id(record.tenant),
            "server": _id(record.server_name),
            "document": _dump(self._codec.client_info_document(record)),
        }
        if expected is None:
            query = queries_mcp.INSERT_CLIENT_IF_ABSENT
        else:
            query, values["expected"] = queries_mcp.UPDATE_CLIENT_IF_REVISION, expected.revision
        return bool(
            await self.database.write(
                Lane.DURABLE, lambda c: c.execute(query, values).rowcount == 1
            )
        )

    def _values(self, record: MCPUserIntegrationRecord) -> dict[str, Any]:
        # Sealed before anything is sent: a record that cannot be stored changes nothing.
        document = self._codec.integration_document(record)
        return {
            **_row(record.tenant, record.user_uuid, record.server_name),
            "state": _id(record.pending.state) if record.pending is not None else None,
            "revision": record.revision,
            "document": _dump(document),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.database.name!r})"


_WHERE = "an mcp_oauth_integrations row"
_CLIENTS = "an mcp_oauth_clients row"


DATABASE_TYPE = SQLiteDatabase
"""What ``tether serve`` may pass as the shared database."""


def mcp_oauth_repository_from_url(
    url: str, cipher: MCPOAuthCipher, database: SQLiteDatabase | None = None
) -> SQLiteMCPOAuthRepository:
    """For ``tether serve``: over ``database`` (the other stores' one) when it is
    the file ``url`` names, else over a database of its own on that file."""
    own = SQLiteDatabase.from_url(url)
    shared = database is not None and database.path == own.path
    return SQLiteMCPOAuthRepository(database if shared and database else own, cipher)


def _execute(connection: sqlite3.Connection, query: str, values: dict[str, Any]) -> None:
    # The cursor stays in the connection's thread; only the fact of writing leaves.
    connection.execute(query, values)


def _create_tables(connection: sqlite3.Connection) -> None:
    for statement in queries_mcp.CREATE_TABLES:
        connection.execute(statement)


def _id(value: str) -> bytes:
    # UTF-8 with surrogatepass is injective for every Python str.
    return value.encode("utf-8", "surrogatepass")


def _row(tenant: str, user_uuid: str, server_name: str) -> dict[str, Any]:
    return {"tenant": _id(tenant), "user": _id(user_uuid), "server": _id(server_name)}


def _dump(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"))


def _json(raw: object) -> Any:
    if not isinstance(raw, str):
        raise StoreCorruptedError(f"{_WHERE} holds a {type(raw).__name__}, not JSON")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise StoreCorruptedError(f"{_WHERE} is not valid JSON ({error}); left as is") from error
