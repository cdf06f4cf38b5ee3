"""The MCP OAuth repository contract over every shipped repository, and across processes."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.mcp.raw_rows import raw_store_bytes
from tests.support.services import postgres_database
from tether.adapters.mcp import (
    InMemoryMCPOAuthRepository,
    LocalFileMCPOAuthRepository,
    MCPOAuthCipher,
    MCPOAuthRepository,
    generate_encryption_key,
)
from tether.testing.contracts import TRICKY_IDS, StoreFactory
from tether.testing.contracts.mcp_oauth import (
    MCPOAuthRepositoryContract,
    MCPOAuthRepositoryCrossProcessContract,
)

KEY = generate_encryption_key()


def _file_repository(path: str, key: str | None) -> LocalFileMCPOAuthRepository:
    return LocalFileMCPOAuthRepository(path, MCPOAuthCipher([key] if key else []))


def _sqlite_repository(url: str, key: str | None) -> MCPOAuthRepository:
    from tether.adapters.mcp.sqlite_repository import SQLiteMCPOAuthRepository

    return SQLiteMCPOAuthRepository.from_url(url, MCPOAuthCipher([key] if key else []))


def _postgres_repository(url: str, key: str | None) -> MCPOAuthRepository:
    from tether.adapters.mcp.postgres_repository import PostgresMCPOAuthRepository

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
