"""Which of a message's two texts is the answer: ``content`` wins.

A bot message carries its text twice: ``content`` (what the seed's SDK and a
plain ``curl`` read) and the text parts of ``content_parts`` (what renders
beside tool calls and tables: ``tether chat``, the chat page, the AI SDK's
text parts). The model/tool loop keeps them equal (``content`` is its text
parts joined by ``TEXT_PART_SEPARATOR``), but an agent that edits ``content``
and leaves ``content_parts`` as they were would show one answer to some
readers and another to the rest. So a turn publishes every message with its
texts made to agree, by these rules:

- no text part: unchanged (``content`` is the text; nothing contradicts it);
- text parts that say what ``content`` says: unchanged;
- ``content`` empty: it is taken from the text parts;
- otherwise the text parts are stale: they are replaced by one text part
  holding ``content``, where the first of them was; every other part stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether.domain.chat_message import ChatMessage, ContentPart, ContentPartType

TEXT_PART_SEPARATOR = "\n\n"
"""Text the model writes in different responses of one turn (before and after a
tool call) are separate text parts; ``content`` joins them as paragraphs."""


def text_of_parts(parts: Sequence[ContentPart]) -> str:
    """The text parts' text, joined as ``content`` holds it."""
    return TEXT_PART_SEPARATOR.join(
        part.text for part in parts if part.type is ContentPartType.TEXT and part.text
    )


def with_agreeing_text(message: ChatMessage) -> ChatMessage:
    """``message`` with ``content`` and its text parts saying the same (module
    docstring); the same object when they already do."""
    parts = message.content_parts or []
    texts = [i for i, part in enumerate(parts) if part.type is ContentPartType.TEXT]
    if not texts:
        return message
    said = text_of_parts(parts)
    if said == message.content:
        return message
    if not message.content:
        return message.model_copy(update={"content": said})
    first = texts[0]
    agreeing = [
        ContentPart(type=ContentPartType.TEXT, text=message.content) if i == first else part
        for i, part in enumerate(parts)
        if i == first or part.type is not ContentPartType.TEXT
    ]
    return message.model_copy(update={"content_parts": agreeing})
