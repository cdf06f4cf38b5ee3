"""tether's log lines: where they go, what they look like, what they carry.

``tether serve`` calls ``configure_logging`` before anything logs; ``setup_app``
calls ``ensure_logging``, which does the same only when nobody configured
logging (``uvicorn app:app`` on the seed's wiring configures uvicorn's loggers
alone, and tether's lines would be dropped below WARNING).

Every line passes ``ContextFilter`` on its way out, which adds what is known
where it was logged: the request's id (``asgi-correlation-id`` keeps it in a
contextvar, from the ``x-request-id`` header a gateway set or generated) and the
turn's ``session_id``, ``message_id``, ``epoch`` and ``agent`` (``turn_log_context``
sets them while a turn runs, and around a takeover's lines). An access line
also gets its method, path, status and client as fields.

``TETHER_LOG_FORMAT=json`` writes one JSON object per line (python-json-logger);
``text``, the default, writes a readable line with the same context at its end.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any

from asgi_correlation_id.context import correlation_id
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

__all__ = [
    "LOG_FORMATS",
    "ContextFilter",
    "ProbeAccessFilter",
    "TurnFields",
    "configure_logging",
    "ensure_logging",
    "log_format_from_env",
    "turn_log_context",
]

LOG_FORMATS = ("text", "json")
_LOG_FORMAT_VARIABLE = "TETHER_LOG_FORMAT"
_OWN_LOGGERS = ("tether", "uvicorn", "asgi_correlation_id")
"""Loggers at the chosen level; every other library's speak from WARNING up
(an HTTP client's INFO line per request would drown the rest)."""
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
_PROBE_PREFIX = "/probes/"
_CONTEXT_FIELDS = ("request_id", "session_id", "message_id", "epoch", "agent")


@dataclass(frozen=True)
class TurnFields:
    """What names a turn on every line logged about it."""

    session_id: str | None
    message_id: str
    epoch: int | None
    agent: str | None = None


_turn: ContextVar[TurnFields | None] = ContextVar("tether_log_turn", default=None)


@contextmanager
def turn_log_context(fields: TurnFields) -> Iterator[None]:
    """Lines logged inside (and in tasks started inside) carry ``fields``."""
    token = _turn.set(fields)
    try:
        yield
    finally:
        _turn.reset(token)


class ContextFilter(logging.Filter):
    """Adds the request id and the turn's fields to each record (a handler's
    filter: a logger's filters see only the records of that very logger).

    A field a call passed itself (``extra=``) is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        found: dict[str, Any] = {"request_id": correlation_id.get()}
        turn = _turn.get()
        if turn is not None:
            found.update(asdict(turn))
        for name, value in found.items():
            if value is not None and getattr(record, name, None) is None:
                setattr(record, name, value)
        if record.name == "uvicorn.access":
            _add_access_fields(record)
        return True


def _add_access_fields(record: logging.LogRecord) -> None:
    """uvicorn's access line is ``'%s - "%s %s HTTP/%s" %d'`` with its parts as args."""
    args = record.args
    if isinstance(args, tuple) and len(args) == 5:
        client, method, path, _version, status = args
        record.client = client
        record.method = method
        record.path = path
        record.status = status


class ProbeAccessFilter(logging.Filter):
    """Keeps health probes out of the access log at INFO: a load balancer
    checks each replica several times a second. At DEBUG they are logged, as
    DEBUG. (On the ``uvicorn.access`` logger itself.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 5):
            return True
        path = str(args[2])
        if not path.startswith(_PROBE_PREFIX):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class _TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [request_id=… session_id=…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{name}={getattr(record, name)}"
            for name in _CONTEXT_FIELDS
            if getattr(record, name, None) is not None
        )
        if not context:
            return line
        # The context goes on the first line: a traceback stays below it.
        first, newline, rest = line.partition("\n")
        return f"{first} [{context}]{newline}{rest}"


def _json_formatter() -> logging.Formatter:
    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
        # uvicorn's copy of its message with terminal colours: noise in a pipeline.
        reserved_attrs=[*RESERVED_ATTRS, "color_message"],
    )


class _TetherHandler(logging.StreamHandler):
    """The handler tether installs (found again by its class: idempotence)."""


def log_format_from_env(environ: Mapping[str, str] | None = None) -> str:
    """``TETHER_LOG_FORMAT`` (``text`` when unset); anything else is an error."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(_LOG_FORMAT_VARIABLE, "").strip().lower() or "text"
    if chosen not in LOG_FORMATS:
        allowed = ", ".join(LOG_FORMATS)
        raise ValueError(f"{_LOG_FORMAT_VARIABLE}={chosen!r} is not one of {allowed}")
    return chosen


def configure_logging(level: str | int = "info", log_format: str | None = None) -> None:
    """Send every line to stderr through tether's handler, in ``log_format``
    (default: ``TETHER_LOG_FORMAT``): tether's and uvicorn's from ``level``,
    other libraries' from WARNING. uvicorn's loggers lose their own handlers
    and pass their lines up, so access lines carry the request id too.

    Idempotent: a second call replaces tether's handler."""
    chosen = log_format or log_format_from_env()
    if chosen not in LOG_FORMATS:
        raise ValueError(f"log format {chosen!r} is not one of {', '.join(LOG_FORMATS)}")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"{level!r} is not a log level")
    handler = _TetherHandler(sys.stderr)
    handler.setFormatter(_json_formatter() if chosen == "json" else _TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _TetherHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in _UVICORN_LOGGERS:
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    for name in _OWN_LOGGERS:
        logging.getLogger(name).setLevel(numeric)
    _filter_probes()


def ensure_logging(log_format: str | None = None) -> None:
    """``configure_logging`` at INFO, unless the process configured logging
    already (``tether serve``, an embedding application, a test runner): then
    only the probes are kept out of the access log."""
    if logging.getLogger().handlers or logging.getLogger("tether").handlers:
        _filter_probes()
        return
    configure_logging("info", log_format)


def _filter_probes() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, ProbeAccessFilter) for f in access.filters):
        access.addFilter(ProbeAccessFilter())
