"""The MCP OAuth repository contract over every shipped repository, and across processes."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp.raw_rows import raw_store_bytes
from tests.support.services import postgres_database
from tether.adapters.mcp import (
    InMemoryMCPOAuthRepository,
    LocalFileMCPOAuthRepository,
    MCPOAuthCipher,
    MCPOAuthClientInfoRecord,
    MCPOAuthDecryptionError,
    MCPOAuthIntegrationStore,
    MCPOAuthRepository,
    generate_encryption_key,
)
from tether.testing.contracts import TRICKY_IDS, StoreFactory
from tether.testing.contracts._support import open_store, unique
from tether.testing.contracts.cross_process import _run_in_processes
from tether.testing.contracts.mcp_oauth import (
    MCPOAuthRepositoryContract,
    MCPOAuthRepositoryCrossProcessContract,
)

KEY = generate_encryption_key()


def _file_repository(path: str, key: str | None) -> LocalFileMCPOAuthRepository:
    return LocalFileMCPOAuthRepository(path, MCPOAuthCipher([key] if key else []))


def _sqlite_repository(url: str, key: str | None) -> MCPOAuthRepository:
    from tether.adapters.sqlite.mcp_repository import SQLiteMCPOAuthRepository

    return SQLiteMCPOAuthRepository.from_url(url, MCPOAuthCipher([key] if key else []))


def _postgres_repository(url: str, key: str | None) -> MCPOAuthRepository:
    from tether.adapters.postgres.mcp_repository import PostgresMCPOAuthRepository

    return PostgresMCPOAuthRepository.from_url(url, MCPOAuthCipher([key] if key else []))


@pytest.fixture(scope="module")
def postgres_store() -> Iterator[str]:
    """One database for the module: every contract test uses fresh ids."""
    with postgres_database() as url:
        yield url


@pytest.fixture(
    params=["memory", "file", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_repository(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[[str | None], MCPOAuthRepository]:
    if backend == "memory":
        return lambda key: InMemoryMCPOAuthRepository(MCPOAuthCipher([key] if key else []))
    if backend == "file":
        return functools.partial(_file_repository, str(tmp_path / "mcp-oauth"))
    if backend == "sqlite":
        return functools.partial(_sqlite_repository, f"sqlite:///{tmp_path}/tether.db")
    url = request.getfixturevalue("postgres_store")
    return functools.partial(_postgres_repository, url)


class TestMCPOAuthRepositories(MCPOAuthRepositoryContract):
    @pytest.fixture
    def repository(
        self, make_repository: Callable[[str | None], MCPOAuthRepository]
    ) -> MCPOAuthRepository:
        return make_repository(KEY)

    @pytest.fixture
    def repository_without_key(
        self, make_repository: Callable[[str | None], MCPOAuthRepository]
    ) -> MCPOAuthRepository:
        return make_repository(None)

    @pytest.fixture
    def raw_bytes(
        self,
        backend: str,
        repository: MCPOAuthRepository,
        tmp_path: Path,
        request: pytest.FixtureRequest,
    ) -> Callable[[], bytes]:
        if backend == "memory":
            assert isinstance(repository, InMemoryMCPOAuthRepository)
            memory = repository
            return lambda: json.dumps(list(memory.raw_documents())).encode()
        if backend == "file":
            return lambda: raw_store_bytes(f"file://{tmp_path}")
        if backend == "sqlite":
            return lambda: raw_store_bytes(f"sqlite:///{tmp_path}/tether.db")
        url = request.getfixturevalue("postgres_store")
        return lambda: raw_store_bytes(url)

    @pytest.fixture(autouse=True)
    def _narrow_ids(self, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
        if backend == "postgres":
            # PostgreSQL text cannot hold NUL; the repository refuses such ids.
            narrowed = tuple(value for value in TRICKY_IDS if "\x00" not in value)
            monkeypatch.setattr(self, "tricky_ids", narrowed)


@pytest.fixture(params=["file", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "file":
        return functools.partial(_file_repository, str(tmp_path / "mcp-oauth"), KEY)
    if request.param == "sqlite":
        return functools.partial(_sqlite_repository, f"sqlite:///{tmp_path}/tether.db", KEY)
    url = request.getfixturevalue("postgres_store")
    return functools.partial(_postgres_repository, url, KEY)


class TestMCPOAuthRepositoriesAcrossProcesses(MCPOAuthRepositoryCrossProcessContract):
    @pytest.fixture
    def repository_factory(self, shared_factory: StoreFactory) -> StoreFactory:
        return shared_factory


# ------------------------------------------------------------ client info compare-and-swap
# ``compare_and_swap_client_info`` is optional in the repository ABC (its default
# is atomic within one process); every shipped repository overrides it.


def _client(
    tenant: str, client_id: str, revision: str | None, **extra: Any
) -> MCPOAuthClientInfoRecord:
    return MCPOAuthClientInfoRecord(
        tenant=tenant,
        server_name="server",
        client_info={"client_id": client_id, "client_secret": f"secret-of-{client_id}", **extra},
        revision=revision,
    )


async def _opened(
    make_repository: Callable[[str | None], MCPOAuthRepository], stack: AsyncExitStack
) -> MCPOAuthRepository:
    repository: MCPOAuthRepository = await open_store(lambda: make_repository(KEY), stack)
    return repository


async def test_client_info_compare_and_swap_inserts_once_then_writes_over_its_revision(
    make_repository: Callable[[str | None], MCPOAuthRepository],
) -> None:
    tenant = unique("tenant")
    async with AsyncExitStack() as stack:
        repo = await _opened(make_repository, stack)
        first = _client(tenant, "c1", "r1")
        assert await repo.compare_and_swap_client_info(first, None) is True
        assert await repo.get_client_info(tenant, "server") == first
        assert await repo.compare_and_swap_client_info(_client(tenant, "c2", "r2"), None) is False
        stale = _client(tenant, "c1", "r0")
        assert await repo.compare_and_swap_client_info(_client(tenant, "c3", "r3"), stale) is False
        assert await repo.get_client_info(tenant, "server") == first
        second = _client(tenant, "c1", "r4", other_clients=[{"client_id": "c4"}])
        assert await repo.compare_and_swap_client_info(second, first) is True
        assert await repo.get_client_info(tenant, "server") == second
        absent = _client(tenant, "c9", "r9").model_copy(update={"server_name": "absent"})
        assert await repo.compare_and_swap_client_info(absent, first) is False
        assert await repo.get_client_info(tenant, "absent") is None
        # A row written before revisions existed is swapped over as such, once.
        legacy = _client(tenant, "old", None).model_copy(update={"server_name": "legacy"})
        await repo.save_client_info(legacy)
        newer = legacy.model_copy(update={"revision": "r1"})
        assert await repo.compare_and_swap_client_info(newer, legacy) is True
        assert await repo.compare_and_swap_client_info(newer, legacy) is False


async def test_concurrent_client_info_inserts_have_one_winner(
    make_repository: Callable[[str | None], MCPOAuthRepository],
) -> None:
    tenant = unique("tenant")
    async with AsyncExitStack() as stack:
        repo = await _opened(make_repository, stack)
        attempts = [_client(tenant, f"c{number}", f"r{number}") for number in range(8)]
        won = await asyncio.gather(
            *(repo.compare_and_swap_client_info(attempt, None) for attempt in attempts)
        )
        assert sum(won) == 1
        assert await repo.get_client_info(tenant, "server") == attempts[won.index(True)]


async def test_the_secrets_of_every_kept_client_are_sealed_and_bound_to_it(
    tmp_path: Path,
) -> None:
    """The sealing is the codec's, shared by every shipped repository; files show it plainly."""
    make_repository = functools.partial(_file_repository, str(tmp_path / "mcp-oauth"))
    tenant = unique("tenant")
    others = [
        {"client_id": "c2", "client_secret": unique("second-secret")},
        {"client_id": "c3", "client_secret": unique("third-secret"), "other": 1},
    ]
    async with AsyncExitStack() as stack:
        repo = await _opened(make_repository, stack)
        saved = _client(tenant, "c1", "r1", other_clients=others)
        await repo.save_client_info(saved)
        assert await repo.get_client_info(tenant, "server") == saved
        stored = raw_store_bytes(f"file://{tmp_path}")
        secrets = [saved.client_info["client_secret"], *(o["client_secret"] for o in others)]
        assert [s for s in secrets if s.encode() in stored] == []
        # A sealed secret moved to another kept client does not open.
        [path] = (tmp_path / "mcp-oauth" / "clients").rglob("*.json")
        document = json.loads(path.read_text())
        kept = document["client_info"]["other_clients"]
        kept[0]["client_secret"], kept[1]["client_secret"] = (
            kept[1]["client_secret"],
            kept[0]["client_secret"],
        )
        path.write_text(json.dumps(document))
        with pytest.raises(MCPOAuthDecryptionError):
            await repo.get_client_info(tenant, "server")


