"""The ``MCPOAuthRepository`` contract, as tests your adapter inherits.

Subclass it in a test module and override the fixtures::

    import pytest
    from tether.adapters.mcp import MCPOAuthCipher, generate_encryption_key
    from tether.testing.contracts.mcp_oauth import MCPOAuthRepositoryContract

    KEY = generate_encryption_key()

    class TestMyRepository(MCPOAuthRepositoryContract):
        @pytest.fixture
        def repository(self):
            return MyRepository(cipher=MCPOAuthCipher([KEY]))

        @pytest.fixture
        def repository_without_key(self):      # optional: refusing credentials
            return MyRepository(cipher=MCPOAuthCipher())

        @pytest.fixture
        def raw_bytes(self, repository):       # optional: everything at rest
            return lambda: read_my_table_as_bytes()

A repository that is an async context manager is entered for the test. Every
test works under fresh random ids, so one database may serve many tests.
Narrow ``tricky_ids`` if your backend refuses some (NUL in PostgreSQL).

``MCPOAuthRepositoryCrossProcessContract`` races compare-and-swap from several
processes, for a repository they share (files, a database); its fixture is a
picklable zero-argument ``repository_factory``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

from tether.adapters.mcp.encryption import MCPOAuthEncryptionNotConfiguredError
from tether.adapters.mcp.records import (
    MCPOAuthClientInfoRecord,
    MCPOAuthPendingAuthorization,
    MCPOAuthTokens,
    MCPUserIntegrationRecord,
)
from tether.adapters.mcp.repository import MCPOAuthRepository
from tether.testing.contracts._support import TRICKY_IDS, StoreFactory, open_store, unique
from tether.testing.contracts.cross_process import _run_in_processes

_WHEN = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
_TIMEOUT = 120.0


def pending(
    tenant: str, user: str, server: str, state: str | None = None
) -> MCPOAuthPendingAuthorization:
    """A pending authorization with every field set (its verifier is a credential)."""
    state = state or unique("state")
    return MCPOAuthPendingAuthorization(
        state=state,
        tenant=tenant,
        server_name=server,
        user_uuid=user,
        auth_url=f"https://as.example/authorize?state={state}",
        code_verifier=unique("verifier-secret"),
        token_endpoint="https://as.example/token",
        redirect_uri="https://tether.example/mcp/oauth/callback",
        expires_at=_WHEN,
        resource="https://mcp.example/mcp",
        client_id="client-1",
        scope="read write",
    )


def tokens(marker: str = "") -> MCPOAuthTokens:
    """Granted tokens with every field set (access and refresh tokens are credentials)."""
    return MCPOAuthTokens(
        access_token=unique(f"access-secret{marker}"),
        refresh_token=unique(f"refresh-secret{marker}"),
        scope="read write",
        expires_at=_WHEN + timedelta(hours=1),
        token_endpoint="https://as.example/token",
        client_id="client-1",
        resource="https://mcp.example/mcp",
    )


def record(
    tenant: str,
    user: str,
    server: str,
    *,
    with_pending: bool = True,
    with_tokens: bool = True,
    revision: str | None = "r1",
) -> MCPUserIntegrationRecord:
    return MCPUserIntegrationRecord(
        tenant=tenant,
        user_uuid=user,
        server_name=server,
        pending=pending(tenant, user, server) if with_pending else None,
        tokens=tokens() if with_tokens else None,
        revision=revision,
    )


class MCPOAuthRepositoryContract:
    """Plain CRUD by (tenant, user, server), lookup by state alone, compare-and-swap,
    and credentials never at rest in clear."""

    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]
    tricky_ids: ClassVar[tuple[str, ...]] = TRICKY_IDS

    @pytest.fixture
    def repository(self) -> MCPOAuthRepository:
        """Override: the repository under test, able to encrypt (a key configured)."""
        raise NotImplementedError("override the `repository` fixture with your adapter")

    @pytest.fixture
    def repository_without_key(self) -> MCPOAuthRepository:
        """Override (optional): the same repository with no encryption key."""
        pytest.skip("no `repository_without_key` fixture: refusing credentials is not checked")

    @pytest.fixture
    def raw_bytes(self) -> Callable[[], bytes] | None:
        """Override (optional): a function returning everything the repository holds
        at rest, read around it (files, table rows)."""
        return None

    @pytest.fixture
    async def repo(self, repository: MCPOAuthRepository) -> AsyncIterator[MCPOAuthRepository]:
        async with AsyncExitStack() as stack:
            yield await open_store(lambda: repository, stack)

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")

    # ------------------------------------------------------------ integrations

    async def test_a_missing_integration_is_none(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        assert await repo.get_user_integration(tenant, "user", "server") is None
        assert await repo.list_user_integrations(tenant, "user") == []
        assert await repo.delete_user_integration(tenant, "user", "server") is False

    async def test_an_integration_round_trips_exactly(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        saved = record(tenant, "user", "server")
        await repo.save_user_integration(saved)
        assert await repo.get_user_integration(tenant, "user", "server") == saved

    async def test_save_replaces_the_whole_record(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        await repo.save_user_integration(record(tenant, "user", "server"))
        replacement = record(tenant, "user", "server", with_pending=False, revision="r2")
        await repo.save_user_integration(replacement)
        assert await repo.get_user_integration(tenant, "user", "server") == replacement

    async def test_listing_is_per_user_filtered_and_ordered(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        for server in ("b", "a", "c"):
            await repo.save_user_integration(record(tenant, "user", server))
        await repo.save_user_integration(record(tenant, "other", "a"))
        await repo.save_user_integration(record(unique("tenant"), "user", "a"))
        everything = await repo.list_user_integrations(tenant, "user")
        assert [r.server_name for r in everything] == ["a", "b", "c"]
        assert {r.user_uuid for r in everything} == {"user"}
        some = await repo.list_user_integrations(tenant, "user", ["c", "a", "zzz"])
        assert [r.server_name for r in some] == ["a", "c"]
        assert await repo.list_user_integrations(tenant, "user", []) == []

    async def test_a_pending_state_is_found_by_itself_across_users_and_servers(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        first, second = record(tenant, "u1", "s1"), record(tenant, "u2", "s2")
        for saved in (first, second):
            await repo.save_user_integration(saved)
        assert first.pending is not None and second.pending is not None
        assert await repo.find_user_integration_by_pending_state(first.pending.state) == first
        assert await repo.find_user_integration_by_pending_state(second.pending.state) == second
        assert await repo.find_user_integration_by_pending_state(unique("nobody's")) is None

    async def test_a_replaced_or_cleared_pending_is_not_found_by_its_old_state(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        old = record(tenant, "user", "server")
        await repo.save_user_integration(old)
        new = record(tenant, "user", "server", revision="r2")
        await repo.save_user_integration(new)
        assert old.pending is not None and new.pending is not None
        assert await repo.find_user_integration_by_pending_state(old.pending.state) is None
        assert await repo.find_user_integration_by_pending_state(new.pending.state) == new
        cleared = new.model_copy(update={"pending": None, "revision": "r3"})
        await repo.save_user_integration(cleared)
        assert await repo.find_user_integration_by_pending_state(new.pending.state) is None

    async def test_delete_removes_the_integration_and_its_state(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        saved = record(tenant, "user", "server")
        await repo.save_user_integration(saved)
        await repo.save_user_integration(record(tenant, "user", "kept"))
        assert await repo.delete_user_integration(tenant, "user", "server") is True
        assert await repo.get_user_integration(tenant, "user", "server") is None
        assert saved.pending is not None
        assert await repo.find_user_integration_by_pending_state(saved.pending.state) is None
        assert await repo.delete_user_integration(tenant, "user", "server") is False
        assert [r.server_name for r in await repo.list_user_integrations(tenant, "user")] == [
            "kept"
        ]

    async def test_tricky_ids_are_stored_exactly_and_apart(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        for value in self.tricky_ids:
            await repo.save_user_integration(record(tenant, value, value))
        for value in self.tricky_ids:
            found = await repo.get_user_integration(tenant, value, value)
            assert found is not None and (found.user_uuid, found.server_name) == (value, value)
            assert found.pending is not None
            assert await repo.find_user_integration_by_pending_state(found.pending.state) == found
            listed = await repo.list_user_integrations(tenant, value)
            assert [r.server_name for r in listed] == [value]

    # ------------------------------------------------------------ client info

    async def test_client_info_is_per_tenant_and_server(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        assert await repo.get_client_info(tenant, "server") is None
        info = {
            "client_id": "c1",
            "client_secret": unique("client-secret"),
            "extra": [1, {"a": None}],
        }
        saved = MCPOAuthClientInfoRecord(tenant=tenant, server_name="server", client_info=info)
        await repo.save_client_info(saved)
        await repo.save_client_info(
            MCPOAuthClientInfoRecord(
                tenant=tenant, server_name="another", client_info={"client_id": "c2"}
            )
        )
        other_tenant = unique("tenant")
        await repo.save_client_info(
            MCPOAuthClientInfoRecord(
                tenant=other_tenant, server_name="server", client_info={"client_id": "c3"}
            )
        )
        assert await repo.get_client_info(tenant, "server") == saved
        listed = await repo.list_client_info(tenant)
        assert [(r.server_name, r.client_info["client_id"]) for r in listed] == [
            ("another", "c2"),
            ("server", "c1"),
        ]
        assert [r.server_name for r in await repo.list_client_info(tenant, ["server"])] == [
            "server"
        ]
        replaced = MCPOAuthClientInfoRecord(
            tenant=tenant, server_name="server", client_info={"client_id": "c9"}
        )
        await repo.save_client_info(replaced)
        assert await repo.get_client_info(tenant, "server") == replaced

    # ------------------------------------------------------------ compare-and-swap

    async def test_compare_and_swap_writes_only_over_the_expected_revision(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        first = record(tenant, "user", "server", revision="r1")
        assert await repo.compare_and_swap_user_integration(first, None) is True
        assert await repo.compare_and_swap_user_integration(first, None) is False
        second = record(tenant, "user", "server", revision="r2")
        assert await repo.compare_and_swap_user_integration(second, "r0") is False
        assert await repo.get_user_integration(tenant, "user", "server") == first
        assert await repo.compare_and_swap_user_integration(second, "r1") is True
        assert await repo.get_user_integration(tenant, "user", "server") == second
        assert first.pending is not None and second.pending is not None
        assert await repo.find_user_integration_by_pending_state(first.pending.state) is None
        assert await repo.find_user_integration_by_pending_state(second.pending.state) == second
        absent = record(tenant, "user", "absent")
        assert await repo.compare_and_swap_user_integration(absent, "r1") is False
        assert await repo.get_user_integration(tenant, "user", "absent") is None

    async def test_compare_and_swap_of_an_empty_record_deletes(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        saved = record(tenant, "user", "server", revision="r1")
        await repo.save_user_integration(saved)
        tombstone = MCPUserIntegrationRecord(tenant=tenant, user_uuid="user", server_name="server")
        assert await repo.compare_and_swap_user_integration(tombstone, "r0") is False
        assert await repo.compare_and_swap_user_integration(tombstone, None) is False
        assert await repo.compare_and_swap_user_integration(tombstone, "r1") is True
        assert await repo.get_user_integration(tenant, "user", "server") is None
        assert saved.pending is not None
        assert await repo.find_user_integration_by_pending_state(saved.pending.state) is None
        assert await repo.compare_and_swap_user_integration(tombstone, None) is True

    async def test_concurrent_compare_and_swaps_over_one_revision_have_one_winner(
        self, repo: MCPOAuthRepository, tenant: str
    ) -> None:
        await repo.save_user_integration(record(tenant, "user", "server", revision="base"))
        attempts = [record(tenant, "user", "server", revision=f"r{number}") for number in range(8)]
        won = await asyncio.gather(
            *(repo.compare_and_swap_user_integration(attempt, "base") for attempt in attempts)
        )
        assert sum(won) == 1
        winner = attempts[won.index(True)]
        assert await repo.get_user_integration(tenant, "user", "server") == winner

    # ------------------------------------------------------------ credentials

    async def test_credentials_are_not_at_rest_in_clear(
        self, repo: MCPOAuthRepository, tenant: str, raw_bytes: Callable[[], bytes] | None
    ) -> None:
        if raw_bytes is None:
            pytest.skip("no `raw_bytes` fixture: what is at rest is not checked")
        saved = record(tenant, "user", "server")
        secret = unique("client-secret")
        await repo.save_user_integration(saved)
        await repo.save_client_info(
            MCPOAuthClientInfoRecord(
                tenant=tenant,
                server_name="server",
                client_info={"client_id": "c", "client_secret": secret},
            )
        )
        stored = raw_bytes()
        assert tenant.encode() in stored, "raw_bytes must return what the repository stores"
        assert saved.tokens is not None and saved.pending is not None
        credentials = [
            saved.tokens.access_token,
            saved.tokens.refresh_token or "",
            saved.pending.code_verifier,
            secret,
        ]
        assert [c for c in credentials if c.encode() in stored] == []

    async def test_without_a_key_credentials_are_refused_and_nothing_is_stored(
        self, repository_without_key: MCPOAuthRepository, tenant: str
    ) -> None:
        async with AsyncExitStack() as stack:
            repo = await open_store(lambda: repository_without_key, stack)
            assert repo.credentials_problem()
            with pytest.raises(MCPOAuthEncryptionNotConfiguredError):
                await repo.save_user_integration(record(tenant, "user", "server"))
            with pytest.raises(MCPOAuthEncryptionNotConfiguredError):
                await repo.compare_and_swap_user_integration(record(tenant, "user", "server"), None)
            with pytest.raises(MCPOAuthEncryptionNotConfiguredError):
                await repo.save_client_info(
                    MCPOAuthClientInfoRecord(
                        tenant=tenant,
                        server_name="s",
                        client_info={"client_id": "c", "client_secret": "x"},
                    )
                )
            assert await repo.get_user_integration(tenant, "user", "server") is None
            assert await repo.get_client_info(tenant, "s") is None
            public = MCPOAuthClientInfoRecord(
                tenant=tenant, server_name="s", client_info={"client_id": "c"}
            )
            await repo.save_client_info(public)
            assert await repo.get_client_info(tenant, "s") == public

    async def test_with_a_key_there_is_no_credentials_problem(
        self, repo: MCPOAuthRepository
    ) -> None:
        assert repo.credentials_problem() is None


class MCPOAuthRepositoryCrossProcessContract:
    """Processes racing compare-and-swap on one integration: one winner per revision."""

    processes: ClassVar[int] = 4
    rounds: ClassVar[int] = 30

    @pytest.fixture
    def repository_factory(self) -> StoreFactory:
        """Override: a picklable factory of the shared repository (able to encrypt)."""
        raise NotImplementedError("override `repository_factory`")

    def test_processes_racing_compare_and_swap_have_one_winner_per_revision(
        self, repository_factory: StoreFactory
    ) -> None:
        tenant = unique("tenant")
        names = [f"process-{number}" for number in range(self.processes)]
        results = _run_in_processes(
            _race, [(repository_factory, tenant, self.rounds, name) for name in names]
        )
        winners: dict[int, list[str]] = {}
        for name, won in zip(names, results, strict=True):
            for round_number in won:
                winners.setdefault(round_number, []).append(name)
        assert sorted(winners) == list(range(1, self.rounds + 1))
        doubles = {number: who for number, who in winners.items() if len(who) != 1}
        assert not doubles, f"revisions taken by more than one process: {doubles}"


async def _race(
    factory: StoreFactory, tenant: str, rounds: int, name: str, barrier: Any
) -> list[int]:
    """Read the integration and try to move it to the next round, until the last."""
    won: list[int] = []
    async with AsyncExitStack() as stack:
        repo: MCPOAuthRepository = await open_store(factory, stack)
        await asyncio.to_thread(barrier.wait, _TIMEOUT)
        while True:
            current = await repo.get_user_integration(tenant, "racer", "server")
            number = 0 if current is None else int(str(current.revision).split(":")[0])
            if number >= rounds:
                return won
            attempt = record(tenant, "racer", "server", revision=f"{number + 1}:{name}")
            expected = None if current is None else current.revision
            if await repo.compare_and_swap_user_integration(attempt, expected):
                won.append(number + 1)
