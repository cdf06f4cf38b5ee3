"""tether's cumulative snapshots as the AI SDK's UI message stream parts.

The converter (``tether.api.ai_sdk_parts``) on its own, then the AI SDK
routes in one process (``tests.support.inprocess``): what can be checked
without Node. The AI SDK's own client against real replicas is
``tests/test_ai_sdk.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.inprocess import build, client_of
from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.api.ai_sdk_parts import UIMessageStreamParts, ui_message
from tether.api.routers.ai_sdk import _ui_stream
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTable,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent
from tether.runtime.turn_stores import TurnStores

ALICE = {"requester-uuid": "alice"}


def bot(*parts: ContentPart, content: str = "") -> ChatMessage:
    return ChatMessage(sender=ChatMessageSender.BOT, content=content, content_parts=list(parts))


def text(value: str) -> ContentPart:
    return ContentPart(type=ContentPartType.TEXT, text=value)


def tool(status: ToolCallStatus = ToolCallStatus.RUNNING, response: Any = None) -> ContentPart:
    return ContentPart(
        type=ContentPartType.TOOL,
        tool=ContentPartTool(
            tool_call_id="call-1",
            name="calculator",
            params={"expression": "6*7"},
            response=response,
            status=status,
        ),
    )


def stream(*messages: ChatMessage, end: str = "done") -> list[dict[str, Any]]:
    parts = UIMessageStreamParts("m1")
    out = parts.start()
    for message in messages:
        out += parts.update(message)
    return out + parts.finish(StreamEnd(end))


def test_text_grows_by_deltas_of_the_new_suffix() -> None:
    assert stream(bot(text("Hel")), bot(text("Hello")), bot(text("Hello, world"))) == [
        {"type": "start", "messageId": "m1"},
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Hel"},
        {"type": "text-delta", "id": "text-0", "delta": "lo"},
        {"type": "text-delta", "id": "text-0", "delta": ", world"},
        {"type": "text-end", "id": "text-0"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_a_tool_call_is_its_input_then_its_output_once_each() -> None:
    parts = stream(
        bot(text("Let me check.")),
        bot(text("Let me check."), tool()),
        bot(text("Let me check."), tool()),  # no change: nothing sent
        bot(text("Let me check."), tool(ToolCallStatus.COMPLETED, "42")),
        bot(text("Let me check."), tool(ToolCallStatus.COMPLETED, "42"), text("It is 42.")),
    )
    assert [p["type"] for p in parts] == [
        "start",
        "text-start",
        "text-delta",
        "tool-input-available",
        "tool-output-available",
        "text-start",
        "text-delta",
        "text-end",
        "text-end",
        "finish",
    ]
    assert parts[3] == {
        "type": "tool-input-available",
        "toolCallId": "call-1",
        "toolName": "calculator",
        "input": {"expression": "6*7"},
    }
    assert parts[4] == {"type": "tool-output-available", "toolCallId": "call-1", "output": "42"}
    assert parts[5] == {"type": "text-start", "id": "text-2"}


def test_a_failed_tool_is_an_output_error() -> None:
    parts = stream(bot(tool(ToolCallStatus.ERROR, "ValueError: no")))
    assert parts[2] == {
        "type": "tool-output-error",
        "toolCallId": "call-1",
        "errorText": "ValueError: no",
    }


def test_a_late_joiner_gets_the_whole_answer_in_one_round() -> None:
    """A reconnect replays from the newest snapshot: everything at once."""
    whole = bot(text("Let me check."), tool(ToolCallStatus.COMPLETED, {"n": 42}), text("42."))
    assert stream(whole)[1:-3] == [
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Let me check."},
        {
            "type": "tool-input-available",
            "toolCallId": "call-1",
            "toolName": "calculator",
            "input": {"expression": "6*7"},
        },
        {"type": "tool-output-available", "toolCallId": "call-1", "output": {"n": 42}},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "42."},
    ]


def test_plain_content_is_one_text_part() -> None:
    parts = stream(bot(content="echo:"), bot(content="echo: hi"))
    assert [p.get("delta") for p in parts if p["type"] == "text-delta"] == ["echo:", " hi"]


def test_an_older_snapshot_sends_nothing() -> None:
    """A resumed producer catching up to what the client has shows nothing twice."""
    parts = UIMessageStreamParts("m1")
    parts.update(bot(text("Hello, world")))
    assert parts.update(bot(text("Hello"))) == []
    assert parts.update(bot(text("Hello, world!"))) == [
        {"type": "text-delta", "id": "text-0", "delta": "!"}
    ]


def test_changed_text_is_closed_and_shown_anew() -> None:
    """A part cannot be retracted: a text that changed under what was sent
    becomes a new part, and nothing is lost."""
    parts = UIMessageStreamParts("m1")
    parts.update(bot(text("Hello, world")))
    assert parts.update(bot(text("Hello, there"))) == [
        {"type": "text-end", "id": "text-0"},
        {"type": "text-start", "id": "text-0-1"},
        {"type": "text-delta", "id": "text-0-1", "delta": "Hello, there"},
    ]
    assert parts.finish(StreamEnd(EndReason.DONE))[0] == {"type": "text-end", "id": "text-0-1"}


def test_tables_and_context_are_data_parts_replaced_in_place() -> None:
    table = ContentPart(type=ContentPartType.TABLE, table=ContentPartTable(headers=["a"]))
    grown = ContentPart(
        type=ContentPartType.TABLE, table=ContentPartTable(headers=["a"], rows=[[1]])
    )
    parts = stream(bot(table), bot(table), bot(grown))
    data = [p for p in parts if p["type"] == "data-table"]
    assert data == [
        {"type": "data-table", "id": "table-0", "data": {"headers": ["a"], "rows": []}},
        {"type": "data-table", "id": "table-0", "data": {"headers": ["a"], "rows": [[1]]}},
    ]


@pytest.mark.parametrize(
    ("end", "last"),
    [
        (StreamEnd(EndReason.DONE), {"type": "finish", "finishReason": "stop"}),
        (StreamEnd(EndReason.CANCELLED), {"type": "abort", "reason": "cancelled"}),
        (
            StreamEnd(EndReason.ERRORED, "INTERNAL", "the agent failed"),
            {"type": "error", "errorText": "INTERNAL: the agent failed"},
        ),
    ],
    ids=["done", "cancelled", "errored"],
)
def test_how_the_answer_ended(end: StreamEnd, last: dict[str, Any]) -> None:
    parts = UIMessageStreamParts("m1")
    parts.update(bot(text("partial")))
    assert parts.finish(end) == [{"type": "text-end", "id": "text-0"}, last]


def test_a_stored_message_as_a_ui_message() -> None:
    message = bot(
        text("Let me check."), tool(ToolCallStatus.COMPLETED, "42"), text("It is 42.")
    ).model_copy(update={"message_id": "m1"})
    assert ui_message(message) == {
        "id": "m1",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "Let me check.", "state": "done"},
            {
                "type": "tool-calculator",
                "toolCallId": "call-1",
                "input": {"expression": "6*7"},
                "state": "output-available",
                "output": "42",
            },
            {"type": "text", "text": "It is 42.", "state": "done"},
        ],
    }
    user = ChatMessage(sender=ChatMessageSender.USER, content="hi", message_id="m1-user")
    assert ui_message(user)["role"] == "user"


# ------------------------------------------------------------ the routes


def stores() -> TurnStores:
    return TurnStores(
        agent_state=InMemoryChatAgentStateStore(),
        recording=InMemoryChatStreamRecordingStore(),
        supervision=InMemoryChatStreamSupervisionStore(),
        conversation=InMemoryChatConversationStore(),
    )


def request(content: str, **extra: Any) -> dict[str, Any]:
    """What ``DefaultChatTransport`` sends, plus a front end's own fields."""
    return {
        "id": "chat1",
        "trigger": "submit-message",
        "messageId": None,
        "messages": [
            {"id": "s", "role": "system", "parts": [{"type": "text", "text": "ignored"}]},
            {"id": "u", "role": "user", "parts": [{"type": "text", "text": content}]},
        ],
        **extra,
    }


