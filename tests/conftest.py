"""Fixtures every test module may use."""

from tests.support.backend_fixtures import backend, bundle, clock, places, store_url
from tests.support.browser import browser, screenshot_dir
from tests.support.clusters import (
    backend_cluster,
    cluster,
    crash_test_cluster,
    replica_backend,
    replica_cluster,
    replica_project,
    replica_root,
    replica_stores,
    replicas,
)
from tests.support.services import postgres_url, redis_url

# The contract kit's report of each store's capabilities (test_contracts.py).
pytest_plugins = ["tether.testing.contracts.report"]

__all__ = [
    "backend",
    "backend_cluster",
    "browser",
    "bundle",
    "clock",
    "cluster",
    "crash_test_cluster",
    "places",
    "postgres_url",
    "redis_url",
    "replica_backend",
    "replica_cluster",
    "replica_project",
    "replica_root",
    "replica_stores",
    "replicas",
    "screenshot_dir",
    "store_url",
]
