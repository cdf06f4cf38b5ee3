"""``MCPOAuthRepository``: the storage interface of MCP OAuth, plain CRUD over its records.

The flow rules (expired pendings are gone, tokens landing clear the pending, a
state is usable once, refreshes never spend a refresh token twice) belong to
``MCPOAuthIntegrationStore``, which wraps a repository; an adapter only stores
and finds rows.
"""

from __future__ import annotations

import asyncio
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import ClassVar

from tether.adapters.mcp.records import MCPOAuthClientInfoRecord, MCPUserIntegrationRecord


class MCPOAuthRepository(ABC):
    """Rows of MCP OAuth: user integrations and per-tenant client info.

    - One ``MCPUserIntegrationRecord`` per (tenant, user_uuid, server_name);
      ``save_user_integration`` replaces it whole (last write wins).
    - ``find_user_integration_by_pending_state`` looks up by ``state`` alone,
      across every tenant, user and server: the callback carries nothing else.
    - One ``MCPOAuthClientInfoRecord`` per (tenant, server_name).
    - No TTL logic: the wrapping store expires pendings.
    - Records hold credentials: a production adapter encrypts them at rest (the
      shipped ones do, with ``MCPOAuthCipher``) and refuses to store them when it
      cannot.

    **Optional: atomic compare-and-swap.** ``compare_and_swap_user_integration``
    is how the store takes a per-integration refresh lease and consumes a state
    once. The default here is atomic only within one process (an asyncio lock
    around a read and a write), which is enough for a repository that a single
    process uses. A repository shared by several replicas overrides it with a
    real conditional write and sets ``compare_and_swap_is_atomic = True``;
    without that, the store warns at start-up that two replicas could both spend
    one rotating refresh token. The shipped repositories all override it.

    **Optional: client info compare-and-swap.** ``compare_and_swap_client_info``
    is how the store keeps one dynamic client registration per callback URL when
    replicas register at once (the loser uses the winner's). The default is
    atomic within one process, over the eight methods; the shipped repositories
    override it with a conditional write on the record's ``revision``.
    """

    compare_and_swap_is_atomic: ClassVar[bool] = False
    """True when ``compare_and_swap_user_integration`` is atomic for every process
    that can see the rows (trivially so for an in-memory repository)."""

    @abstractmethod
    async def list_user_integrations(
        self, tenant: str, user_uuid: str, server_names: Sequence[str] | None = None
    ) -> list[MCPUserIntegrationRecord]:
        """The user's integrations among ``server_names`` (every one when None),
        ordered by server name."""

    @abstractmethod
    async def get_user_integration(
        self, tenant: str, user_uuid: str, server_name: str
    ) -> MCPUserIntegrationRecord | None:
        """The integration, or None."""

    @abstractmethod
    async def find_user_integration_by_pending_state(
        self, state: str
    ) -> MCPUserIntegrationRecord | None:
        """The integration whose ``pending.state`` is ``state``, whoever's it is, or None."""

    @abstractmethod
    async def save_user_integration(self, record: MCPUserIntegrationRecord) -> None:
        """Insert or replace the integration of (tenant, user_uuid, server_name)."""

    @abstractmethod
    async def delete_user_integration(self, tenant: str, user_uuid: str, server_name: str) -> bool:
        """Remove the integration; returns whether there was one."""

    @abstractmethod
    async def list_client_info(
        self, tenant: str, server_names: Sequence[str] | None = None
    ) -> list[MCPOAuthClientInfoRecord]:
        """The tenant's client info among ``server_names`` (every one when None)."""

    @abstractmethod
    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        """The client info of (tenant, server_name), or None."""

    @abstractmethod
    async def save_client_info(self, record: MCPOAuthClientInfoRecord) -> None:
        """Insert or replace the client info of (tenant, server_name)."""

    async def compare_and_swap_user_integration(
        self, record: MCPUserIntegrationRecord, expected_revision: str | None
    ) -> bool:
        """Write ``record`` only if the stored row's ``revision`` is ``expected_revision``
        (or, for None, only if there is no row); returns whether it wrote.

        ``record`` with ``pending`` and ``tokens`` both None and a None
        ``revision`` deletes the row instead (under the same condition).

        This default is atomic within one process only; see the class docstring.
        """
        async with _process_lock(self, (record.tenant, record.user_uuid, record.server_name)):
            current = await self.get_user_integration(
                record.tenant, record.user_uuid, record.server_name
            )
            current_revision = None if current is None else current.revision
            if current is None and expected_revision is not None:
                return False
            if current is not None and current_revision != expected_revision:
                return False
            if is_tombstone(record):
                await self.delete_user_integration(
                    record.tenant, record.user_uuid, record.server_name
                )
            else:
                await self.save_user_integration(record)
            return True

    async def compare_and_swap_client_info(
        self, record: MCPOAuthClientInfoRecord, expected: MCPOAuthClientInfoRecord | None
    ) -> bool:
        """Write ``record`` only if the stored client info of its (tenant, server_name)
        is still ``expected``, as read before (for None: only if there is none);
        returns whether it wrote.

        This default compares whole records under a lock of this process (atomic
        within one process only); an override may compare ``revision`` alone.
        """
        key = ("", "client_info", record.tenant, record.server_name)
        async with _process_lock(self, key):
            current = await self.get_client_info(record.tenant, record.server_name)
            if current != expected:
                return False
            await self.save_client_info(record)
            return True

    def credentials_problem(self) -> str | None:
        """Why credentials cannot be stored right now (say, no encryption key), or
        None; checked before a flow starts that would end in storing some."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most repositories hold nothing
        """Release connections; called when the server stops."""


def is_tombstone(record: MCPUserIntegrationRecord) -> bool:
    """Whether ``record`` asks ``compare_and_swap_user_integration`` for a delete."""
    return record.pending is None and record.tokens is None and record.revision is None


_Key = tuple[str, ...]
_LOCKS: weakref.WeakKeyDictionary[MCPOAuthRepository, dict[_Key, _Waiting]] = (
    weakref.WeakKeyDictionary()
)


class _Waiting:
    """A lock and how many holders or waiters it has, so an idle one can be dropped."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


@asynccontextmanager
async def _process_lock(repository: MCPOAuthRepository, key: _Key) -> AsyncIterator[None]:
    # Kept outside the instance so subclasses need not call a base __init__; one
    # lock per integration in use, dropped when nobody holds or awaits it.
    locks = _LOCKS.setdefault(repository, {})
    waiting = locks.get(key)
    if waiting is None:
        waiting = locks[key] = _Waiting()
    waiting.users += 1
    try:
        async with waiting.lock:
            yield
    finally:
        waiting.users -= 1
        if waiting.users == 0:
            locks.pop(key, None)
