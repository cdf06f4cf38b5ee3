"""OpenTelemetry traces of a real ``tether serve``, received by a real OTLP/HTTP
receiver (``tests/support/otlp.py``): a request continues the caller's trace,
its turn is a span under it, model and tool calls are GenAI child spans. And
without an endpoint, nothing of the SDK is even imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.otlp import OTLPReceiver
from tests.support.project import make_project
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.processes

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
SERVER, INTERNAL, CLIENT = 2, 1, 3  # OTLP's SpanKind numbers


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[ServerProcess, OTLPReceiver]]:
    project = make_project(tmp_path / "project", chunks_per_second=0, answer_chunks=12)
    with OTLPReceiver() as receiver:
        server = ServerProcess(
            project,
            store_url=f"sqlite:///{tmp_path}/tether.db",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "TETHER_TOOL_LOG": str(tmp_path / "tools.log"),
            },
            log_path=tmp_path / "server.log",
        ).start()
        try:
            yield server, receiver
        finally:
            server.stop()


def test_a_turn_is_a_span_under_its_request_with_model_and_tool_calls(
    traced: tuple[ServerProcess, OTLPReceiver],
) -> None:
    server, receiver = traced
    for _ in range(3):
        httpx2.get(f"{server.url}/probes/ready", timeout=5)
    response = httpx2.post(
        f"{server.url}/chat/response?tenant=t",
        headers={
            "requester-uuid": "alice",
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
        },
        json={
            "agent_identifier": "writer",
            "stateful": True,
            "session_id": "s-traced",
            "conversation": [{"sender": "user", "content": "What is 6 * 7, and rivers?"}],
        },
        timeout=30,
    )
    assert response.status_code == 201, response.text
    message_id = response.json()["message_id"]

    # The request's span continues the caller's trace, under the caller's span.
    request = receiver.wait_for(lambda s: s.kind == SERVER and s.name == "POST /chat/response")
    assert request.trace_id == CALLER_TRACE and request.parent_span_id == CALLER_SPAN
    turn = receiver.wait_for(lambda s: s.attributes.get("tether.message_id") == message_id)
    assert turn.name == "invoke_agent writer" and turn.kind == INTERNAL
    assert turn.trace_id == CALLER_TRACE and turn.parent_span_id == request.span_id
    assert turn.attributes["tether.session_id"] == "s-traced"
    assert turn.attributes["tether.epoch"] == 1
    assert turn.attributes["gen_ai.agent.name"] == "writer"
    assert turn.attributes["tether.outcome"] == "done"
    assert turn.resource["service.name"] == "tether"

    children = receiver.find(lambda s: s.parent_span_id == turn.span_id)
    chats = [s for s in children if s.attributes.get("gen_ai.operation.name") == "chat"]
    tools = [s for s in children if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    # The model asks for the calculator, then answers with its result.
    assert len(chats) == 2 and len(tools) == 1, [s.name for s in children]
    assert all(s.attributes["gen_ai.request.model"] == "offline" for s in chats)
    assert all(s.name == "chat offline" and s.kind == CLIENT for s in chats)
    [tool] = tools
    assert tool.name == "execute_tool calculator"
    assert tool.attributes["gen_ai.tool.name"] == "calculator"
    assert tool.attributes["gen_ai.tool.call.id"]
    assert not receiver.find(lambda s: "/probes/" in str(s.attributes.get("url.path", "")))


def test_without_an_endpoint_nothing_of_the_sdk_is_imported(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from tether.cli.server_app import build_app\n"
        "build_app(None)\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('opentelemetry.sdk', 'opentelemetry.exporter', 'tether.observability.otel'))))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    ran = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"
