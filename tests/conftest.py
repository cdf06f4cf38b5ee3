"""Fixtures every test module may use."""

from tests.support.browser import browser, screenshot_dir
from tests.support.services import postgres_url, redis_url

__all__ = ["browser", "postgres_url", "redis_url", "screenshot_dir"]
