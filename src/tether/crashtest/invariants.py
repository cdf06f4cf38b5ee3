"""The invariants of design §5, checked from the outside after each round.

Everything here is a pure function of what the client saw and fetched, so it can be
shown to fail on doctored evidence (tests/test_crash_test.py) as well as pass on real
rounds. The checks:

- ``transcript`` (§5.5): the final transcript equals the crash-free run's, and the
  last answer the client was streamed is the one persisted;
- ``user-message`` (§5.4): the user's message is in it exactly once;
- ``tool-once`` (§5.6): the calculator ran as often as in the crash-free run;
- ``no-regress`` (§5.3): per reader, event indexes strictly increase and, within
  one producer's run, each cumulative message extends the previous one; across
  readers, the client never got an index it had already passed;
- ``fenced`` (§5.7): a stopped-then-continued producer changed nothing;
- ``terminal`` (§5.9): the turn ended done, within the round's bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.crashtest.client import StreamStatus

# Fields that name the turn rather than say what it contains: a crash-free
# reference has its own session and message ids.
_IDENTITY_FIELDS = frozenset({"message_id", "session_id"})


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str


@dataclass(frozen=True)
class SeenEvent:
    index: int | None
    message: dict[str, Any]


@dataclass(frozen=True)
class ReaderTrace:
    """One reader's ``new_message`` events; the client used the first ``consumed``."""

    label: str
    events: tuple[SeenEvent, ...]
    consumed: int


@dataclass(frozen=True)
class Expected:
    """The crash-free run of a prompt."""

    prompt: str
    transcript: tuple[dict[str, Any], ...]
    tool_runs: int


@dataclass(frozen=True)
class Snapshot:
    status: StreamStatus | None
    transcript: tuple[dict[str, Any], ...] | None


@dataclass(frozen=True)
class FenceEvidence:
    """What a stop round saw around continuing the fenced producer."""

    epoch_before_fault: int | None
    left_by_new_owner: Snapshot
    after_continue: Snapshot
    old_readers_ended: bool
    # Read from the store set itself once things settled; ``store_error`` says why
    # they could not be read (and those checks are skipped).
    recorded_final: dict[str, Any] | None = None
    recorded_epoch: int | None = None
    checkpoint_epoch: int | None = None
    store_error: str | None = None


@dataclass
class Observed:
    transcript: list[dict[str, Any]] | None
    final_status: StreamStatus | None
    tool_runs: int
    readers: list[ReaderTrace] = field(default_factory=list)
    final_streamed: dict[str, Any] | None = None
    fence: FenceEvidence | None = None
    unfinished: str | None = None  # why the turn did not reach a verdict in time


def normalize(message: dict[str, Any]) -> dict[str, Any]:
    """A message as content: no identity fields and no unset (None) values."""
    return {
        key: _drop_none(value)
        for key, value in message.items()
        if key not in _IDENTITY_FIELDS and value is not None
    }


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(item) for item in value]
    return value


def normalize_all(messages: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(normalize(message) for message in messages)


def check_round(expected: Expected, observed: Observed, *, producer_break: int) -> list[Violation]:
    """Every violation the round's evidence shows. ``producer_break`` is the index
    jump that marks a new producer (a resumed turn's indexes start
    ``max_turn_events`` past the last recorded one)."""
    violations: list[Violation] = []
    violations += _terminal(observed)
    violations += _transcript(expected, observed)
    violations += _user_message(expected, observed)
    violations += _tool_once(expected, observed)
    violations += _no_regress(observed.readers, producer_break)
    if observed.fence is not None:
        violations += _fenced(observed.fence, expected)
    return violations


def _terminal(observed: Observed) -> list[Violation]:
    if observed.unfinished is not None:
        return [Violation("terminal", observed.unfinished)]
    status = observed.final_status
    if status is None:
        return [Violation("terminal", "the server knows no turn for the conversation")]
    if status.status != "done":
        return [Violation("terminal", f"the turn ended {status.status}, not done")]
    return []


def _transcript(expected: Expected, observed: Observed) -> list[Violation]:
    if observed.transcript is None:
        return [Violation("transcript", "the conversation does not exist")]
    actual = normalize_all(observed.transcript)
    violations = []
    if actual != expected.transcript:
        violations.append(Violation("transcript", _difference(expected.transcript, actual)))
    if observed.final_streamed is not None:
        bots = [m for m in actual if m.get("sender") == "bot"]
        streamed = normalize(observed.final_streamed)
        if not bots or bots[-1] != streamed:
            violations.append(
                Violation(
                    "transcript",
                    "the last answer streamed to the client is not the one persisted "
                    f"({len(str(streamed.get('content', '')))} characters streamed, "
                    f"{len(str(bots[-1].get('content', ''))) if bots else 0} persisted)",
                )
            )
    return violations


def _difference(expected: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]]) -> str:
    if len(expected) != len(actual):
        senders = [m.get("sender") for m in actual]
        return f"{len(actual)} messages {senders}, the crash-free run has {len(expected)}"
    for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if want == got:
            continue
        want_text, got_text = str(want.get("content", "")), str(got.get("content", ""))
        if want_text != got_text:
            common = len(_common_prefix(want_text, got_text))
            return (
                f"message {position} ({got.get('sender')}): content differs at character "
                f"{common} ({len(got_text)} characters, the crash-free run has {len(want_text)})"
            )
        return f"message {position} ({got.get('sender')}): content parts differ"
    return "transcripts differ"


