"""Tracing as the rest of tether sees it, with nothing of OpenTelemetry imported.

Everything in tether talks to the small interface below; ``NO_TRACING`` is
it doing nothing, and ``tether.observability.otel`` implements it with the
SDK (``observability.tracing_setup`` chooses), so a server without tracing
runs exactly as before.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

__all__ = [
    "NO_TRACING",
    "Span",
    "Tracing",
    "TurnSpan",
]

Attributes = Mapping[str, str | int | float | bool]


class Span(ABC):
    """A span in progress: a model call, a tool call."""

    @abstractmethod
    def set_attributes(self, attributes: Attributes) -> None:
        """Add or replace attributes."""

    @abstractmethod
    def fail(self, error_type: str) -> None:
        """Mark the span failed (``error.type``)."""

    @abstractmethod
    def end(self) -> None:
        """End the span (it is exported from here on)."""


class TurnSpan(Span):
    """The span of one producer's run of a turn."""

    @abstractmethod
    def carrier(self) -> dict[str, str]:
        """This span's context as W3C trace-context headers (``traceparent``),
        for a later producer of the turn to link to; empty when not traced."""

    @abstractmethod
    def link(self, carrier: Mapping[str, Any]) -> None:
        """Link to the span a ``carrier`` names (an earlier producer's)."""

    @abstractmethod
    def child(self, name: str, attributes: Attributes) -> Span:
        """Start a child span (never made current: it may end in another
        step of an async generator than the one it started in)."""

    @abstractmethod
    def current(self) -> AbstractContextManager[None]:
        """Make this span the current one (for instrumented libraries the
        agent calls) while inside."""


class Tracing(ABC):
    """Where turn spans come from; one per app."""

    enabled: bool = False

    @abstractmethod
    def start_turn(self, name: str, attributes: Attributes) -> TurnSpan:
        """Start a turn's span, child of the current span (the request's) if any."""

    def fastapi_telemetry(self) -> dict[str, Any] | None:
        """``FastAPI(telemetry=...)``: None leaves FastAPI as it is."""
        return None

    def shutdown(self) -> None:  # noqa: B027 - nothing to flush without tracing
        """Export what is left and stop (the app's shutdown)."""


class _NoSpan(TurnSpan):
    def set_attributes(self, attributes: Attributes) -> None:
        pass

    def fail(self, error_type: str) -> None:
        pass

    def end(self) -> None:
        pass

    def carrier(self) -> dict[str, str]:
        return {}

    def link(self, carrier: Mapping[str, Any]) -> None:
        pass

    def child(self, name: str, attributes: Attributes) -> Span:
        return self

    @contextmanager
    def current(self) -> Iterator[None]:
        yield


class _NoTracing(Tracing):
    _span = _NoSpan()

    def start_turn(self, name: str, attributes: Attributes) -> TurnSpan:
        return self._span


NO_TRACING: Tracing = _NoTracing()
