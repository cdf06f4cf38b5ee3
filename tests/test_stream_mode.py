"""``stream_mode=delta`` and the ``stream_status`` every stream ends with (issue 25),
against a real server process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest

from tests.support.client import StreamRead, read_stream, turn_body
from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tether.cli._sse_client import iter_sse
from tether.domain.appended_text import append_text
from tether.domain.chat_message import ChatMessage

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("modes")
    project = make_project(root / "project", chunks_per_second=40, answer_chunks=60)
    process = ServerProcess(project, store_url="memory://", log_path=root / "server.log").start()
    yield process
    process.stop()


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        yield http


def rebuilt(read: StreamRead) -> dict[str, ChatMessage]:
    """Each event id of a delta-mode stream and the message it makes."""
    messages: dict[str, ChatMessage] = {}
    held: ChatMessage | None = None
    for event in read.message_events:
        data = json.loads(event.data)
        if "delta" in data:
            assert set(data) == {"index", "delta"}, data
            assert event.id.rpartition(":")[2] == str(data["index"])
            assert held is not None, "a delta before any whole message"
            held = append_text(held, data["delta"])
        else:
            held = ChatMessage.model_validate(data)
        messages[event.id] = held
    return messages


def kinds(read: StreamRead) -> list[str]:
    return ["delta" if "delta" in m else "whole" for m in read.messages]


async def test_a_delta_stream_carries_the_same_messages_as_a_cumulative_one(
    client: httpx2.AsyncClient,
) -> None:
    async with client.stream(
        "POST", "/chat/stream?tenant=t&stream_mode=delta", json=turn_body("Deltas")
    ) as start:
        message_id = start.headers["x-tether-message-id"]
        # A second reader of the same turn, in the seed's shape, from index 0.
        cumulative = await read_stream(client, "GET", f"/chat/stream/{message_id}?tenant=t")
        lean = StreamRead(start.status_code, message_id)
        lean.events = [event async for event in iter_sse(start)]
    assert lean.status_code == 201
    shapes = kinds(lean)
    # Whole first; the calculator's part is no append, so it goes whole too.
    # (At most one event per 0.125 s: about a dozen over this 1.5 s answer.)
    assert shapes[0] == "whole" and shapes.count("delta") >= 5 and shapes[1:].count("whole") >= 1
    mine = rebuilt(lean)
    theirs = {e.id: ChatMessage.model_validate_json(e.data) for e in cumulative.message_events}
    # Every index both readers got is the same message, the last one included.
    common = mine.keys() & theirs.keys()
    assert len(common) >= 5
    assert all(mine[i] == theirs[i] for i in common)
    assert lean.message_events[-1].id == cumulative.message_events[-1].id
    assert (
        lean.terminal("stream_status") == cumulative.terminal("stream_status") == {"reason": "done"}
    )
    assert lean.events[-1].event == "stream_status"
    # What it is for: the same answer in far fewer bytes.
    assert sum(len(e.data) for e in lean.events) * 5 < sum(len(e.data) for e in cumulative.events)


async def test_an_attach_in_delta_mode_starts_whole_after_last_event_id(
    client: httpx2.AsyncClient,
) -> None:
    first = await read_stream(
        client, "POST", "/chat/stream?tenant=t&stream_mode=delta", json=turn_body("Again"), limit=8
    )
    last_seen = first.message_events[-1].id
    # The reader went away after 8 events; it comes back with what it had seen.
    rest = await read_stream(
        client,
        "GET",
        f"/chat/stream/{first.message_id}?tenant=t&stream_mode=delta",
        headers={"Last-Event-ID": last_seen},
    )
    assert rest.status_code == 200
    assert kinds(rest)[0] == "whole"  # it needs nothing from the stream before
    assert int(rest.message_events[0].id.rpartition(":")[2]) > int(last_seen.rpartition(":")[2])
    reference = await read_stream(client, "POST", "/chat/stream?tenant=t", json=turn_body("Again"))
    final = list(rebuilt(rest).values())[-1]
    assert final.content == reference.final_text
    assert rest.terminal("stream_status") == {"reason": "done"}


async def test_a_cancelled_delta_stream_says_so_last(client: httpx2.AsyncClient) -> None:
    async with client.stream(
        "POST", "/chat/stream?tenant=t&stream_mode=delta", json=turn_body("Stop")
    ) as start:
        message_id = start.headers["x-tether-message-id"]
        events = iter_sse(start)
        seen = [await anext(events)]  # the turn is running: cancel it now
        cancelled = await client.delete(f"/chat/stream/{message_id}?tenant=t")
        assert cancelled.status_code == 204
        seen += [event async for event in events]
    assert seen[-1].event == "stream_status"
    assert json.loads(seen[-1].data) == {"reason": "cancelled"}


@pytest.mark.parametrize("value", ["deltas", "", "DELTA", "cumulative,delta"])
async def test_an_unknown_stream_mode_is_a_422_that_starts_nothing(
    client: httpx2.AsyncClient, value: str
) -> None:
    session = f"modes-{len(value)}-{value.encode().hex()}"
    body: dict[str, Any] = turn_body("x", session_id=session, stateful=False)
    posted = await client.post(
        "/chat/stream", params={"tenant": "t", "stream_mode": value}, json=body
    )
    attached = await client.get("/chat/stream/m1", params={"tenant": "t", "stream_mode": value})
    for response in (posted, attached):
        assert response.status_code == 422
        said = response.json()
        assert said["code"] == "INVALID_REQUEST" and said["field"] == "query.stream_mode"
        assert value not in said["message"] or not value
    status = await client.get("/chat/stream/status", params={"tenant": "t", "session_id": session})
    assert status.status_code == 404  # no turn started
