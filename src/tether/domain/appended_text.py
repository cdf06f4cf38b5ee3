"""The text a message grew by, as a delta-mode stream carries it (``stream_mode=delta``).

A bot message is cumulative, and most of its updates only add text at the end.
A delta-mode stream sends such an update as that text alone; its reader puts
the text back with ``append_text``, one rule every reader shares (this module,
the TypeScript client's ``stream.js``):

- ``content`` grows by the text;
- when the message's last content part is a text part, that part grows by it too.

The writer sends a delta only when that rule rebuilds the new message exactly
(``appended_text`` checks by applying it), so any other change (a tool part, a
new paragraph, text rewritten by a takeover) goes out whole and a reader never
holds a message the server did not send.
"""

from __future__ import annotations

from tether.domain.chat_message import ChatMessage, ContentPartType


def append_text(message: ChatMessage, text: str) -> ChatMessage:
    """``message`` grown by ``text``, by the rule above."""
    update: dict[str, object] = {"content": message.content + text}
    parts = message.content_parts
    if parts and parts[-1].type is ContentPartType.TEXT:
        last = parts[-1]
        grown = last.model_copy(update={"text": (last.text or "") + text})
        update["content_parts"] = [*parts[:-1], grown]
    return message.model_copy(update=update)


def appended_text(previous: ChatMessage, new: ChatMessage) -> str | None:
    """The text that turns ``previous`` into ``new`` by ``append_text``; None
    when no text does (``new`` must then be sent whole)."""
    if not new.content.startswith(previous.content):
        return None
    text = new.content[len(previous.content) :]
    return text if append_text(previous, text) == new else None
