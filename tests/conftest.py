"""Fixtures every test module may use."""

from tests.support.services import postgres_url, redis_url

__all__ = ["postgres_url", "redis_url"]
