"""The validated edge (issue 26), against real servers on the file store, SQLite and PostgreSQL.

Every string a client sends is valid Unicode without NUL, every body nests at
most ``safe_text.MAX_DEPTH`` deep: anything else is one 422 INVALID_REQUEST
naming the field, the same on every backend, before anything is stored.
``Last-Event-ID`` and list cursors are parsed strictly; identity headers come
once; the AI SDK's stop route takes only JSON. And a conversation an older
version stored with a lone surrogate still reads back, repaired.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tests.support.services import postgres_database
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.stores import from_url

pytestmark = pytest.mark.processes

ALICE = {"requester-uuid": "alice"}
JSON = {**ALICE, "content-type": "application/json"}
LONE = "\\ud800x"
"""A lone surrogate as JSON spells it (the JSON text itself is plain ASCII)."""


@dataclass
class Edge:
    backend: str
    server: ServerProcess
    client: httpx2.Client
    store_url: str
    log: Path


@pytest.fixture(
    scope="module",
    params=["file", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def edge(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Edge]:
    root = tmp_path_factory.mktemp(f"edge-{request.param}")
    with contextlib.ExitStack() as stack:
        if request.param == "file":
            url = f"file://{root / 'store'}"
        elif request.param == "sqlite":
            url = f"sqlite:///{root / 'tether.db'}"
        else:
            url = stack.enter_context(postgres_database())
        project = make_project(root / "project", chunks_per_second=200, answer_chunks=60)
        server = ServerProcess(project, store_url=url, log_path=root / "server.log").start()
        stack.callback(server.stop)
        client = stack.enter_context(httpx2.Client(base_url=server.url, timeout=30))
        yield Edge(request.param, server, client, url, root / "server.log")


def _raw_turn(session_id: str, *, content: str = "hello", **fields: str) -> bytes:
    """A turn body as JSON text, with ``fields`` spliced in as raw JSON."""
    message = f'{{"sender":"user","content":"{content}"'
    for name in ("message_id", "content_parts"):
        if name in fields:
            message += f',"{name}":{fields[name]}'
    body = (
        f'{{"agent_identifier":"plain","stateful":true,"session_id":"{session_id}",'
        f'"conversation":[{message}}}]'
    )
    for name in ("conversation_context", "bot_params"):
        if name in fields:
            body += f',"{name}":{fields[name]}'
    return (body + "}").encode()


def _refused(response: httpx2.Response, field: str) -> None:
    assert response.status_code == 422, (response.status_code, response.text[:300])
    body = response.json()
    assert body["code"] == "INVALID_REQUEST" and body["field"] == field, body
    assert body["message"], body


def _nothing_stored(edge: Edge, tenant: str, session_id: str) -> None:
    """The conversation was never created, and every read of the tenant works."""
    got = edge.client.get(f"/conversations/{session_id}?tenant={tenant}", headers=ALICE)
    assert got.status_code == 404, got.text[:300]
    listed = edge.client.get(f"/conversations?tenant={tenant}", headers=ALICE)
    assert listed.status_code == 200 and listed.json()["items"] == [], listed.text[:300]
    ui = edge.client.get(f"/ai-sdk/chat/{session_id}/messages?tenant={tenant}", headers=ALICE)
    assert ui.status_code == 200 and ui.json() == [], ui.text[:300]


def _turn_then_read_back(edge: Edge, tenant: str, session_id: str) -> None:
    """The conversation the refusal named is free: a turn runs and reads back."""
    turn = edge.client.post(
        f"/chat/response?tenant={tenant}", content=_raw_turn(session_id), headers=JSON
    )
    assert turn.status_code == 201, turn.text[:300]
    got = edge.client.get(f"/conversations/{session_id}?tenant={tenant}", headers=ALICE)
    assert got.status_code == 200
    assert got.json()["messages"][0]["content"] == "hello"


# Item 1 (lone surrogates) and item 3 (NUL) in every place the issue names.
BAD_TEXT = {
    "surrogate-content": ({"content": LONE}, "body.conversation.0.content"),
    "surrogate-part": (
        {"content_parts": f'[{{"type":"text","text":"{LONE}"}}]'},
        "body.conversation.0.content_parts.0.text",
    ),
    "surrogate-message-id": ({"message_id": f'"{LONE}"'}, "body.conversation.0.message_id"),
    "surrogate-context": (
        {"conversation_context": f'{{"custom_context":{{"k":"{LONE}"}}}}'},
        "body.conversation_context.custom_context.k",
    ),
    "surrogate-key": ({"bot_params": f'{{"{LONE}":1}}'}, "body.bot_params"),
    "nul-content": ({"content": "a\\u0000b"}, "body.conversation.0.content"),
    "nul-context": (
        {"conversation_context": '{"document_context":{"d":"\\u0000"}}'},
        "body.conversation_context.document_context.d",
    ),
}


@pytest.mark.parametrize("case", list(BAD_TEXT), ids=list(BAD_TEXT))
def test_text_no_backend_can_keep_is_a_422_before_anything_is_stored(edge: Edge, case: str) -> None:
    fields, field = BAD_TEXT[case]
    tenant, session_id = f"t-{case}", f"s-{case}"
    spliced = {name: value for name, value in fields.items() if name != "content"}
    body = _raw_turn(session_id, content=fields.get("content", "hello"), **spliced)
    for route in ("/chat/response", "/chat/stream"):
        _refused(edge.client.post(f"{route}?tenant={tenant}", content=body, headers=JSON), field)
    _nothing_stored(edge, tenant, session_id)
    _turn_then_read_back(edge, tenant, session_id)


def test_the_ai_sdk_route_refuses_the_same_text(edge: Edge) -> None:
    body = (
        f'{{"id":"ui","messages":[{{"role":"user","parts":[{{"type":"text","text":"{LONE}"}}]}}]}}'
    )
    response = edge.client.post("/ai-sdk/chat?tenant=ai", content=body.encode(), headers=JSON)
    _refused(response, "body.messages.0.parts.0.text")
    _nothing_stored(edge, "ai", "ui")


# Item 2: validation errors are tether's shape, and never echo the input.
def test_a_validation_error_names_the_field_and_echoes_nothing(edge: Edge) -> None:
    huge = "x" * 900_000
    body = {"agent_identifier": "plain", "conversation": [], "stateful": huge}
    response = edge.client.post("/chat/response?tenant=t", json=body, headers=ALICE)
    _refused(response, "body.stateful")
    assert len(response.content) < 1_000  # FastAPI's default echoed all 900 kB back
    shared = edge.client.patch("/conversations/x?tenant=t", json={"shared": 3}, headers=ALICE)
    _refused(shared, "body.shared")
    query = edge.client.get("/conversations?tenant=t&limit=0", headers=ALICE)
    _refused(query, "query.limit")


def test_a_rejected_value_holding_a_lone_surrogate_is_a_json_422(edge: Edge) -> None:
    body = f'{{"agent_identifier":"plain","conversation":[],"stateful":"{LONE}"}}'
    response = edge.client.post("/chat/response?tenant=t", content=body.encode(), headers=JSON)
    _refused(response, "body.stateful")


# Item 4: Last-Event-ID is parsed strictly and bounded like start_index.
@pytest.mark.parametrize(
    "index",
    [b"9" * 5_000, b"\xb2", str(10**30).encode(), b"1000000000", b"-1", b""],
    ids=["5000-digits", "superscript-two", "10^30", "over-the-bound", "negative", "empty"],
)
def test_a_malformed_last_event_id_is_a_422(edge: Edge, index: bytes) -> None:
    response = edge.client.get(
        "/chat/stream/m1?tenant=t&session_id=s",
        headers={**ALICE, "Last-Event-ID": b"m1:" + index},
    )
    _refused(response, "header.Last-Event-ID")


def test_a_last_event_id_of_another_turn_is_ignored(edge: Edge) -> None:
    response = edge.client.get(
        "/chat/stream/m1?tenant=t&session_id=s", headers={**ALICE, "Last-Event-ID": "m0:3"}
    )
    assert response.status_code == 410, response.text[:300]  # start_index 0 of a turn gone


# Item 5: deep JSON is refused at validation, before the conversation is claimed.
@pytest.mark.parametrize("where", ["conversation_context", "bot_params"])
@pytest.mark.parametrize("depth", [40, 900])
def test_deeply_nested_json_is_a_422_and_claims_nothing(edge: Edge, where: str, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    value = (
        f'{{"custom_context":{{"a":{nested}}}}}'
        if where == "conversation_context"
        else (f'{{"a":{nested}}}')
    )
    tenant, session_id = f"deep-{depth}-{where}", "deep"
    response = edge.client.post(
        f"/chat/response?tenant={tenant}",
        content=_raw_turn(session_id, **{where: value}),
        headers=JSON,
    )
    assert response.status_code == 422, response.text[:300]
    assert response.json()["field"].startswith(f"body.{where}."), response.json()
    _nothing_stored(edge, tenant, session_id)
    _turn_then_read_back(edge, tenant, session_id)


# Item 6: a forged list cursor is refused, never a 500.
@pytest.mark.parametrize(
    "position",
    [[10**30, "x"], [-1, "x"], ["9999-12-31T23:59:59+00:00", "x"], [10**30, "a" * 64]],
    ids=["huge", "negative", "far-future", "huge-key"],
)
def test_a_forged_cursor_is_a_400(edge: Edge, position: list[Any]) -> None:
    cursor = base64.urlsafe_b64encode(json.dumps(position).encode()).decode()
    response = edge.client.get(f"/conversations?tenant=t&cursor={cursor}", headers=ALICE)
    assert response.status_code in (200, 400), response.text[:300]
    if response.status_code == 400:
        assert response.json()["code"] == "BAD_REQUEST"


def test_a_cursor_that_is_not_base64url_is_a_422(edge: Edge) -> None:
    response = edge.client.get("/conversations?tenant=t&cursor=a%00b", headers=ALICE)
    _refused(response, "query.cursor")


# Item 8: each identity header comes once.
@pytest.mark.parametrize("name", ["requester-uuid", "user-tenants", "user-roles"])
def test_a_repeated_identity_header_is_a_400(edge: Edge, name: str) -> None:
    headers = [("requester-uuid", "alice"), (name, "t"), (name, "bob")]
    response = edge.client.get("/conversations?tenant=t", headers=headers)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["code"] == "INVALID_IDENTITY"


# Item 9: the AI SDK's stop route takes only JSON.
@pytest.mark.parametrize(
    ("content_type", "content", "status"),
    [
        ("application/x-www-form-urlencoded", b"a=b", 415),
        ("multipart/form-data; boundary=x", b"--x--\r\n", 415),
        ("text/plain", b"{}", 415),
        (None, b"", 415),
        ("application/json", b"[]", 422),
        ("application/json", b"{", 422),
    ],
    ids=["form", "multipart", "text", "none", "array", "broken"],
)
def test_the_stop_route_refuses_anything_but_json(
    edge: Edge, content_type: str | None, content: bytes, status: int
) -> None:
    headers = dict(ALICE) | ({"content-type": content_type} if content_type else {})
    response = edge.client.post("/ai-sdk/chat/s/stop?tenant=t", content=content, headers=headers)
    assert response.status_code == status, response.text[:300]
    assert response.json()["code"] in ("UNSUPPORTED_MEDIA_TYPE", "INVALID_REQUEST")


def test_a_form_post_does_not_stop_a_running_turn_and_json_does(edge: Edge) -> None:
    body = {
        "id": "stopped",
        "messages": [{"role": "user", "parts": [{"type": "text", "text": "go"}]}],
    }
    with edge.client.stream("POST", "/ai-sdk/chat?tenant=stop", json=body, headers=ALICE) as live:
        assert live.status_code == 200
        lines = live.iter_lines()
        next(line for line in lines if '"text-delta"' in line)
        form = edge.client.post(
            "/ai-sdk/chat/stopped/stop?tenant=stop",
            content=b"x=1",
            headers={**ALICE, "content-type": "application/x-www-form-urlencoded"},
        )
        assert form.status_code == 415
        status = edge.client.get(
            "/chat/stream/status?tenant=stop&session_id=stopped", headers=ALICE
        ).json()
        assert status["status"] == "running", status
        stop = edge.client.post("/ai-sdk/chat/stopped/stop?tenant=stop", json={}, headers=ALICE)
        assert stop.status_code == 204
        rest = list(lines)
    assert any('"abort"' in line for line in rest), rest[-5:]


# Item 1, read side: what an older version stored still reads back.
@pytest.mark.parametrize("edge", ["file", "sqlite"], indirect=True)
def test_a_conversation_stored_with_a_lone_surrogate_reads_back_repaired(edge: Edge) -> None:
    """PostgreSQL never stored one; SQLite and the file store did, before the
    edge refused them, and then failed every read of the conversation, of the
    owner's list and of every reader of it when shared."""
    asyncio.run(_store_as_an_older_version(edge.store_url))
    for path in (
        "/conversations/old?tenant=legacy",
        "/conversations?tenant=legacy",
        "/ai-sdk/chat/old/messages?tenant=legacy",
    ):
        response = edge.client.get(path, headers=ALICE)
        assert response.status_code == 200, (path, response.text[:300])
    got = edge.client.get("/conversations/old?tenant=legacy", headers=ALICE).json()
    assert got["messages"][0]["content"] == "bad \ufffd text"
    assert got["conversation"]["title"] == "bad \ufffd text"
    shared = edge.client.patch(
        "/conversations/old?tenant=legacy", json={"shared": True}, headers=ALICE
    )
    assert shared.status_code == 200, shared.text[:300]
    bob = edge.client.get("/conversations/old?tenant=legacy", headers={"requester-uuid": "bob"})
    assert bob.status_code == 200 and bob.json()["messages"][0]["content"] == "bad \ufffd text"
    assert "lone UTF-16 surrogates" in edge.log.read_text(errors="replace")


async def _store_as_an_older_version(url: str) -> None:
    store = from_url(url).chat_conversation_store
    assert store is not None
    opened = getattr(store, "open", None)
    if opened is not None:
        await opened()
    try:
        await store.append_messages(
            "legacy",
            "alice",
            "old",
            "plain",
            # Unvalidated, as an older version built it: validation now repairs it.
            [ChatMessage.model_construct(sender=ChatMessageSender.USER, content="bad \ud800 text")],
        )
    finally:
        closing = getattr(store, "aclose", None)
        if closing is not None:
            await closing()
