"""Hostile and broken requests against a real server on the file store.

Each is answered with a clear 4xx before anything is written, and leaves
nothing lost or corrupted: after every one, an existing conversation's
transcript is unchanged, the server still answers turns, and no file has
appeared outside the store's directory (design §5.8: ids cannot escape a
store's namespace).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tether.cli._sse_client import iter_sse

pytestmark = pytest.mark.processes

ALICE = {"requester-uuid": "alice"}
REF = "ref-session"
LONG = "a" * 10_000


@dataclass
class World:
    server: ServerProcess
    client: httpx2.Client
    root: Path
    message_id: str
    transcript: dict[str, Any]
    answer: str
    outside: set[Path] = field(default_factory=set)


def _files_outside_store(root: Path) -> set[Path]:
    found = set()
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            if (root / "store") not in path.parents:
                found.add(path)
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("bad-input")
    project = make_project(root / "project", chunks_per_second=400, answer_chunks=10)
    server = ServerProcess(
        project, store_url=f"file://{root / 'store'}", log_path=root / "server.log"
    ).start()
    client = httpx2.Client(base_url=server.url, timeout=30, headers=ALICE)
    try:
        turn = client.post("/chat/response?tenant=t", json=_turn("The plan", session_id=REF))
        assert turn.status_code == 201, turn.text
        transcript = client.get(f"/conversations/{REF}?tenant=t").json()
        answer = client.post("/chat/response?tenant=t", json=_turn("Still there?")).json()
        yield World(
            server,
            client,
            root,
            turn.headers["x-tether-message-id"],
            transcript,
            answer["content"],
            _files_outside_store(root),
        )
    finally:
        client.close()
        server.stop()


def _turn(content: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_identifier": "plain",
        "conversation": [{"sender": "user", "content": content}],
    }
    if "session_id" in extra:
        body["stateful"] = True
    return {**body, **extra}


@dataclass(frozen=True)
class Hostile:
    id: str
    method: str
    url: str
    statuses: frozenset[int]
    code: str | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _h(
    id: str, method: str, url: str, statuses: int | set[int], code: str | None = None, **kw: Any
) -> Hostile:
    wanted = frozenset({statuses} if isinstance(statuses, int) else statuses)
    return Hostile(id, method, url, wanted, code, **kw)


_JSON = {"content-type": "application/json"}
HOSTILE = [
    # Path traversal and separators, in every place an id travels.
    _h("tenant-traversal", "POST", "/chat/response?tenant=../../x", 422, json=_turn("x")),
    _h("tenant-encoded", "POST", "/chat/response?tenant=..%2F..%2Fx", 422, json=_turn("x")),
    _h("tenant-absolute", "POST", "/chat/response?tenant=/etc/passwd", 422, json=_turn("x")),
    _h("tenant-backslash", "POST", "/chat/response?tenant=..%5C..%5Cx", 422, json=_turn("x")),
    _h("tenant-list", "GET", "/conversations?tenant=..%2F..%2F", 422),
    _h(
        "session-traversal",
        "POST",
        "/chat/response?tenant=t",
        422,
        json=_turn("x", session_id="../../x"),
    ),
    _h(
        "session-absolute",
        "POST",
        "/chat/stream?tenant=t",
        422,
        json=_turn("x", session_id="/tmp/x"),
    ),
    _h("session-path-encoded", "GET", "/conversations/..%2F..%2Fx?tenant=t", 404),
    _h("session-path-absolute", "DELETE", "/conversations/%2Fetc%2Fpasswd?tenant=t", {404, 405}),
    _h("session-path-dots", "GET", "/conversations/%2E%2E?tenant=t", 404),
    _h("session-status", "GET", "/chat/stream/status?tenant=t&session_id=../../x", 422),
    _h("message-path-encoded", "GET", f"/chat/stream/..%2F..%2Fx?tenant=t&session_id={REF}", 404),
    _h(
        "message-cancel-encoded",
        "DELETE",
        f"/chat/stream/..%2F..%2F{REF}?tenant=t&session_id={REF}",
        {404, 405},
    ),
    _h("message-dots", "GET", f"/chat/stream/%2E%2E?tenant=t&session_id={REF}", {404, 410}),
    _h(
        "resume-message-traversal",
        "POST",
        "/chat/stream?tenant=t&resume=true&message_id=../../x",
        {400, 404, 410, 422},
        json={**_turn("x", session_id=REF), "conversation": []},
    ),
    _h(
        "requester-traversal",
        "GET",
        "/conversations?tenant=t",
        400,
        "INVALID_IDENTITY",
        headers={"requester-uuid": "../../x"},
    ),
    # NUL bytes and control characters.
    _h("tenant-nul", "POST", "/chat/response?tenant=t%00", 422, json=_turn("x")),
    _h("session-nul", "POST", "/chat/response?tenant=t", 422, json=_turn("x", session_id="a\0")),
    _h("session-newline", "GET", "/chat/stream/status?tenant=t&session_id=a%0Ab", 422),
    _h("session-path-nul", "GET", "/conversations/ref%00?tenant=t", 422),
    _h("message-path-nul", "DELETE", f"/chat/stream/x%00?tenant=t&session_id={REF}", 422),
    # 10,000 characters.
    _h("tenant-long", "GET", f"/conversations?tenant={LONG}", 422),
    _h("session-long", "POST", "/chat/response?tenant=t", 422, json=_turn("x", session_id=LONG)),
    _h("session-path-long", "GET", f"/conversations/{LONG}?tenant=t", 422),
    _h("message-path-long", "GET", f"/chat/stream/{LONG}?tenant=t&session_id={REF}", 422),
    _h(
        "agent-long",
        "POST",
        "/chat/response?tenant=t",
        422,
        json={**_turn("x"), "agent_identifier": LONG},
    ),
    _h(
        "requester-long",
        "GET",
        "/conversations?tenant=t",
        400,
        "INVALID_IDENTITY",
        headers={"requester-uuid": LONG},
    ),
    # Malformed bodies.
    _h(
        "json-malformed",
        "POST",
        "/chat/response?tenant=t",
        422,
        content=b"{not json",
        headers=_JSON,
    ),
    _h(
        "json-truncated",
        "POST",
        "/chat/stream?tenant=t",
        422,
        content=b'{"agent_identifier": "plain", "conversation": [',
        headers=_JSON,
    ),
    _h("json-array", "POST", "/chat/response?tenant=t", 422, json=[1, 2, 3]),
    _h("json-empty", "POST", "/chat/response?tenant=t", 422, content=b"", headers=_JSON),
    _h(
        "json-not-utf8",
        "POST",
        "/chat/response?tenant=t",
        {400, 422},
        content=b'{"\xff": 1}',
        headers=_JSON,
    ),
    _h(
        "json-deep",
        "POST",
        "/chat/response?tenant=t",
        {400, 422},
        content=b"[" * 100_000 + b"]" * 100_000,
        headers=_JSON,
    ),
    _h(
        "json-wrong-type",
        "POST",
        "/chat/response?tenant=t",
        422,
        json={**_turn("x"), "stateful": "maybe"},
    ),
    _h(
        "json-extra-field",
        "POST",
        "/chat/response?tenant=t",
        422,
        json={**_turn("x"), "admin": True},
    ),
    _h("share-not-bool", "PATCH", f"/conversations/{REF}?tenant=t", 422, json={"shared": "maybe"}),
    # Over the size limit (1 MB by default), declared.
    _h(
        "body-too-large",
        "POST",
        "/chat/response?tenant=t",
        413,
        "BODY_TOO_LARGE",
        content=b" " * 1_100_000,
        headers=_JSON,
    ),
    # Unknown agent.
    _h(
        "agent-unknown",
        "POST",
        "/chat/response?tenant=t",
        404,
        "UNKNOWN_AGENT",
        json=_turn("x", agent_identifier="nobody"),
    ),
    _h(
        "agent-unknown-stream",
        "POST",
        "/chat/stream?tenant=t",
        404,
        "UNKNOWN_AGENT",
        json=_turn("x", agent_identifier="nobody", session_id=REF),
    ),
    # start_index out of range.
    _h(
        "start-index-negative",
        "GET",
        f"/chat/stream/m?tenant=t&session_id={REF}&start_index=-1",
        422,
    ),
    _h(
        "start-index-huge",
        "GET",
        f"/chat/stream/m?tenant=t&session_id={REF}&start_index={10**30}",
        422,
    ),
    _h("start-index-text", "GET", f"/chat/stream/m?tenant=t&session_id={REF}&start_index=ten", 422),
    # Resume that cannot mean anything.
    _h(
        "resume-no-session",
        "POST",
        "/chat/stream?tenant=t&resume=true&message_id=m",
        400,
        "BAD_REQUEST",
        json={"agent_identifier": "plain", "conversation": []},
    ),
    _h(
        "resume-no-message-id",
        "POST",
        "/chat/stream?tenant=t&resume=true",
        400,
        "BAD_REQUEST",
        json={**_turn("x", session_id=REF), "conversation": []},
    ),
    _h(
        "resume-not-stateful",
        "POST",
        "/chat/stream?tenant=t&resume=true&message_id=m",
        400,
        json={"agent_identifier": "plain", "conversation": [], "session_id": REF},
    ),
    # Messages that are not messages.
    _h(
        "sender-unknown",
        "POST",
        "/chat/response?tenant=t",
        422,
        json={"agent_identifier": "plain", "conversation": [{"sender": "system", "content": "x"}]},
    ),
    _h(
        "sender-missing",
        "POST",
        "/chat/response?tenant=t",
        422,
        json={"agent_identifier": "plain", "conversation": [{"content": "x"}]},
    ),
    _h(
        "content-part-unknown",
        "POST",
        "/chat/response?tenant=t",
        422,
        json=_turn("x")
        | {"conversation": [{"sender": "user", "content_parts": [{"type": "exec"}]}]},
    ),
    _h(
        "last-message-from-bot",
        "POST",
        "/chat/stream?tenant=t",
        400,
        json={**_turn("x", session_id=REF), "conversation": [{"sender": "bot", "content": "x"}]},
    ),
    # bot_params trying to reach configuration.
    _h(
        "bot-params-llm",
        "POST",
        "/chat/response?tenant=t",
        400,
        "BOT_PARAMS_REJECTED",
        json={**_turn("x"), "bot_params": {"llm": {"seed": 1, "answer_chunks": 10**9}}},
    ),
    _h(
        "bot-params-configuration",
        "POST",
        "/chat/stream?tenant=t",
        400,
        "BOT_PARAMS_REJECTED",
        json={**_turn("x", session_id=REF), "bot_params": {"agent_configuration": {}}},
    ),
    _h(
        "bot-params-llm-name",
        "POST",
        "/chat/response?tenant=t",
        400,
        "BOT_PARAMS_REJECTED",
        json={**_turn("x"), "bot_params": {"llm_configuration_name": "openai"}},
    ),
    # Listing with nonsense.
    _h("cursor-garbage", "GET", "/conversations?tenant=t&cursor=garbage", 400, "BAD_REQUEST"),
    _h("limit-zero", "GET", "/conversations?tenant=t&limit=0", 422),
    _h("method-not-allowed", "PUT", "/chat/stream?tenant=t", 405),
]


def _assert_intact(world: World) -> None:
    transcript = world.client.get(f"/conversations/{REF}?tenant=t")
    assert transcript.status_code == 200
    assert transcript.json() == world.transcript
    turn = world.client.post("/chat/response?tenant=t", json=_turn("Still there?"))
    assert turn.status_code == 201 and turn.json()["content"] == world.answer
    assert _files_outside_store(world.root) == world.outside | {world.root / "server.log"}


@pytest.mark.parametrize("hostile", HOSTILE, ids=[h.id for h in HOSTILE])
def test_hostile_request_is_a_clear_4xx_and_changes_nothing(world: World, hostile: Hostile) -> None:
    headers = {**ALICE, **hostile.headers}
    response = world.client.request(
        hostile.method,
        hostile.url,
        json=hostile.json,
        content=hostile.content,
        headers=headers,
    )
    assert response.status_code in hostile.statuses, (response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    if response.status_code == 422:
        assert body["detail"], body  # FastAPI's validation error names the field
    else:
        assert body["code"] and body["message"], body
    if hostile.code is not None:
        assert body["code"] == hostile.code, body
    _assert_intact(world)


def test_a_chunked_body_over_the_limit_is_413_too(world: World) -> None:
    """Without Content-Length the limit can only be found by counting."""

    def chunks() -> Iterator[bytes]:
        yield b'{"agent_identifier": "plain", "conversation": [], "bot_params": {"x": "'
        for _ in range(120):
            yield b"y" * 10_000

    response = world.client.post("/chat/response?tenant=t", content=chunks(), headers=_JSON)
    assert response.status_code == 413
    assert response.json()["code"] == "BODY_TOO_LARGE"
    _assert_intact(world)


def test_a_chunked_body_under_the_limit_is_served(world: World) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"agent_identifier": "plain", '
        yield b'"conversation": [{"sender": "user", "content": "Still there?"}]}'

    response = world.client.post("/chat/response?tenant=t", content=chunks(), headers=_JSON)
    assert response.status_code == 201 and response.json()["content"] == world.answer


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        (f"start_index={10**9}", {}),
        # The largest index Last-Event-ID may name (bounded like start_index;
        # past it is a 422, in test_validated_edge).
        ("", {"Last-Event-ID": "{message_id}:" + "9" * 9}),
        ("", {"Last-Event-ID": "garbage:::"}),
    ],
    ids=["start-index-max", "last-event-id-huge", "last-event-id-garbage"],
)
async def test_attaching_far_past_the_end_returns_at_once(
    world: World, query: str, headers: dict[str, str]
) -> None:
    url = f"/chat/stream/{world.message_id}?tenant=t&session_id={REF}&{query}"
    headers = {k: v.format(message_id=world.message_id) for k, v in headers.items()}
    # A short timeout: waiting for an index that never comes would hang here.
    async with httpx2.AsyncClient(base_url=world.server.url, timeout=5, headers=ALICE) as client:
        async with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200
            events = [event async for event in iter_sse(response)]
    if "garbage" in headers.get("Last-Event-ID", ""):
        # Not one of this turn's ids: ignored, so the whole turn replays.
        assert [e for e in events if e.event == "new_message"]
    else:
        assert all(event.event != "new_message" for event in events)
    _assert_intact(world)
