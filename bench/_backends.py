"""Store URLs for each backend, made fresh for one benchmark run and cleaned after."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator

POSTGRES_ADMIN_URL = os.environ.get(
    "TETHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("TETHER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ALL = ("memory", "file", "sqlite", "postgres", "redis")


@contextlib.contextmanager
def backend_url(name: str) -> Iterator[str]:
    if name == "memory":
        yield "memory://"
    elif name == "file":
        with tempfile.TemporaryDirectory() as directory:
            yield f"file://{directory}"
    elif name == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            yield f"sqlite:///{directory}/bench.db"
    elif name == "postgres":
        import psycopg

        database = f"tether_bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        try:
            yield f"{POSTGRES_ADMIN_URL.rpartition('/')[0]}/{database}"
        finally:
            with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    elif name == "redis":
        import redis

        prefix = f"tether-bench-{uuid.uuid4().hex[:8]}:"
        try:
            yield f"{REDIS_URL}?prefix={prefix}"
        finally:
            client = redis.Redis.from_url(REDIS_URL)
            for key in client.scan_iter(match=f"{prefix}*", count=1000):
                client.delete(key)
            client.close()
    else:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(ALL)}")


async def open_bundle(url: str) -> tuple[object, list[object]]:
    """The bundle for ``url`` with every distinct store opened (as setup_app does)."""
    from tether.stores import from_url

    bundle = from_url(url)
    opened: list[object] = []
    seen: set[int] = set()
    for store in bundle.setup_kwargs().values():
        if store is None or id(store) in seen:
            continue
        seen.add(id(store))
        if hasattr(store, "open"):
            await store.open()
        if hasattr(store, "aclose"):
            opened.append(store)
    return bundle, opened


async def close_all(opened: list[object]) -> None:
    for store in reversed(opened):
        await store.aclose()  # type: ignore[attr-defined]
