"""Streamed turns over HTTP against a real uvicorn server process (issue: foundation)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.client import read_stream, turn_body
from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tether.cli._sse_client import SSEEvent, iter_sse

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("http")
    project = make_project(root / "project", chunks_per_second=40, answer_chunks=60)
    process = ServerProcess(project, store_url="memory://", log_path=root / "server.log").start()
    yield process
    process.stop()


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        yield http


def _assert_cumulative(messages: list[dict[str, object]]) -> None:
    for before, after in itertools.pairwise(messages):
        assert str(after["content"]).startswith(str(before["content"]))


async def test_a_streamed_turn_is_cumulative_with_indexed_ids(client: httpx2.AsyncClient) -> None:
    read = await read_stream(client, "POST", "/chat/stream?tenant=t", json=turn_body("Tell me"))
    assert read.status_code == 201
    assert read.message_id
    # Messages, then how the stream ended: every stream says so, POST or GET.
    assert read.message_events and read.events[:-1] == read.message_events
    assert read.events[-1].event == "stream_status"
    assert read.terminal("stream_status") == {"reason": "done"}
    # Ids are the turn's and strictly increasing from 0; a reader that falls
    # behind skips to the newest cumulative message, which loses nothing.
    assert all(e.id.startswith(f"{read.message_id}:") for e in read.message_events)
    assert read.indexes[0] == 0 and read.indexes == sorted(set(read.indexes))
    messages = read.messages
    _assert_cumulative(messages)
    assert all(m["sender"] == "bot" and m["message_id"] == read.message_id for m in messages)
    # The writer asks the calculator near the start: its part runs, then completes.
    statuses = [
        part["tool"]["status"]
        for m in messages
        for part in m.get("content_parts") or []
        if part["type"] == "tool"
    ]
    # (A "running" state of the tool may be skipped by a reader that fell behind:
    # the newest message supersedes it.)
    assert statuses and statuses[-1] == "completed"
    assert len(read.final_text) > 200


async def test_same_prompt_gives_same_answer(client: httpx2.AsyncClient) -> None:
    first, second = await asyncio.gather(
        read_stream(client, "POST", "/chat/stream?tenant=t", json=turn_body("Same")),
        read_stream(client, "POST", "/chat/stream?tenant=t", json=turn_body("Same")),
    )
    assert first.final_text == second.final_text
    assert first.message_id != second.message_id


async def test_three_readers_get_the_same_events(client: httpx2.AsyncClient) -> None:
    async with client.stream("POST", "/chat/stream?tenant=t", json=turn_body("Fan out")) as start:
        message_id = start.headers["x-tether-message-id"]
        url = f"/chat/stream/{message_id}?tenant=t"
        readers = await asyncio.gather(*(read_stream(client, "GET", url) for _ in range(3)))
    assert all(r.status_code == 200 for r in readers)
    # A reader gets the newest message each time it reads (messages are
    # cumulative), so one the scheduler served later may skip some that
    # another got: the same id always carries the same message, ids only
    # grow, and every reader ends on the same last message.
    assert max(len(r.message_events) for r in readers) > 10
    contents: dict[str, str] = {}
    for reader in readers:
        assert reader.indexes == sorted(set(reader.indexes))
        for event in reader.message_events:
            assert contents.setdefault(event.id, event.data) == event.data
        assert reader.terminal("stream_status") == {"reason": "done"}
    assert len({(r.message_events[-1].id, r.message_events[-1].data) for r in readers}) == 1


async def test_a_reader_joining_mid_turn_gets_the_newest_state_then_the_rest(
    client: httpx2.AsyncClient,
) -> None:
    async with client.stream("POST", "/chat/stream?tenant=t", json=turn_body("Join")) as start:
        message_id = start.headers["x-tether-message-id"]
        original_task = asyncio.ensure_future(_collect(iter_sse(start)))
        # Join once the turn is well under way (60 chunks at 40/s take about 1.5 s).
        await asyncio.sleep(0.8)
        assert not original_task.done()
        late = await read_stream(client, "GET", f"/chat/stream/{message_id}?tenant=t")
        original = await original_task
    # One event brings the late reader up to date (the newest cumulative message,
    # not a replay of every one before it), then it sees what the original sees.
    assert late.indexes[0] > 0
    original_messages = [e for e in original if e.event == "new_message"]
    by_id = {e.id: e.data for e in original_messages}
    assert all(by_id.get(e.id) == e.data for e in late.message_events)
    assert late.message_events[-1].data == original_messages[-1].data
    assert len(late.message_events) < len(original_messages)


async def _collect(events: AsyncIterator[SSEEvent]) -> list[SSEEvent]:
    return [event async for event in events]


async def test_start_index_and_last_event_id_resume_where_the_client_was(
    client: httpx2.AsyncClient,
) -> None:
    whole = await read_stream(client, "POST", "/chat/stream?tenant=t", json=turn_body("Resume"))
    message_id = whole.message_id
    final = whole.message_events[-1]
    # The turn is over: only its final message is kept, and a client that has
    # not seen it gets it, whether it says where it was by index or by id.
    by_index = await read_stream(client, "GET", f"/chat/stream/{message_id}?tenant=t&start_index=5")
    assert by_index.message_events == [final]
    by_header = await read_stream(
        client,
        "GET",
        f"/chat/stream/{message_id}?tenant=t",
        headers={"Last-Event-ID": f"{message_id}:5"},
    )
    assert by_header.message_events == [final]
    up_to_date = await read_stream(
        client, "GET", f"/chat/stream/{message_id}?tenant=t", headers={"Last-Event-ID": final.id}
    )
    assert up_to_date.message_events == []
    assert up_to_date.terminal("stream_status") == {"reason": "done"}


async def test_the_producer_finishes_when_every_reader_has_gone(
    client: httpx2.AsyncClient,
) -> None:
    started = time.monotonic()
    first = await read_stream(
        client, "POST", "/chat/stream?tenant=t", json=turn_body("Leave early"), limit=2
    )
    assert first.message_id
    # Nobody reads now. The answer (60 chunks at 40/s) needs about 1.5 s.
    await asyncio.sleep(3.0)
    later = await asyncio.wait_for(
        read_stream(client, "GET", f"/chat/stream/{first.message_id}?tenant=t&start_index=0"),
        timeout=2.0,  # a finished turn answers at once; a stalled one would hang here
    )
    assert time.monotonic() - started < 10
    reference = await read_stream(
        client, "POST", "/chat/stream?tenant=t", json=turn_body("Leave early")
    )
    assert later.final_text == reference.final_text
    # Only the final message is kept after the turn: one event, at the final index.
    assert later.indexes == [reference.indexes[-1]]


async def test_unknown_agent_is_404_before_any_stream(client: httpx2.AsyncClient) -> None:
    response = await client.post("/chat/stream?tenant=t", json=turn_body("x", agent="nobody"))
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["code"] == "UNKNOWN_AGENT"


async def test_invalid_body_is_422_naming_the_field(client: httpx2.AsyncClient) -> None:
    body = {"agent_identifier": "writer", "conversation": [{"sender": "robot", "content": "x"}]}
    response = await client.post("/chat/stream?tenant=t", json=body)
    assert response.status_code == 422
    assert response.json()["code"] == "INVALID_REQUEST"
    assert response.json()["field"] == "body.conversation.0.sender"


async def test_missing_tenant_is_422(client: httpx2.AsyncClient) -> None:
    response = await client.post("/chat/stream", json=turn_body("x"))
    assert response.status_code == 422
    assert response.json()["code"] == "INVALID_REQUEST"
    assert response.json()["field"] == "query.tenant"


async def test_stateful_without_state_store_is_400(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    server = ServerProcess(project, store_url="memory://", extra_args=["--without", "state"])
    server.start()
    try:
        async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
            response = await http.post(
                "/chat/stream?tenant=t", json=turn_body("x", stateful=True, session_id="s")
            )
        assert response.status_code == 400
        assert response.json()["code"] == "AGENTS_STORAGE_NOT_CONFIGURED"
    finally:
        server.stop()


async def test_chat_response_answers_one_json_body(client: httpx2.AsyncClient) -> None:
    response = await client.post("/chat/response?tenant=t", json=turn_body("One body"))
    assert response.status_code == 201
    answer = response.json()
    streamed = await read_stream(
        client, "POST", "/chat/stream?tenant=t", json=turn_body("One body")
    )
    assert answer["content"] == streamed.final_text
    alias = await client.post("/chats/responses?tenant=t", json=turn_body("One body"))
    assert alias.status_code == 201 and alias.json()["content"] == answer["content"]


async def test_an_agent_that_fails_ends_with_an_error_event(
    client: httpx2.AsyncClient, server: ServerProcess
) -> None:
    read = await read_stream(
        client, "POST", "/chat/stream?tenant=t", json=turn_body("x", agent="broken")
    )
    assert read.status_code == 201
    error = read.terminal("error")
    assert error is not None and error["code"] == "INTERNAL"
    # The client gets an id to quote, never the error itself; the log has both.
    assert "broke" not in error["message"] and "RuntimeError" not in error["message"]
    quoted = re.search(r"error id ([0-9a-f]{16})", error["message"])
    assert quoted is not None, error
    assert server.log_path is not None
    logged = server.log_path.read_text()
    assert quoted.group(1) in logged and "the broken agent broke" in logged
    assert read.terminal("stream_status") == {"reason": "errored"}


async def test_cancel_stops_a_local_turn(client: httpx2.AsyncClient) -> None:
    async with client.stream("POST", "/chat/stream?tenant=t", json=turn_body("Stop me")) as start:
        message_id = start.headers["x-tether-message-id"]
        await asyncio.sleep(0.3)
        cancelled = await client.delete(f"/chat/stream/{message_id}?tenant=t")
        assert cancelled.status_code == 204
        events = [line async for line in start.aiter_lines() if line.startswith("data:")]
    assert json.loads(events[-1].removeprefix("data:").strip()) == {"reason": "cancelled"}
    again = await client.delete(f"/chat/stream/{message_id}?tenant=t")
    assert again.status_code == 410


async def test_probes_and_openapi(client: httpx2.AsyncClient) -> None:
    assert (await client.get("/probes/alive")).json() == {"status": "alive"}
    assert (await client.get("/probes/ready")).status_code == 200
    schema = (await client.get("/openapi.json")).json()
    assert "/chat/stream" in schema["paths"] and "/chat/stream/{message_id}" in schema["paths"]
    assert (await client.get("/docs")).status_code == 200
