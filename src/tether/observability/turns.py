"""One producer's run of a turn, as an operator sees it: log lines, a span, metrics.

``TurnObservation`` is made with the turn (its span starts then, so its id
is in the turn's checkpoint marker before the agent runs: a taker links to
it even when the producer dies before its first checkpoint). ``running()``
wraps the turn's run: its lines carry the turn's ids, its start and end are
INFO lines, and model and tool calls inside become the span's children
(``tether.observability.genai``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from tether.metrics import TetherMetrics
from tether.observability.logs import TurnFields, turn_log_context
from tether.observability.traces import Attributes, Span, Tracing

__all__ = ["TurnObservation", "current_turn"]

logger = logging.getLogger("tether.turns")

_current: ContextVar[TurnObservation | None] = ContextVar("tether_turn", default=None)


def current_turn() -> TurnObservation | None:
    """The turn whose run this code is part of, if any."""
    return _current.get()


class TurnObservation:
    """A producer's run of one turn: its log context, span and timings."""

    def __init__(
        self,
        fields: TurnFields,
        *,
        tracing: Tracing,
        metrics: TetherMetrics,
        resumed: bool,
        clock: Any = time.monotonic,
    ) -> None:
        self.fields = fields
        self.resumed = resumed
        self._metrics = metrics
        self._clock = clock
        self._started = clock()
        self._first_content_seen = False
        attributes: dict[str, str | int | bool] = {
            "tether.message_id": fields.message_id,
            "tether.resumed": resumed,
        }
        if fields.session_id is not None:
            attributes["tether.session_id"] = fields.session_id
        if fields.epoch is not None:
            attributes["tether.epoch"] = fields.epoch
        if fields.agent is not None:
            attributes["gen_ai.agent.name"] = fields.agent
            attributes["tether.agent"] = fields.agent
        # GenAI semantic conventions: an agent's run is ``invoke_agent {name}``.
        attributes["gen_ai.operation.name"] = "invoke_agent"
        self.span = tracing.start_turn(f"invoke_agent {fields.agent or 'turn'}", attributes)

    @property
    def agent(self) -> str:
        return self.fields.agent or ""

    def trace_carrier(self) -> dict[str, str]:
        """The span's context, for the turn's checkpoint marker (empty untraced)."""
        return self.span.carrier()

    def link_to(self, carrier: Mapping[str, Any] | None) -> None:
        """Link to an earlier producer's span (a takeover, a client's resume)."""
        if carrier:
            self.span.link(carrier)

    @contextmanager
    def running(self) -> Iterator[None]:
        """The run: lines inside carry the turn's ids; the span is current."""
        token = _current.set(self)
        try:
            with turn_log_context(self.fields), self.span.current():
                logger.info(
                    "turn started (agent %s%s)",
                    self.fields.agent,
                    ", resumed" if self.resumed else "",
                    extra={"event": "turn_started", "resumed": self.resumed},
                )
                yield
        finally:
            _current.reset(token)

    def first_content(self) -> None:
        """The run showed its first content (once per run)."""
        if self._first_content_seen:
            return
        self._first_content_seen = True
        self._metrics.first_content(self.agent, self._clock() - self._started)

    def ended(self, outcome: str, code: str | None = None) -> None:
        """The run is over: ``outcome`` is what its readers heard (``done``,
        ``errored``, ``cancelled``, ``dead``: stopped here, ``gone``: taken over)."""
        duration = self._clock() - self._started
        extra: dict[str, Any] = {
            "event": "turn_ended",
            "outcome": outcome,
            "duration_seconds": round(duration, 3),
        }
        if code is not None:
            extra["error_code"] = code
        with turn_log_context(self.fields):
            logger.info(
                "turn ended %s%s after %.3f s (agent %s)",
                outcome,
                f" ({code})" if code else "",
                duration,
                self.fields.agent,
                extra=extra,
            )
        self.span.set_attributes({"tether.outcome": outcome})
        if outcome == "errored":
            self.span.fail(code or "errored")
        self.span.end()

    def child(self, name: str, attributes: Attributes) -> Span:
        return self.span.child(name, attributes)

    def tokens_used(self, input_tokens: int | None, output_tokens: int | None) -> None:
        self._metrics.tokens_used(
            self.agent, input_tokens=input_tokens, output_tokens=output_tokens
        )
