"""Logs, traces and metrics of a running server (see "Logs, traces and
metrics", docs/deployment/logs-and-traces.md). Nothing of OpenTelemetry is imported from here:
``tether.observability.otel`` is, by ``tracing_from_env``, when tracing is on."""

from tether.observability.logs import (
    TurnFields,
    configure_logging,
    ensure_logging,
    turn_log_context,
)
from tether.observability.request_ids import REQUEST_ID_HEADER, install_request_ids
from tether.observability.traces import NO_TRACING, Tracing
from tether.observability.tracing_setup import tracing_from_env

__all__ = [
    "NO_TRACING",
    "REQUEST_ID_HEADER",
    "Tracing",
    "TurnFields",
    "configure_logging",
    "ensure_logging",
    "install_request_ids",
    "tracing_from_env",
    "turn_log_context",
]