def _common_prefix(a: str, b: str) -> str:
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return a[:position]
    return a[: min(len(a), len(b))]


def _user_message(expected: Expected, observed: Observed) -> list[Violation]:
    if observed.transcript is None:
        return []
    users = [m for m in observed.transcript if m.get("sender") == "user"]
    matching = [m for m in users if m.get("content") == expected.prompt]
    if len(matching) != 1 or len(users) != 1:
        return [
            Violation(
                "user-message",
                f"the user's message is in the transcript {len(matching)} times "
                f"({len(users)} user messages in all; want exactly once)",
            )
        ]
    return []


def _tool_once(expected: Expected, observed: Observed) -> list[Violation]:
    if observed.tool_runs != expected.tool_runs:
        return [
            Violation(
                "tool-once",
                f"the calculator ran {observed.tool_runs} times this round, "
                f"{expected.tool_runs} in the crash-free run",
            )
        ]
    return []


def _no_regress(readers: Sequence[ReaderTrace], producer_break: int) -> list[Violation]:
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


def _fenced(fence: FenceEvidence, expected: Expected) -> list[Violation]:
    violations = []
    left, after = fence.left_by_new_owner, fence.after_continue
    if left.status != after.status:
        violations.append(
            Violation(
                "fenced",
                f"the supervision row changed after the old producer continued: {left.status} "
                f"became {after.status}",
            )
        )
    if left.transcript != after.transcript:
        violations.append(
            Violation("fenced", "the transcript changed after the old producer continued")
        )
    if (
        fence.epoch_before_fault is not None
        and left.status is not None
        and left.status.epoch <= fence.epoch_before_fault
    ):
        violations.append(
            Violation(
                "fenced",
                f"the takeover did not raise the epoch ({left.status.epoch}, "
                f"the stopped producer held {fence.epoch_before_fault})",
            )
        )
    if not fence.old_readers_ended:
        violations.append(
            Violation("fenced", "the fenced producer's readers did not end after it continued")
        )
    if fence.store_error is None:
        violations += _fenced_stores(fence, expected)
    return violations


def _fenced_stores(fence: FenceEvidence, expected: Expected) -> list[Violation]:
    violations = []
    owner = fence.left_by_new_owner.status
    # The producer writes at its lease's epoch; its terminal status took the
    # next one (so no late heartbeat of its own can undo it).
    owner_epoch = None
    if owner is not None:
        owner_epoch = owner.epoch - 1 if owner.status in ("done", "errored") else owner.epoch
    bots = [m for m in expected.transcript if m.get("sender") == "bot"]
    if fence.recorded_final is None:
        violations.append(
            Violation("fenced", "the turn's recording is gone after the old producer ran")
        )
    elif not bots or normalize(fence.recorded_final) != bots[-1]:
        violations.append(
            Violation("fenced", "the recording's last message is not the crash-free answer")
        )
    if fence.recorded_final is not None and fence.recorded_epoch != owner_epoch:
        violations.append(
            Violation(
                "fenced",
                f"the recording was written at epoch {fence.recorded_epoch}; the owner's is "
                f"{owner_epoch}",
            )
        )
    if fence.checkpoint_epoch != owner_epoch:
        violations.append(
            Violation(
                "fenced",
                f"the checkpoint was written at epoch {fence.checkpoint_epoch}; the owner's is "
                f"{owner_epoch}",
            )
        )
    return violations
