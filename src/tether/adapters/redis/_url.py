"""Store URLs: tether's own query parameters, the client's defaults, a printable name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tether.adapters.redis._keys import DEFAULT_PREFIX
from tether.domain.store_bundle import StoreURLError

DEFAULT_STREAM_TTL = 6 * 60 * 60
"""Seconds a supervision row or recording outlives its last write (6 hours)."""

# Bounded so that a call during an outage fails within about two seconds instead
# of hanging on the driver's defaults (5 s timeouts, 10 retries); one quick retry
# still hides a single dropped connection. The URL may override the timeouts.
_CONNECT_TIMEOUT = 1.0
_SOCKET_TIMEOUT = 2.0
_RETRIES = 1
# A bounded pool that callers queue for: a thousand turns starting at once must
# wait a few milliseconds for a connection, not fail. 32 is far more than one
# replica's sub-millisecond commands keep busy, and far below the server's
# default limit of 10,000 clients even with a hundred replicas.
_MAX_CONNECTIONS = 32
_POOL_TIMEOUT = 5.0


@dataclass(frozen=True)
class RedisURL:
    """A store URL split into what the driver gets and what tether keeps."""

    client_url: str
    name: str
    prefix: str
    stream_ttl: int
    state_ttl: int | None


def parse_url(url: str) -> RedisURL:
    """Take ``prefix``, ``stream_ttl`` and ``state_ttl`` out of the query string.

    Everything else in the URL (host, db, password, ``socket_timeout``, ...) is
    left for redis-py. Raises ``StoreURLError`` for a bad value.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise StoreURLError(f"not a Redis URL: {describe_url(url)}")
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in ("prefix", "stream_ttl", "state_ttl"):
            if name in ours:
                raise StoreURLError(f"store URL {describe_url(url)}: {name} given twice")
            ours[name] = value
        else:
            rest.append((name, value))
    name = describe_url(url)
    state_ttl = _seconds(name, "state_ttl", ours.get("state_ttl", "0"), allow_zero=True)
    return RedisURL(
        client_url=urlunsplit(parts._replace(query=urlencode(rest))),
        name=name,
        prefix=ours.get("prefix", DEFAULT_PREFIX),
        stream_ttl=_seconds(name, "stream_ttl", ours.get("stream_ttl", str(DEFAULT_STREAM_TTL))),
        state_ttl=state_ttl or None,
    )


def client_defaults() -> dict[str, Any]:
    """Keyword arguments for ``redis.asyncio.Redis.from_url``; query values win."""
    return {
        "socket_connect_timeout": _CONNECT_TIMEOUT,
        "socket_timeout": _SOCKET_TIMEOUT,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.05), retries=_RETRIES),
    }


def pool_defaults() -> dict[str, Any]:
    """Keyword arguments for ``BlockingConnectionPool.from_url``; query values
    (``max_connections``, ``timeout``) win."""
    return {"max_connections": _MAX_CONNECTIONS, "timeout": _POOL_TIMEOUT}


def describe_url(url: str) -> str:
    """``url`` without its password and query string, fit for messages and logs."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    user = f"{parts.username}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}:{port or 6379}{parts.path or '/0'}"


def _seconds(name: str, parameter: str, value: str, *, allow_zero: bool = False) -> int:
    try:
        seconds = int(value)
    except ValueError:
        seconds = -1
    if seconds < 0 or (seconds == 0 and not allow_zero):
        least = "0 (never expire) or more" if allow_zero else "a positive number"
        raise StoreURLError(
            f"store URL {name}: {parameter}={value!r} must be whole seconds, {least}"
        )
    return seconds
