"""``content`` wins: an agent that edits ``content`` and leaves stale text parts
in ``content_parts`` shows one answer to every reader.

The rules on their own (``tether.domain.answer_text``), then a turn in one
process whose agent does exactly that: the JSON answer, the SSE stream, the
transcript, the AI SDK's text and ``tether chat``'s screen all say the new text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any, ClassVar

from tests.support.inprocess import InProcessRegistries, client_of
from tests.support.scripted import SETTINGS
from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.api.app import setup_app
from tether.cli.chat import _Progress, _render
from tether.domain.agent_registries import CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.answer_text import with_agreeing_text
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)
from tether.domain.chat_request import ChatRequest
from tether.domain.turn_context import TurnContext
from tether.testing.contracts import ManualClock

ALICE = {"requester-uuid": "alice"}
OLD = "The answer is 41."
NEW = "The answer is 42."


def text(value: str) -> ContentPart:
    return ContentPart(type=ContentPartType.TEXT, text=value)


def tool() -> ContentPart:
    return ContentPart(
        type=ContentPartType.TOOL,
        tool=ContentPartTool(
            tool_call_id="c1",
            name="calculator",
            params={"expression": "6*7"},
            response="42",
            status=ToolCallStatus.COMPLETED,
        ),
    )


def bot(content: str, *parts: ContentPart) -> ChatMessage:
    return ChatMessage(sender=ChatMessageSender.BOT, content=content, content_parts=list(parts))


def test_agreeing_texts_and_plain_content_are_left_alone() -> None:
    plain = bot(NEW)
    assert with_agreeing_text(plain) is plain
    agreeing = bot("Working.\n\nDone.", text("Working."), tool(), text("Done."))
    assert with_agreeing_text(agreeing) is agreeing
    only_a_tool = bot(NEW, tool())
    assert with_agreeing_text(only_a_tool) is only_a_tool


def test_stale_text_parts_give_way_to_content_where_they_stood() -> None:
    stale = bot(NEW, tool(), text("Working."), text(OLD))
    agreed = with_agreeing_text(stale)
    assert agreed.content == NEW
    assert [p.type for p in agreed.content_parts or []] == [
        ContentPartType.TOOL,
        ContentPartType.TEXT,
    ]
    assert (agreed.content_parts or [])[1].text == NEW


def test_empty_content_takes_the_text_parts() -> None:
    agreed = with_agreeing_text(bot("", text("Working."), tool(), text("Done.")))
    assert agreed.content == "Working.\n\nDone."


class EditsContentOnly(StreamableChatAgent):
    """Streams an answer, then corrects ``content`` and forgets its text part."""

    agent_name = "edits-content"

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        yield bot(OLD, tool(), text(OLD))
        yield bot(NEW, tool(), text(OLD))


class Registries(InProcessRegistries):
    OWN: ClassVar[tuple[str, ...]] = (*InProcessRegistries.OWN, EditsContentOnly.agent_name)

    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        if setup.agent_name == EditsContentOnly.agent_name:
            return CreatedAgent(agent=EditsContentOnly(), setup=setup)
        return await super().create_agent(setup, request, turn)


def app() -> Any:
    return setup_app(
        Registries(),
        agent_state_store=InMemoryChatAgentStateStore(),
        chat_stream_recording_store=InMemoryChatStreamRecordingStore(),
        chat_stream_supervision_store=InMemoryChatStreamSupervisionStore(),
        chat_conversation_store=InMemoryChatConversationStore(),
        settings=replace(SETTINGS),
        clock=ManualClock(),
    )


def texts_of(message: dict[str, Any]) -> list[str]:
    return [p["text"] for p in message.get("content_parts") or [] if p["type"] == "text"]


async def test_every_reader_sees_the_edited_content() -> None:
    body = {
        "agent_identifier": EditsContentOnly.agent_name,
        "conversation": [{"sender": "user", "content": "6*7?"}],
    }
    async with client_of(app()) as client:
        answered = await client.post("/chat/response?tenant=t", headers=ALICE, json=body)
        assert answered.status_code == 201, answered.text
        message = answered.json()
        assert message["content"] == NEW and texts_of(message) == [NEW]

        kept_body = body | {"stateful": True, "session_id": "s1"}
        streamed = await client.post("/chat/stream?tenant=t", headers=ALICE, json=kept_body)
        events = [
            json.loads(line.removeprefix("data: "))
            for line in streamed.text.splitlines()
            if line.startswith("data: {") and '"content"' in line
        ]
        last = events[-1]
        assert last["content"] == NEW and texts_of(last) == [NEW]
        # What `tether chat` puts on the screen for it.
        progress = _Progress(started=0.0)
        progress.latest = last
        screen = str(_render(progress).renderables[-1])
        assert NEW in screen and OLD not in screen

        transcript = (await client.get("/conversations/s1?tenant=t", headers=ALICE)).json()
        kept = transcript["messages"][-1]
        assert kept["content"] == NEW and texts_of(kept) == [NEW]

        ai_sdk = await client.post(
            "/ai-sdk/chat?tenant=t",
            headers=ALICE,
            json={
                "id": "chat1",
                "agent_identifier": EditsContentOnly.agent_name,
                "messages": [
                    {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "6*7?"}]}
                ],
                "trigger": "submit-message",
            },
        )
        parts = [
            json.loads(line.removeprefix("data: "))
            for line in ai_sdk.text.splitlines()
            if line.startswith("data: {")
        ]
        shown = [p for p in parts if p["type"] in ("text-start", "text-delta", "text-end")]
        # The old text was streamed first, then the part restarts with the new one.
        last_part = [p for p in shown if p["type"] == "text-start"][-1]["id"]
        final = "".join(p["delta"] for p in shown if p.get("id") == last_part and "delta" in p)
        assert final == NEW
