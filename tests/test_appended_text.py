"""The delta-mode encoding of ``new_message``: an append goes out as its text,
anything else whole (issue 25)."""

from __future__ import annotations

import json

from tether.api.stream_mode import MessageEncoder, StreamMode
from tether.domain.appended_text import append_text, appended_text
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
)
from tether.runtime.live_buffer import StreamEvent


def _bot(content: str, *parts: ContentPart) -> ChatMessage:
    return ChatMessage(
        sender=ChatMessageSender.BOT,
        content=content,
        content_parts=list(parts) or None,
        message_id="m",
    )


def _text(text: str) -> ContentPart:
    return ContentPart(type=ContentPartType.TEXT, text=text)


_TOOL = ContentPart(type=ContentPartType.TOOL, tool=ContentPartTool(tool_call_id="c", name="calc"))


def test_an_append_to_content_and_its_last_text_part_is_its_text() -> None:
    before = _bot("Hello", _TOOL, _text("Hello"))
    after = _bot("Hello, world", _TOOL, _text("Hello, world"))
    assert appended_text(before, after) == ", world"
    assert append_text(before, ", world") == after
    plain = _bot("Hi")
    assert appended_text(plain, _bot("Hi there")) == " there"
    assert appended_text(plain, plain) == ""


def test_anything_but_an_append_has_no_text() -> None:
    base = _bot("The answer", _text("The answer"))
    rewound = _bot("The ans", _text("The ans"))
    rewritten = _bot("The other", _text("The other"))
    with_tool = _bot("The answer", _text("The answer"), _TOOL)
    new_paragraph = _bot("The answer\n\nMore", _text("The answer"), _TOOL, _text("More"))
    parts_left_behind = _bot("The answer grows", _text("The answer"))
    other_field = base.model_copy(update={"custom_input": {"a": 1}})
    for after in (rewound, rewritten, with_tool, new_paragraph, parts_left_behind, other_field):
        assert appended_text(base, after) is None, after


def _event(index: int, message: ChatMessage) -> StreamEvent:
    return StreamEvent(index, message)


def test_the_encoder_sends_the_first_message_and_every_non_append_whole() -> None:
    encoder = MessageEncoder("m", StreamMode.DELTA)
    stream = [
        _bot("A"),
        _bot("A long"),
        _bot("A long answer"),
        _bot("A lo"),  # a takeover rewound the text: whole, never a wrong delta
        _bot("A lovely"),
        _bot("A lovely", _TOOL),
        _bot("A lovely day", _TOOL),  # the last part is no text part: content alone grows
    ]
    sent = [encoder.encode(_event(i, m)) for i, m in enumerate(stream)]
    assert [s.id for s in sent] == [f"m:{i}" for i in range(len(stream))]
    said = [json.loads(str(s.data)) for s in sent]
    assert said[1] == {"index": 1, "delta": " long"}
    assert said[2] == {"index": 2, "delta": " answer"}
    assert said[4] == {"index": 4, "delta": "vely"}
    assert said[6] == {"index": 6, "delta": " day"}
    for whole in (0, 3, 5):
        assert ChatMessage.model_validate(said[whole]) == stream[whole]
    # A reader that applies each event to what it holds has each message.
    held: ChatMessage | None = None
    for message, data in zip(stream, said, strict=True):
        held = append_text(held, data["delta"]) if "delta" in data and held else None
        held = held or ChatMessage.model_validate(data)
        assert held == message


def test_a_delta_carries_text_as_is_and_the_cumulative_mode_is_unchanged() -> None:
    encoder = MessageEncoder("m", StreamMode.DELTA)
    encoder.encode(_event(0, _bot("x")))
    tricky = 'x é 😀 \u2028 "q" \n end'
    data = str(encoder.encode(_event(1, _bot(tricky))).data)
    assert json.loads(data) == {"index": 1, "delta": tricky[1:]}
    assert "😀" in data  # UTF-8 on the wire, not six-byte escapes
    cumulative = MessageEncoder("m")
    message = _bot("whole")
    for index in range(2):
        event = cumulative.encode(_event(index, message))
        assert event.data == message.model_dump_json(exclude_none=True)
