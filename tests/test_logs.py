"""tether's own log lines, from a real ``tether serve``: JSON or text, each with
the request's id and the turn's ids; probes kept out at INFO."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tether.observability.logs import ProbeAccessFilter
from tether.observability.request_ids import is_acceptable_request_id

pytestmark = pytest.mark.processes

ALICE = {"requester-uuid": "alice"}


def _turn(session: str) -> dict[str, Any]:
    return {
        "agent_identifier": "plain",
        "stateful": True,
        "session_id": session,
        "conversation": [{"sender": "user", "content": "Tell me about rivers."}],
    }


@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("json-logs")
    project = make_project(root / "project", chunks_per_second=0, answer_chunks=10)
    server = ServerProcess(
        project,
        store_url=f"sqlite:///{root}/tether.db",
        env={"TETHER_LOG_FORMAT": "json"},
        log_path=root / "server.log",
        extra_args=["--log-level", "info"],
    ).start()
    try:
        yield server
    finally:
        server.stop()


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every JSON object of a log file (the test harness writes a few plain lines)."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def wait_for_lines(path: Path, wanted: Any, within: float = 10.0) -> list[dict[str, Any]]:
    """Poll a log file (bounded) until ``wanted(lines)`` holds; the lines."""
    deadline = time.monotonic() + within
    while True:
        lines = json_lines(path)
        if wanted(lines):
            return lines
        assert time.monotonic() < deadline, f"not logged within {within} s: {lines[-10:]}"
        time.sleep(0.05)


def test_a_turn_logs_json_lines_with_the_request_and_turn_ids(json_server: ServerProcess) -> None:
    assert json_server.log_path is not None
    session = f"s-{uuid.uuid4().hex[:8]}"
    response = httpx2.post(
        f"{json_server.url}/chat/response?tenant=t",
        headers={**ALICE, "x-request-id": "gateway-42"},
        json=_turn(session),
        timeout=30,
    )
    assert response.status_code == 201, response.text
    assert response.headers["x-request-id"] == "gateway-42"
    message_id = response.json()["message_id"]

    def ended(lines: list[dict[str, Any]]) -> bool:
        return any(line.get("event") == "turn_ended" for line in lines) and any(
            line["logger"] == "uvicorn.access" and line.get("request_id") == "gateway-42"
            for line in lines
        )

    lines = wait_for_lines(json_server.log_path, ended)
    for line in lines:
        assert {"level", "logger", "message", "time"} <= line.keys(), line
    turn_lines = [line for line in lines if line.get("message_id") == message_id]
    [started] = [line for line in turn_lines if line.get("event") == "turn_started"]
    [end] = [line for line in turn_lines if line.get("event") == "turn_ended"]
    for line in (started, end):
        assert line["level"] == "INFO"
        assert line["session_id"] == session
        assert line["epoch"] == 1
        assert line["agent"] == "plain"
        assert line["request_id"] == "gateway-42"
    assert end["outcome"] == "done" and end["duration_seconds"] >= 0
    [access] = [line for line in lines if line.get("request_id") == "gateway-42" and "path" in line]
    assert access["method"] == "POST" and access["status"] == 201
    assert access["path"].startswith("/chat/response")


def test_a_request_without_an_id_gets_one_and_probes_are_not_logged(
    json_server: ServerProcess,
) -> None:
    assert json_server.log_path is not None
    for _ in range(5):
        assert httpx2.get(f"{json_server.url}/probes/ready", timeout=5).status_code == 200
    response = httpx2.get(f"{json_server.url}/conversations?tenant=t", headers=ALICE, timeout=5)
    generated = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    # A forged id (a newline would forge a text log line) is replaced, not echoed.
    forged = httpx2.get(
        f"{json_server.url}/conversations?tenant=t",
        headers={**ALICE, "x-request-id": "a b"},
        timeout=5,
    )
    assert forged.headers["x-request-id"] != "a b"

    lines = wait_for_lines(
        json_server.log_path, lambda ls: any(x.get("request_id") == generated for x in ls)
    )
    assert not [line for line in lines if "/probes/" in str(line.get("path", ""))]


def test_the_default_text_format_is_readable_and_carries_the_ids(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project", chunks_per_second=0, answer_chunks=5)
    log = tmp_path / "server.log"
    server = ServerProcess(
        project,
        store_url=f"sqlite:///{tmp_path}/tether.db",
        log_path=log,
        extra_args=["--log-level", "info"],
    ).start()
    try:
        response = httpx2.post(
            f"{server.url}/chat/response?tenant=t",
            headers={**ALICE, "x-request-id": "text-7"},
            json=_turn("s-text"),
            timeout=30,
        )
        assert response.status_code == 201
        message_id = response.json()["message_id"]
        deadline = time.monotonic() + 10
        while "turn ended" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        server.stop()
    [ended] = [line for line in log.read_text().splitlines() if "turn ended" in line]
    assert " INFO " in ended and "tether.turns: turn ended done" in ended
    assert f"[request_id=text-7 session_id=s-text message_id={message_id} epoch=1" in ended
    assert not log.read_text().lstrip().startswith("{")


def test_probe_lines_come_back_at_debug() -> None:
    access = logging.getLogger("test.access.probes")
    record = access.makeRecord(
        access.name, logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", "/probes/ready", "1.1", 200), None,
    )  # fmt: skip
    access.setLevel(logging.INFO)
    assert not ProbeAccessFilter().filter(record)
    access.setLevel(logging.DEBUG)
    assert ProbeAccessFilter().filter(record) and record.levelname == "DEBUG"


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("0f9ed06f458746cc994a72181d133bc4", True),
        ("7F000001:C3A2_0A00:1F90_65F1A2B3_0001:1234", True),
        ("a\nforged line", False),
        ("x" * 129, False),
        ("", False),
    ],
)
def test_which_request_ids_are_taken_as_they_are(value: str, kept: bool) -> None:
    assert is_acceptable_request_id(value) is kept
