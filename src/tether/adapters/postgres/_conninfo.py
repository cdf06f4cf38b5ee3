"""Store URLs: tether's own query parameters, libpq defaults, password redaction, and
the pools built on them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from tether.domain.store_bundle import StoreURLError

# Set unless the URL says otherwise: a bounded connect, and TCP keepalives so a
# silently vanished server is noticed in about half a minute instead of the
# kernel's two hours (this matters most for the idle LISTEN connection).
LIBPQ_DEFAULTS: dict[str, str] = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "application_name": "tether",
}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class PostgresOptions:
    """tether's own query parameters of a ``postgresql://`` store URL.

    - ``create_schema`` (default true): create or upgrade the schema at ``open()``.
      Safe with many replicas (migrations run under an advisory lock); set it to
      false where the runtime role may not run DDL and run ``tether db upgrade``
      in the deploy step instead; ``open()`` then only checks the version.
    - ``pool_min_size`` (1) and ``pool_max_size`` (10): the connection pool's bounds.
    - ``timeout`` (5 seconds): the longest any store call may take, waiting for a
      connection included, before it raises ``StoreUnavailableError``; also bounds
      ``open()``, and how long the server lets a session sit idle inside a
      transaction (see ``with_libpq_defaults``).
    """

    create_schema: bool = True
    pool_min_size: int = 1
    pool_max_size: int = 10
    timeout: float = 5.0


def split_store_url(url: str) -> tuple[str, PostgresOptions]:
    """The URL minus tether's parameters (what libpq gets), and those parameters.

    Raises ``StoreURLError`` (naming the URL without its password) for a bad value.
    """
    parts = urlsplit(url)
    kept: list[str] = []
    ours: dict[str, str] = {}
    # Other parameters are passed on byte for byte: libpq only percent-decodes,
    # so a re-encoding round trip could turn a "+" in a value into a space.
    for piece in filter(None, parts.query.split("&")):
        name, _, value = piece.partition("=")
        if unquote(name) in PostgresOptions.__dataclass_fields__:
            ours[unquote(name)] = unquote(value)
        else:
            kept.append(piece)
    libpq_url = urlunsplit(parts._replace(query="&".join(kept)))
    try:
        options = PostgresOptions(
            create_schema=_boolean(ours.get("create_schema", "true")),
            pool_min_size=int(ours.get("pool_min_size", "1")),
            pool_max_size=int(ours.get("pool_max_size", "10")),
            timeout=float(ours.get("timeout", "5")),
        )
    except ValueError as error:
        raise StoreURLError(f"store URL {redact(url)}: {error}") from error
    if not 0 <= options.pool_min_size <= options.pool_max_size or options.pool_max_size < 1:
        raise StoreURLError(
            f"store URL {redact(url)}: need 0 <= pool_min_size <= pool_max_size, pool_max_size >= 1"
        )
    if not (math.isfinite(options.timeout) and options.timeout > 0):
        raise StoreURLError(f"store URL {redact(url)}: timeout must be a positive number")
    return libpq_url, options


def with_libpq_defaults(conninfo: str, *, idle_in_transaction: float) -> str:
    """``conninfo`` with :data:`LIBPQ_DEFAULTS` added where it sets nothing itself,
    and the server asked to end a session left idle inside a transaction for
    ``idle_in_transaction`` seconds (``idle_in_transaction_session_timeout``,
    unless the URL's ``options`` set it).

    Why: a replica stopped inside a transaction (SIGSTOP, a frozen VM, a
    debugger) keeps its row locks for as long as it is stopped, and a takeover
    must write that row (its fence). None of tether's transactions waits on
    anything but the server, and a store call gives up after ``timeout``
    seconds anyway, so a session idle in a transaction that long is stopped;
    the server ending it rolls its write back, which its epoch fences anyway."""
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as error:
        raise StoreURLError(f"store URL {redact(conninfo)}: {error}") from error
    missing = {name: value for name, value in LIBPQ_DEFAULTS.items() if name not in given}
    options = str(given.get("options") or "")
    if "idle_in_transaction_session_timeout" not in options:
        bound = (
            f"-c idle_in_transaction_session_timeout={max(1, round(idle_in_transaction * 1000))}"
        )
        missing["options"] = f"{options} {bound}".strip()
    return make_conninfo(conninfo, **missing)


def pool_on(
    libpq_url: str, options: PostgresOptions, *, name: str, size: int | None = None
) -> AsyncConnectionPool[Any]:
    """A pool of autocommit connections on ``libpq_url`` (with the libpq
    defaults), not opened yet: within ``options``' bounds, or of exactly
    ``size`` connections.

    ``check_connection``: after a server restart, pooled connections are dead;
    each is tested when handed out and replaced if broken, and the pool keeps
    reconnecting in the background meanwhile."""
    return AsyncConnectionPool(
        with_libpq_defaults(libpq_url, idle_in_transaction=options.timeout),
        kwargs={"autocommit": True},
        min_size=options.pool_min_size if size is None else size,
        max_size=options.pool_max_size if size is None else size,
        timeout=options.timeout,
        check=AsyncConnectionPool.check_connection,
        name=name,
        open=False,
    )


def redact(conninfo: str) -> str:
    """``conninfo`` (a URL or ``key=value`` string) safe to log: no password in it."""
    if "://" not in conninfo:
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError:
            return "<unparsable connection string>"
        if "password" in params:
            params["password"] = "***"
        return make_conninfo("", **params)
    parts = urlsplit(conninfo)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{hosts}"
    query = "&".join(
        "password=***" if unquote(piece.partition("=")[0]) == "password" else piece
        for piece in filter(None, parts.query.split("&"))
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {text!r}")
