"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` in protobuf,
decoded with ``opentelemetry-proto``, every span kept for the test to read.

Replicas export to it exactly as they would to a collector (the SDK's batch
processor and OTLP/HTTP exporter), so a test sees what an operator's tracing
backend would, not what a mock exporter was handed in-process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)
    """(trace id, span id) of each linked span, in hex."""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OTLPReceiver:
    """``with OTLPReceiver() as receiver:`` then ``receiver.endpoint`` for
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``receiver.spans`` holds what arrived."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the test reads the spans, not the requests

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            resource=resource,
                            links=[
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ],
                        )
                    )
        with self._lock:
            self.spans.extend(received)

    def find(self, predicate: Callable[[ReceivedSpan], bool]) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if predicate(span)]

    def wait_for(
        self, predicate: Callable[[ReceivedSpan], bool], within: float = 15.0
    ) -> ReceivedSpan:
        """The first span received for which ``predicate`` holds, polling until
        ``within`` seconds have passed (the exporter sends in batches)."""
        deadline = time.monotonic() + within
        while True:
            found = self.find(predicate)
            if found:
                return found[0]
            if time.monotonic() > deadline:
                names = [span.name for span in self.find(lambda _: True)]
                raise AssertionError(f"no such span within {within} s; received: {names}")
            time.sleep(0.05)

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
