"""Every shipped backend's stores, for suites that run once per backend.

``BACKENDS`` are pytest params with readable ids (``memory``, ``file``,
``sqlite``, ``postgres``, ``redis``) and the marks their servers need;
``open_bundle`` opens the four stores of one backend (Redis has no
conversation store) and closes them afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import postgres_database, redis_prefix
from tether import stores
from tether.stores import StoreBundle

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("file", id="file"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]
"""Every backend that ships with tether."""

CONVERSATION_BACKENDS = [param for param in BACKENDS if param.id != "redis"]
"""The backends with a conversation store (Redis has none)."""


@contextlib.contextmanager
def backend_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A store URL of ``backend`` that no other test shares."""
    if backend == "memory":
        yield "memory://"
    elif backend == "file":
        yield f"file://{tmp_path / 'stores'}"
    elif backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'stores.db'}"
    elif backend == "postgres":
        with postgres_database() as url:
            yield url
    elif backend == "redis":
        with redis_prefix() as url:
            yield url
    else:
        raise ValueError(f"unknown backend {backend!r}")


@contextlib.asynccontextmanager
async def open_bundle(url: str) -> AsyncIterator[StoreBundle]:
    """The stores of ``url``, opened; closed on exit."""
    bundle = stores.from_url(url)
    opened: list[Any] = []
    try:
        for store in bundle.setup_kwargs().values():
            if store is not None and hasattr(store, "open"):
                await store.open()
                opened.append(store)
        yield bundle
    finally:
        for store in reversed(opened):
            await store.aclose()
