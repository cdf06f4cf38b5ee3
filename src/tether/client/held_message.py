"""What one stream's ``new_message`` events make, and whether the client shows it.

The client asks for ``stream_mode=delta``: the first event of a stream is the
whole message, the next ones (when the message only grew) ``{"index",
"delta"}``, which ``StreamedMessage`` puts back together by the server's rule
(``tether.domain.appended_text``). Each stream starts whole, so nothing is
carried from one connection to the next.

Whatever a stream says, the client never goes backwards on the screen: an
update whose text does not extend what the client already shows of the
message (shorter, or other text) is dropped and counted
(``TurnObserver.dropped``). The server makes that impossible (what a reader
is shown is durable, so a takeover continues from it); this is defence in
depth, should it ever not hold.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tether.domain.appended_text import append_text
from tether.domain.chat_message import ChatMessage

STREAM_MODE = "delta"
"""What the client asks of every stream it reads."""


class StreamedMessage:
    """The message one stream's events make, event by event."""

    def __init__(self) -> None:
        self.message: ChatMessage | None = None

    def apply(self, data: dict[str, Any]) -> ChatMessage | None:
        """The whole message after the event ``data``; None when it makes none
        (a delta with nothing before it on this stream, or not a message)."""
        delta = data.get("delta")
        if isinstance(delta, str) and "sender" not in data:
            if self.message is None:
                return None
            self.message = append_text(self.message, delta)
            return self.message
        try:
            self.message = ChatMessage.model_validate(data)
        except ValidationError:
            return None
        return self.message


def goes_backwards(shown: ChatMessage | None, new: ChatMessage) -> bool:
    """Whether showing ``new`` would take back text from ``shown``."""
    return shown is not None and not new.content.startswith(shown.content)


def taken_back(shown: ChatMessage, new: ChatMessage) -> int:
    """How many characters of ``shown`` showing ``new`` would take back."""
    kept = 0
    for before, after in zip(shown.content, new.content, strict=False):
        if before != after:
            break
        kept += 1
    return len(shown.content) - kept