@pytest.mark.processes
def test_processes_racing_client_info_compare_and_swap_have_one_winner_per_revision(
    shared_factory: StoreFactory,
) -> None:
    tenant = unique("tenant")
    names = [f"process-{number}" for number in range(4)]
    results = _run_in_processes(
        _race_client_info, [(shared_factory, tenant, 20, name) for name in names]
    )
    winners: dict[int, list[str]] = {}
    for name, won in zip(names, results, strict=True):
        for round_number in won:
            winners.setdefault(round_number, []).append(name)
    assert sorted(winners) == list(range(1, 21))
    assert all(len(who) == 1 for who in winners.values()), winners


async def _race_client_info(
    factory: StoreFactory, tenant: str, rounds: int, name: str, barrier: Any
) -> list[int]:
    won: list[int] = []
    async with AsyncExitStack() as stack:
        repo: MCPOAuthRepository = await open_store(factory, stack)
        await asyncio.to_thread(barrier.wait, 120)
        while True:
            current = await repo.get_client_info(tenant, "server")
            number = 0 if current is None else int(str(current.revision).split(":")[0])
            if number >= rounds:
                return won
            attempt = _client(tenant, f"c-{name}", f"{number + 1}:{name}")
            if await repo.compare_and_swap_client_info(attempt, current):
                won.append(number + 1)