def data_lines(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


async def test_a_turn_is_the_ui_message_stream() -> None:
    async with client_of(build(stores())) as client:
        response = await client.post(
            "/ai-sdk/chat?tenant=t",
            headers=ALICE,
            json=request("hi", agent_identifier="echo", a_field_of_the_front_end=1),
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        lines = data_lines(response.text)
        assert lines[-1] == "[DONE]"
        parts = [json.loads(line) for line in lines[:-1]]
        # A reader gets every snapshot or, joining late, the newest at once.
        types = [p["type"] for p in parts]
        assert types[:2] == ["start", "text-start"]
        assert set(types[2:-2]) == {"text-delta"}
        assert types[-2:] == ["text-end", "finish"]
        assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "echo: hi"

        messages = (await client.get("/ai-sdk/chat/chat1/messages?tenant=t", headers=ALICE)).json()
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[1]["id"] == parts[0]["messageId"]
        assert messages[1]["parts"] == [{"type": "text", "text": "echo: hi", "state": "done"}]

        # Nothing runs now: a reconnect is a 204, a stop is a harmless 204.
        reconnect = await client.get("/ai-sdk/chat/chat1/stream?tenant=t", headers=ALICE)
        assert reconnect.status_code == 204
        stop = await client.post("/ai-sdk/chat/chat1/stop?tenant=t", json={}, headers=ALICE)
        assert stop.status_code == 204
        # Another user's conversation is not theirs to read.
        bob = await client.get(
            "/ai-sdk/chat/chat1/messages?tenant=t", headers={"requester-uuid": "bob"}
        )
        assert bob.status_code == 403


async def test_an_agent_that_fails_is_an_error_part_without_its_secrets() -> None:
    async with client_of(build(stores())) as client:
        response = await client.post(
            "/ai-sdk/chat?tenant=t", headers=ALICE, json=request("hi", agent_identifier="broken")
        )
        parts = [json.loads(line) for line in data_lines(response.text)[:-1]]
        assert parts[-1]["type"] == "error"
        assert parts[-1]["errorText"].startswith("INTERNAL: the agent failed")
        assert "hunter2" not in response.text


async def test_refusals_are_statuses_before_the_stream() -> None:
    async with client_of(build(stores())) as client:
        regenerate = await client.post(
            "/ai-sdk/chat?tenant=t",
            headers=ALICE,
            json=request("hi", agent_identifier="echo", trigger="regenerate-message"),
        )
        assert regenerate.status_code == 400
        unknown = await client.post(
            "/ai-sdk/chat?tenant=t", headers=ALICE, json=request("hi", agent_identifier="nobody")
        )
        assert (unknown.status_code, unknown.json()["code"]) == (404, "UNKNOWN_AGENT")
        bad_id = await client.post(
            "/ai-sdk/chat?tenant=t", headers=ALICE, json=request("hi", id="../etc")
        )
        assert bad_id.status_code == 422
        never = await client.get("/ai-sdk/chat/nothing/stream?tenant=t", headers=ALICE)
        assert never.status_code == 204
        assert (await client.get("/ai-sdk/chat/new/messages?tenant=t", headers=ALICE)).json() == []


# ------------------------------------------- following a turn that moves


class MovingTurn:
    """Stands in for the handler: each attach hands out the next source."""

    def __init__(self, *sources: list[Any], takeovers: bool = True, draining: bool = False):
        self.sources = list(sources)
        self.attached: list[int] = []
        self.takeovers = SimpleNamespace(running=takeovers)
        self.draining = draining

    async def attach(self, tenant: str, requester: Any, session: str, turn: str, index: int):
        self.attached.append(index)
        return _source(self.sources.pop(0)), False


async def _source(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def ui_parts(handler: MovingTurn, first: list[Any]) -> list[Any]:
    stream = _ui_stream(handler, "t", "alice", "s", "m1", _source(first))  # type: ignore[arg-type]
    return [event.data async for event in stream]


async def test_a_stream_follows_its_turn_to_the_next_producer() -> None:
    """Fenced here ("gone") or dead with a takeover coming: the same stream
    goes on from the next index, and the client sees one answer."""
    handler = MovingTurn(
        [StreamEvent(7, bot(text("Hello, wor"))), StreamEnd(EndReason.DEAD)],
        [StreamEvent(8, bot(text("Hello, world"))), StreamEnd(EndReason.DONE)],
    )
    first = [StreamEvent(0, bot(text("Hel"))), StreamEnd(EndReason.GONE)]
    data = await ui_parts(handler, first)
    assert handler.attached == [1, 8]
    parts = [json.loads(d) for d in data[:-1]]
    assert "".join(p.get("delta", "") for p in parts) == "Hello, world"
    assert (parts[-1]["type"], data[-1]) == ("finish", "[DONE]")


async def test_a_draining_replica_says_so() -> None:
    handler = MovingTurn(takeovers=False, draining=True)
    data = await ui_parts(handler, [StreamEvent(0, bot(text("Hel"))), StreamEnd(EndReason.DEAD)])
    assert handler.attached == []
    assert json.loads(data[-2])["errorText"].startswith("REPLICA_DRAINING: ")


async def test_a_dead_turn_nobody_takes_over_is_an_error() -> None:
    handler = MovingTurn(takeovers=False)
    data = await ui_parts(handler, [StreamEnd(EndReason.DEAD)])
    assert json.loads(data[-2]) == {
        "type": "error",
        "errorText": "DEAD: the turn's producer stopped and no replica took it over",
    }
