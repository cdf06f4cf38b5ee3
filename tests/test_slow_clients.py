"""Slow and oversized clients against a real ``tether serve``, over raw sockets.

Each bound is a setting (``TETHER_HEADER_TIMEOUT``, ``TETHER_BODY_TIMEOUT``,
``TETHER_IDLE_TIMEOUT``, ``TETHER_MAX_HEADER_BYTES``), shortened here so a
client that breaks it is cut off within a second or two; without the bounds
each of these connections was held open for as long as the client liked.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.project import make_project
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.processes

LIMIT = 1.0
"""Every timeout of the server under test, in seconds."""
WAIT = 6.0
"""How long a test waits for the server to act: well past LIMIT, far short of forever."""
MAX_HEADER_BYTES = 8_192


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("slow-clients")
    process = ServerProcess(
        make_project(root / "project"),
        store_url=f"sqlite:///{root / 'tether.db'}",
        log_path=root / "server.log",
        env={
            "TETHER_HEADER_TIMEOUT": str(LIMIT),
            "TETHER_BODY_TIMEOUT": str(LIMIT),
            "TETHER_IDLE_TIMEOUT": str(LIMIT),
            "TETHER_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
        },
    ).start()
    yield process
    process.stop()


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket timeout (the
    server held the connection) fails the test."""
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def _status_and_body(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


def test_a_connection_that_never_sends_a_request_is_closed(server: ServerProcess) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        assert _read_all(sock) == b""
        assert time.monotonic() - started < LIMIT + 3


def test_headers_that_trickle_are_answered_408_and_closed(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /probes/alive HTTP/1.1\r\nhost: x\r\n")
        started = time.monotonic()
        received = b""
        # One header byte every 0.2 s: every read resets no timer of the server.
        for _ in range(int(WAIT / 0.2)):
            try:
                sock.sendall(b"x")
            except OSError:
                break  # closed by the server: what the test wants
            time.sleep(0.2)
            sock.setblocking(False)
            try:
                received += sock.recv(65536)
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
            if received:
                break
        sock.settimeout(WAIT)
        received += _read_all(sock)
        assert time.monotonic() - started < LIMIT + 3
        status, body = _status_and_body(received)
        assert status == 408 and body["code"] == "REQUEST_TIMEOUT", received


def test_a_body_that_trickles_is_answered_408_and_closed(server: ServerProcess) -> None:
    body = json.dumps(
        {"agent_identifier": "plain", "conversation": [{"sender": "user", "content": "hi"}]}
    ).encode()
    with _connect(server) as sock:
        sock.sendall(
            b"POST /chat/response?tenant=t HTTP/1.1\r\nhost: x\r\nrequester-uuid: alice\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        started = time.monotonic()
        for byte in body[:-1]:  # a byte at a time, never the last one
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            if time.monotonic() - started > WAIT:
                break
            time.sleep(0.1)
            sock.setblocking(False)
            try:
                peeked = sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                peeked = b""
            finally:
                sock.setblocking(True)
            if peeked:
                break
        received = _read_all(sock)
        assert time.monotonic() - started < LIMIT + 3
        status, answer = _status_and_body(received)
        assert status == 408 and answer["code"] == "REQUEST_TIMEOUT", received


def test_an_idle_kept_alive_connection_is_closed(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /probes/alive HTTP/1.1\r\nhost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status":"alive"}'):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        started = time.monotonic()
        assert _read_all(sock) == b""
        # uvicorn's own default is 5 s: closing sooner shows the setting applies.
        assert time.monotonic() - started < LIMIT + 2


@pytest.mark.parametrize("pieces", [1, 100], ids=["whole", "in-pieces"])
def test_a_head_over_the_limit_is_431(server: ServerProcess, pieces: int) -> None:
    head = b"GET /probes/alive HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n"
    size = -(-len(head) // pieces)
    with _connect(server) as sock:
        try:
            for start in range(0, len(head), size):
                sock.sendall(head[start : start + size])
        except OSError:
            pass  # the server refused and closed before reading it all
        status, body = _status_and_body(_read_all(sock))
        assert status == 431 and body["code"] == "HEADERS_TOO_LARGE", body


def test_a_head_under_the_limit_is_served(server: ServerProcess) -> None:
    head = b"GET /probes/alive HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4_000 + b"\r\n"
    with _connect(server) as sock:
        sock.sendall(head + b"connection: close\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200")


def test_the_log_names_no_traceback(server: ServerProcess) -> None:
    assert server.log_path is not None
    log = Path(server.log_path).read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
