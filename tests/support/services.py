"""PostgreSQL and Redis for tests: each test gets its own database or key prefix.

Without a server the tests skip, saying how to start one; with
``TETHER_REQUIRE_SERVICES=1`` (set by ``.ci/run``) they fail instead. Every
skip for something missing from the machine (a server, a driver, a program)
goes through ``missing`` (or ``import_or_skip``, ``unavailable``), so CI
never passes by skipping what it was meant to test.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import NoReturn

import pytest

POSTGRES_URL = os.environ.get(
    "TETHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("TETHER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_HOW = (
    "start PostgreSQL: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
    " (or set TETHER_TEST_POSTGRES_URL)"
)
REDIS_HOW = (
    "start Redis: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ''"
    " (or set TETHER_TEST_REDIS_URL)"
)
DRIVERS_HOW = "install the drivers: make install-dev (pip install -e '.[dev]')"


def services_required() -> bool:
    return os.environ.get("TETHER_REQUIRE_SERVICES") == "1"


def missing(message: str) -> NoReturn:
    """Skip (the test, or the module when called at import) for something this
    machine lacks; with ``TETHER_REQUIRE_SERVICES=1``, fail instead."""
    if services_required():
        pytest.fail(f"TETHER_REQUIRE_SERVICES=1: {message}")
    pytest.skip(message, allow_module_level=True)


def unavailable(what: str, how: str, error: BaseException) -> NoReturn:
    missing(f"{what} is not reachable ({error}); {how}")


def import_or_skip(module: str, how: str = DRIVERS_HOW) -> ModuleType:
    """``pytest.importorskip`` that honours ``TETHER_REQUIRE_SERVICES=1``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing(f"cannot import {module} ({error}); {how}")


def _with_database(url: str, database: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{database}"


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty database (its URL), dropped afterwards."""
    psycopg = import_or_skip("psycopg")
    name = f"tether_test_{uuid.uuid4().hex[:16]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as error:
        unavailable("PostgreSQL", POSTGRES_HOW, error)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(POSTGRES_URL, name)
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def redis_prefix() -> Iterator[str]:
    """The Redis URL with a unique ``prefix`` query parameter; its keys are
    deleted afterwards."""
    redis = import_or_skip("redis")
    prefix = f"tether-test-{uuid.uuid4().hex[:12]}:"
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as error:
        client.close()
        unavailable("Redis", REDIS_HOW, error)
    separator = "&" if "?" in REDIS_URL else "?"
    try:
        yield f"{REDIS_URL}{separator}prefix={prefix}"
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            client.delete(key)
        client.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty database for one test."""
    with postgres_database() as url:
        yield url


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A key prefix of its own for one test."""
    with redis_prefix() as url:
        yield url
