"""OpenTelemetry tracing (the ``tether[otel]`` extra), exported over OTLP/HTTP.

Imported only by ``tracing_setup.tracing_from_env`` when an OTLP endpoint is set. Each app
owns its ``TracerProvider`` (two apps in one process do not share one, and an
embedding application's global provider is left alone); FastAPI's own
instrumentation makes each request a server span on it, continuing an
incoming ``traceparent``, and each turn is a span under its request. The
exporter reads the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``..._HEADERS``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_BSP_SCHEDULE_DELAY``, ...).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tether.adapters.mcp.runtime import CALLBACK_PATH
from tether.observability.traces import Attributes, Span, Tracing, TurnSpan

__all__ = ["OTelTracing"]

_PROPAGATOR = TraceContextTextMapPropagator()
_PROBES = "/probes/"


def _tether_version() -> str:
    try:
        return version("tether")
    except PackageNotFoundError:
        return "0"


class _Span(Span):
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set_attributes(self, attributes: Attributes) -> None:
        self._span.set_attributes(dict(attributes))

    def fail(self, error_type: str) -> None:
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(StatusCode.ERROR)

    def end(self) -> None:
        self._span.end()


class _TurnSpan(_Span, TurnSpan):
    def __init__(self, span: trace.Span, tracer: trace.Tracer) -> None:
        super().__init__(span)
        self._tracer = tracer

    def carrier(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def link(self, carrier: Mapping[str, Any]) -> None:
        strings = {k: v for k, v in carrier.items() if isinstance(v, str)}
        linked = trace.get_current_span(_PROPAGATOR.extract(strings)).get_span_context()
        if linked.is_valid:
            self._span.add_link(linked, {"tether.link": "earlier_producer"})

    def child(self, name: str, attributes: Attributes) -> Span:
        parent = trace.set_span_in_context(self._span)
        return _Span(
            self._tracer.start_span(
                name, context=parent, kind=SpanKind.CLIENT, attributes=dict(attributes)
            )
        )

    @contextmanager
    def current(self) -> Iterator[None]:
        with trace.use_span(self._span, end_on_exit=False):
            yield


class _RedactOAuthCallback(SpanProcessor):
    """An MCP OAuth callback's query holds the user's authorization code and
    state: its request span keeps the path and drops the query (as the
    access log redacts them, ``tether.api.routers.mcp``)."""

    def on_start(self, span: SDKSpan, parent_context: Context | None = None) -> None:
        attributes = span.attributes or {}
        if attributes.get("url.path") == CALLBACK_PATH and "url.query" in attributes:
            span.set_attribute("url.query", "[redacted]")


def _is_probe(scope: MutableMapping[str, Any]) -> bool:
    # A load balancer's health checks, several a second per replica: no spans.
    return str(scope.get("path", "")).startswith(_PROBES)


class OTelTracing(Tracing):
    """Turn spans on the app's own provider, exported in batches over OTLP/HTTP."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("tether", _tether_version())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OTelTracing:
        environ = os.environ if environ is None else environ
        own: dict[str, str] = {"service.instance.id": uuid.uuid4().hex}
        named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        if not named:
            own["service.name"] = "tether"
        # Resource.create adds what the OTEL_* variables say to ours.
        provider = TracerProvider(resource=Resource.create(own), shutdown_on_exit=False)
        provider.add_span_processor(_RedactOAuthCallback())
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider)

    def start_turn(self, name: str, attributes: Attributes) -> TurnSpan:
        span = self._tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=dict(attributes))
        return _TurnSpan(span, self._tracer)

    def fastapi_telemetry(self) -> dict[str, Any]:
        # Requests only: tether's metrics are Prometheus's, its logs its own.
        return {
            "tracer_provider": self.provider,
            "metrics": False,
            "logs": False,
            "operation_spans": False,
            "auto_configure": False,
            "exclude": _is_probe,
        }

    def shutdown(self) -> None:
        self.provider.shutdown()
