"""What a producer tells followers between two recording snapshots: a turn's
newest messages, as small steps.

The recording store keeps one snapshot per turn, flushed at most every 0.5 s;
a follower on another replica that only read snapshots would show text half a
second late. So where the stores have a push channel, the producer also
publishes each new message at once (coalesced over a few milliseconds) as a
``StreamDelta``: consecutive stream indexes, each a *step* from the message
before it. A step is either the text appended to the answer (the common case,
a few characters per token) or the whole message (the first one a follower is
sent, or a change that is more than an append, such as a tool part).

A follower applies a delta only onto the message it holds at the index just
before the step, at the producer's epoch; on any gap it reads the snapshot.
So it never shows text that is not the producer's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tether.domain.chat_message import ChatMessage, ContentPartType

logger = logging.getLogger(__name__)

MAX_DELTA_BYTES = 7000
"""The largest encoded delta a channel carries: PostgreSQL's NOTIFY takes at most
8,000 bytes, with the conversation's key in front. A larger change is left to
the snapshot."""


@dataclass(frozen=True)
class Append:
    """The answer grew by ``text``; its last content part (a text part) grew by
    ``part_text`` when that is not None, and nothing else changed."""

    text: str
    part_text: str | None = None


Step = Append | ChatMessage
"""One message of a delta: how it differs from the one before it, or itself."""


@dataclass(frozen=True)
class StreamDelta:
    """The messages of turn ``message_id`` at ``first_index`` and the indexes
    after it, as the producer at ``epoch`` published them."""

    message_id: str
    epoch: int
    first_index: int
    steps: tuple[Step, ...]

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.steps) - 1

    def encode(self) -> str:
        """Compact JSON for the channel: appends as ``"text"`` or
        ``["text", "part text"]``, whole messages as ``{"w": message}``."""
        steps: list[Any] = []
        for step in self.steps:
            if isinstance(step, ChatMessage):
                steps.append({"w": step.model_dump(mode="json", exclude_none=True)})
            elif step.part_text is None:
                steps.append(step.text)
            else:
                steps.append([step.text, step.part_text])
        document = {"m": self.message_id, "e": self.epoch, "i": self.first_index, "s": steps}
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, text: str) -> StreamDelta | None:
        """The delta ``text`` encodes, or None when it is not one (a replica of
        another release, a damaged message): the follower then reads snapshots."""
        try:
            document = json.loads(text)
            steps: list[Step] = []
            for step in document["s"]:
                if isinstance(step, str):
                    steps.append(Append(step))
                elif isinstance(step, list) and len(step) == 2:
                    steps.append(Append(str(step[0]), str(step[1])))
                else:
                    steps.append(ChatMessage.model_validate(step["w"]))
            return cls(str(document["m"]), int(document["e"]), int(document["i"]), tuple(steps))
        except (ValueError, KeyError, TypeError, ValidationError):
            logger.debug("ignoring a stream delta that does not parse: %.200r", text)
            return None


def step_between(previous: ChatMessage | None, new: ChatMessage) -> Step:
    """The step from ``previous`` to ``new``: an ``Append`` when ``new`` only
    extends the answer's text (and its last text part by the same kind of
    append), else ``new`` itself."""
    if previous is None or not new.content.startswith(previous.content):
        return new
    text = new.content[len(previous.content) :]
    if new.content_parts == previous.content_parts:
        part_text = None
    else:
        part_text = _last_part_growth(previous, new)
        if part_text is None:
            return new
    rest_new = new.model_copy(update={"content": "", "content_parts": None})
    rest_previous = previous.model_copy(update={"content": "", "content_parts": None})
    if rest_new != rest_previous:
        return new
    return Append(text, part_text)


def _last_part_growth(previous: ChatMessage, new: ChatMessage) -> str | None:
    """What the last text part grew by, when that is the parts' only change."""
    old_parts, new_parts = previous.content_parts or [], new.content_parts or []
    if not old_parts or len(old_parts) != len(new_parts) or old_parts[:-1] != new_parts[:-1]:
        return None
    old, grown = old_parts[-1], new_parts[-1]
    if old.type is not ContentPartType.TEXT or grown.type is not ContentPartType.TEXT:
        return None
    old_text, new_text = old.text or "", grown.text or ""
    if not new_text.startswith(old_text):
        return None
    if grown.model_copy(update={"text": old.text}) != old:
        return None
    return new_text[len(old_text) :]


def apply_step(previous: ChatMessage | None, step: Step) -> ChatMessage | None:
    """The message ``step`` makes of ``previous``; None when it cannot be applied
    (an append with nothing, or the wrong thing, to append to)."""
    if isinstance(step, ChatMessage):
        return step
    if previous is None:
        return None
    update: dict[str, Any] = {"content": previous.content + step.text}
    if step.part_text is not None:
        parts = list(previous.content_parts or [])
        if not parts or parts[-1].type is not ContentPartType.TEXT:
            return None
        last = parts[-1]
        parts[-1] = last.model_copy(update={"text": (last.text or "") + step.part_text})
        update["content_parts"] = parts
    return previous.model_copy(update=update)
