"""``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db``, with options."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from tether.domain.store_bundle import StoreURLError

DEFAULT_BUSY_TIMEOUT = 5.0
"""Seconds a statement waits for another connection's write lock before giving up."""


@dataclass(frozen=True)
class SQLiteURL:
    """A parsed SQLite store URL: the database file and the connection options."""

    path: str
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT


def parse_url(url: str) -> SQLiteURL:
    """Parse ``url``; a malformed one raises ``StoreURLError`` saying what is wrong.

    Three slashes then a relative path (resolved against the working directory
    now, so a later ``chdir`` cannot move the database), or four slashes then an
    absolute one, as SQLAlchemy spells them. The one query parameter is
    ``busy_timeout`` (seconds, default 5).
    """
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise StoreURLError(f"store URL {url!r} is not a sqlite:// URL")
    if parts.netloc:
        raise StoreURLError(
            f"store URL {url!r}: a SQLite URL has no host; write sqlite:///relative/path.db "
            "or sqlite:////absolute/path.db"
        )
    path = unquote(parts.path)[1:]  # the slash that ends the empty authority
    if not path or path.endswith("/"):
        raise StoreURLError(f"store URL {url!r} names no database file")
    if path == ":memory:":
        # Every store opens its own connections, and each would get a private,
        # empty in-memory database: nothing would be shared.
        raise StoreURLError(f"store URL {url!r}: the stores need a database file, not :memory:")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    busy_timeout = DEFAULT_BUSY_TIMEOUT
    if "busy_timeout" in options:
        busy_timeout = _seconds(url, options.pop("busy_timeout"))
    if options:
        raise StoreURLError(
            f"store URL {url!r}: unknown option(s) {', '.join(sorted(options))} "
            "(known: busy_timeout)"
        )
    return SQLiteURL(path=os.path.abspath(path), busy_timeout=busy_timeout)


def _seconds(url: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise StoreURLError(f"store URL {url!r}: busy_timeout must be seconds >= 0, not {raw!r}")
    return value