# ------------------------------------------------------------ one registration across replicas


class _Counted:
    """Counts a repository's client info reads (to know a replica is waiting)."""

    def __init__(self, repository: MCPOAuthRepository) -> None:
        self.reads = 0
        self.reading = asyncio.Event()
        original = repository.get_client_info

        async def get_client_info(tenant: str, server_name: str) -> MCPOAuthClientInfoRecord | None:
            self.reads += 1
            if self.reads >= 2:
                self.reading.set()
            return await original(tenant, server_name)

        repository.get_client_info = get_client_info  # type: ignore[method-assign]


async def _yield(seconds: float) -> None:
    await asyncio.sleep(0)  # a waiting replica polls; the test decides when to go on


async def test_replicas_needing_a_client_at_once_register_one_between_them(
    backend: str, make_repository: Callable[[str | None], MCPOAuthRepository]
) -> None:
    """Two replicas start the first turn of a new tenant with one MCP server at
    once. The first takes the registration lease and registers (held at the
    authorization server); the second finds the lease and waits for its
    client instead of registering one of its own. Before, both registered
    and one client was kept: an orphan client at the server each time."""
    tenant = unique("tenant")
    uri = "https://tether.example/mcp/oauth/callback"
    first_repository = make_repository(KEY)
    second_repository = first_repository if backend == "memory" else make_repository(KEY)
    async with AsyncExitStack() as stack:
        for repository in {id(r): r for r in (first_repository, second_repository)}.values():
            opened = getattr(repository, "open", None)
            if opened is not None:
                await opened()
            stack.push_async_callback(repository.aclose)
        first = MCPOAuthIntegrationStore(first_repository, sleep=_yield)
        second = MCPOAuthIntegrationStore(second_repository, sleep=_yield)
        registering, second_registering, go_on = asyncio.Event(), asyncio.Event(), asyncio.Event()
        made: list[str] = []

        async def register() -> dict[str, Any]:
            made.append(f"client-{len(made) + 1}")
            client_id = made[-1]
            (registering if len(made) == 1 else second_registering).set()
            await go_on.wait()
            return {
                "client_id": client_id,
                "client_secret": f"secret-of-{client_id}",
                "redirect_uris": [uri],
                "issuer": "https://as.example/",
                "source": "dynamic_registration",
            }

        def needs_client(store: MCPOAuthIntegrationStore) -> asyncio.Task[dict[str, Any]]:
            return asyncio.create_task(
                store.registered_client(
                    tenant, "srv", issuer="https://as.example/", redirect_uri=uri, register=register
                )
            )

        one = needs_client(first)
        await registering.wait()  # the first replica holds the lease, registering
        watched = _Counted(second_repository)
        other = needs_client(second)
        # The second has read the lease at least twice (it waits), or registers too.
        waits = [asyncio.create_task(e.wait()) for e in (watched.reading, second_registering)]
        await asyncio.wait(waits, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        assert made == ["client-1"], "the second replica registered a client of its own"
        go_on.set()
        clients = await asyncio.gather(one, other)
    assert made == ["client-1"], "one registration at the authorization server"
    assert [client["client_id"] for client in clients] == ["client-1", "client-1"]
