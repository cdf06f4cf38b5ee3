"""Fixtures every test module may use."""

from tests.support.backend_fixtures import backend, bundle, clock, places, store_url
from tests.support.browser import browser, screenshot_dir
from tests.support.services import postgres_url, redis_url

# The contract kit's report of each store's capabilities (test_contracts.py).
pytest_plugins = ["tether.testing.contracts.report"]

__all__ = [
    "backend",
    "browser",
    "bundle",
    "clock",
    "places",
    "postgres_url",
    "redis_url",
    "screenshot_dir",
    "store_url",
]
