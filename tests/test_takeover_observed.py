"""An operator follows one turn across a SIGKILL, in the logs and in the traces.

Two real replicas log JSON and export traces to a real OTLP/HTTP receiver. A
turn runs on A until its model and tool calls have been exported; A is
SIGKILLed; B takes the turn over by itself. The survivor's JSON log has the
takeover's line with the turn's session_id, message_id and epoch, and B's
turn span, at that epoch, links to A's turn span: the span that A's exported
model and tool calls are children of.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.otlp import OTLPReceiver, ReceivedSpan
from tests.support.project import make_project
from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

PROMPT = "What is 6 * 7? Then tell me about rivers and the towns along them."


def _takeover_line(log: Path, message_id: str) -> dict[str, Any] | None:
    for line in log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "taken over from a dead producer" in record["message"] and (
            record.get("message_id") == message_id
        ):
            return record
    return None


async def test_a_takeover_is_in_the_survivors_log_and_its_span_links_to_the_dead_producers(
    tmp_path: Path,
) -> None:
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=200, tool_call_after_chunks=5
    )
    with OTLPReceiver() as receiver:
        env = {
            "TETHER_LOG_FORMAT": "json",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        cluster = Cluster(
            project,
            f"sqlite:///{tmp_path}/tether.db",
            size=2,
            workdir=tmp_path,
            env=env,
            serve_args=("--log-level", "info"),
        )
        async with cluster, TetherAPI.client() as http:
            api = TetherAPI(http, "writer")
            a, b = cluster.replicas
            session = f"s-{uuid.uuid4().hex[:10]}"
            direct = api.start_turn(a.url, a.name, PROMPT, session)
            assert await direct.wait_for(lambda r: r.message_id is not None, 30)
            message_id = direct.message_id
            assert message_id is not None

            # A's tool call (and the model call that asked for it) reached the
            # receiver: they are the dead producer's trace an operator sees.
            tool = receiver.wait_for(lambda s: s.name == "execute_tool calculator", 30)
            dead_turn_span = (tool.trace_id, tool.parent_span_id)
            a_instance = tool.resource["service.instance.id"]
            a.send(signal.SIGKILL)
            await direct.aclose()

            deadline = time.monotonic() + 30
            line = _takeover_line(b.log_path, message_id)
            while line is None:
                assert time.monotonic() < deadline, b.log_tail()
                await asyncio.sleep(0.05)  # polling the survivor's log file, bounded
                line = _takeover_line(b.log_path, message_id)
            assert line["level"] == "INFO"
            assert line["logger"] == "tether.handlers.takeover"
            assert line["session_id"] == session
            assert line["epoch"] >= 2
            assert line["agent"] == "writer"

            def taker(span: ReceivedSpan) -> bool:
                return (
                    span.attributes.get("tether.message_id") == message_id
                    and span.attributes.get("tether.epoch") == line["epoch"]
                )

            # B's turn span ends with the turn: up to the answer's few seconds.
            taken = receiver.wait_for(taker, 45)
            assert taken.resource["service.instance.id"] != a_instance
            assert taken.attributes["tether.session_id"] == session
            assert taken.attributes["tether.resumed"] is True
            assert taken.attributes["tether.outcome"] == "done"
            assert dead_turn_span in taken.links
            # The dead producer's model call is a child of the span linked to.
            assert receiver.find(
                lambda s: (
                    (s.trace_id, s.parent_span_id) == dead_turn_span
                    and s.attributes.get("gen_ai.operation.name") == "chat"
                    and s.resource["service.instance.id"] == a_instance
                )
            )
