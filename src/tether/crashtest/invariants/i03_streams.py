"""Invariants 3 and 12 of design §5, and the stream ids of design §3: what
the readers were streamed.

- ``no-regress`` (§5.3): per reader, event indexes strictly increase and, within
  one producer's run, each cumulative message extends the previous one; across
  readers, the client never got an index it had already passed;
- ``shown-kept`` (§5.12): no screen is ever shown a message's text shrink or
  change what it was shown, across producers too: each reader's text, and the
  client's as it moved from reader to reader, only grows; and the text a
  finished turn kept extends what every reader was shown
  (``rewound_characters`` counts what was taken back);
- ``unique-ids`` (design §3): across every reader of the turn (those of
  fenced producers too), no stream id ``M:index`` came with two different
  messages.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tether.crashtest.invariants.observed import (
    Observed,
    ReaderTrace,
    Violation,
    common_prefix,
    normalize,
    turn_answer,
    verdict_of,
)


def no_regress(readers: Sequence[ReaderTrace], producer_break: int) -> list[Violation]:
    violations = []
    for number, reader in enumerate(readers):
        name = f"reader {number} ({reader.label})"
        for before, after in itertools.pairwise(reader.events):
            if before.index is None or after.index is None:
                violations.append(Violation("no-regress", f"{name}: an event without an index"))
                break
            if after.index <= before.index:
                violations.append(
                    Violation("no-regress", f"{name}: index {after.index} after {before.index}")
                )
                break
            same_producer = after.index - before.index < producer_break
            if same_producer and not _extends(before.message, after.message):
                violations.append(
                    Violation(
                        "no-regress",
                        f"{name}: message {after.index} does not extend message {before.index}",
                    )
                )
                break
    # Across readers: each one the client moved to starts past what it had seen.
    seen = -1
    for number, reader in enumerate(readers):
        for event in reader.events[: reader.consumed]:
            if event.index is None:
                continue
            if event.index <= seen:
                violations.append(
                    Violation(
                        "no-regress",
                        f"reader {number} ({reader.label}) replayed index {event.index}; "
                        f"the client had already seen {seen}",
                    )
                )
                return violations
            seen = event.index
    return violations


def _screens(readers: Sequence[ReaderTrace]) -> list[tuple[str, list[str]]]:
    """The texts each screen was shown, in order: every reader's own, and the
    client's, which read each reader's first ``consumed`` events in turn."""
    screens = [
        (f"reader {number} ({reader.label})", [_text(e.message) for e in reader.events])
        for number, reader in enumerate(readers)
    ]
    client = [_text(e.message) for reader in readers for e in reader.events[: reader.consumed]]
    return [*screens, ("the client", client)]


def _text(message: dict[str, Any]) -> str:
    return str(message.get("content") or "")


def _taken_back(shown: str, now: str) -> int:
    """The characters of ``shown`` that ``now`` no longer shows as they were."""
    return len(shown) - len(common_prefix(shown, now))


def rewound_characters(observed: Observed) -> int:
    """Characters readers were shown and then taken back: on each screen, at
    each text that does not extend the one before it; and of each reader's
    last text, what the answer a finished turn kept does not start with."""
    rewound = 0
    for _, texts in _screens(observed.readers):
        rewound += sum(_taken_back(a, b) for a, b in itertools.pairwise(texts))
    kept = _kept_text(observed)
    if kept is not None:
        rewound += sum(
            _taken_back(_text(reader.events[-1].message), kept)
            for reader in observed.readers
            if reader.events
        )
    return rewound


def _kept_text(observed: Observed) -> str | None:
    """The text a finished (done) turn kept, or None."""
    if verdict_of(observed) != "done":
        return None
    answer = turn_answer(observed)
    return None if answer is None else _text(answer)


def shown_kept(observed: Observed) -> list[Violation]:
    violations = []
    for name, texts in _screens(observed.readers):
        for before, after in itertools.pairwise(texts):
            if not after.startswith(before):
                violations.append(
                    Violation(
                        "shown-kept",
                        f"{name}: a text of {len(before)} characters was followed by one of "
                        f"{len(after)} that takes {_taken_back(before, after)} back",
                    )
                )
                break
    kept = _kept_text(observed)
    if kept is not None:
        for number, reader in enumerate(observed.readers):
            if reader.events and not kept.startswith(_text(reader.events[-1].message)):
                violations.append(
                    Violation(
                        "shown-kept",
                        f"reader {number} ({reader.label}) was shown text the kept answer "
                        f"takes {_taken_back(_text(reader.events[-1].message), kept)} "
                        "characters back from",
                    )
                )
    return violations


def _extends(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether ``after`` is ``before`` with more: longer text, no part lost, no
    completed tool call undone."""
    if not str(after.get("content", "")).startswith(str(before.get("content", ""))):
        return False
    before_parts = before.get("content_parts") or []
    after_parts = after.get("content_parts") or []
    if len(after_parts) < len(before_parts):
        return False
    return _completed_tools(before_parts) <= _completed_tools(after_parts)


def _completed_tools(parts: Sequence[dict[str, Any]]) -> set[str]:
    return {
        str(part["tool"].get("tool_call_id"))
        for part in parts
        if part.get("type") == "tool"
        and isinstance(part.get("tool"), dict)
        and part["tool"].get("status") == "completed"
    }


def unique_ids(readers: Sequence[ReaderTrace]) -> list[Violation]:
    """No stream id seen with two different messages, across every reader."""
    seen: dict[str | int, tuple[dict[str, Any], str]] = {}
    for number, reader in enumerate(readers):
        name = f"reader {number} ({reader.label})"
        for event in reader.events:
            key: str | int | None = event.event_id or event.index
            if key is None:
                continue
            content = normalize(event.message)
            first = seen.setdefault(key, (content, name))
            if first[0] != content:
                return [
                    Violation(
                        "unique-ids",
                        f"id {key} came with two different messages ({first[1]}: "
                        f"{len(str(first[0].get('content', '')))} characters, {name}: "
                        f"{len(str(content.get('content', '')))})",
                    )
                ]
    return []
