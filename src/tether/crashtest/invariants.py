"""The invariants of design §5, checked from the outside after each round.

Everything here is a pure function of what the client saw and fetched, so it can be
shown to fail on doctored evidence (tests/test_crash_test.py) as well as pass on real
rounds. The checks:

- ``transcript`` (§5.5): the final transcript equals the crash-free run's, and the
  last answer the client was streamed is the one persisted;
- ``user-message`` (§5.4): the user's message is in it exactly once;
- ``tool-once`` (§5.6): the calculator ran as often as in the crash-free run
  (once more at most where the fault came before any reader got its result:
  see ``Observed.tool_outcome_unknown``); for turns whose tools record their
  runs in the tool-call ledger, all of their tools, once more at most where a
  ``retry`` call was cut off;
- ``no-regress`` (§5.3): per reader, event indexes strictly increase and, within
  one producer's run, each cumulative message extends the previous one; across
  readers, the client never got an index it had already passed;
- ``shown-kept`` (§5.12): no screen is ever shown a message's text shrink or
  change what it was shown, across producers too: each reader's text, and the
  client's as it moved from reader to reader, only grows; and the text a
  finished turn kept extends what every reader was shown
  (``rewound_characters`` counts what was taken back);
- ``fenced`` (§5.7): a stopped-then-continued producer changed nothing;
- ``terminal`` (§5.9): the turn ended done (or, where the round cancelled it,
  cancelled), within the round's bound;
- ``one-answer`` (§5.4, §5.10): the transcript has exactly one bot message per
  turn, and one carrying the turn's own message id;
- ``own-checkpoint`` (§5.10): the checkpoint left in the store is the turn's
  own (its ``__turn__`` marker names the turn's message id, and the input it
  carries ends with the user's question), so a resume loaded its own turn's
  state and answered its own question;
- ``unique-ids`` (design §3): across every reader of the turn (those of
  fenced producers too), no stream id ``M:index`` came with two different
  messages;
- ``verdict`` (cancel rounds): the transcript's last-turn status, the
  supervision row, the cancel's answer and the client's stream agree on one
  verdict, cancelled or complete;
- ``at-most-once`` (issue 14, turns whose tools record their runs in the
  tool-call ledger): a call of a tool whose ``on_unknown`` is not ``retry``
  ran at most once per idempotency key; every call ran as attempts 1, 2, ...
  (each run was recorded as started first); a call that ran to its end and
  was followed by another call of the turn (so its result was checkpointed)
  never ran again; a call cut off by the fault (started, never ended) is
  shown with the "may or may not have happened" result when its tool may not
  run twice, and ran again to completion when its tool says ``retry``; a call
  shown completed ran to its end.

Where a call of a tool that may not run twice was cut off, ``transcript``
compares less, because the model read another result than in the crash-free
run (see ``_answer_difference``): every message but the turn's answer, and in
the answer every part up to the end of the tool request holding that call,
must equal the crash-free run's, except that call's result; what the model
wrote after reading it must be there but is its own.

Without a conversation store the transcript checks are made on the turn's
recording instead (its last message is the answer).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.crashtest.client import StreamStatus
from tether.testing.tool_ledger import ToolRun

UNKNOWN_OUTCOME = "may or may not have happened"
"""What the result of a call whose outcome is unknown says (``tether.tools``)."""

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
    event_id: str = ""
    """The SSE id as received, ``<message_id>:<index>`` (empty: key by index)."""


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
class StoredTurn:
    """The turn as the store set holds it after the round."""

    recorded_final: dict[str, Any] | None = None
    recorded_epoch: int | None = None
    recorded_message_id: str | None = None
    checkpoint_epoch: int | None = None
    checkpoint_message_id: str | None = None
    """The message id in the checkpoint's ``__turn__`` marker."""
    checkpoint_input: tuple[dict[str, Any], ...] | None = None
    """The turn's input the marker carries (what a resume answers)."""


@dataclass(frozen=True)
class CancelEvidence:
    """What a cancel-at-end round saw of its cancel."""

    response_status: int | None
    """The HTTP status of ``DELETE /chat/stream/{id}`` (None: no answer)."""
    reader_verdict: str | None
    """How the client's stream ended: ``done`` (a clean end), ``cancelled``, or other."""


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


@dataclass(frozen=True)
class ToolCalls:
    """A turn's tool calls as the tool-call ledger has them."""

    runs: tuple[ToolRun, ...]
    """Every execution of the turn's calls, in the order they started."""

    def by_call(self) -> dict[int, list[ToolRun]]:
        """The runs of each call (by its index in the turn), in order."""
        calls: dict[int, list[ToolRun]] = {}
        for run in self.runs:
            calls.setdefault(run.index, []).append(run)
        return dict(sorted(calls.items()))

    def cut_off(self) -> dict[int, ToolRun]:
        """The calls whose last run was cut off (started, never ended), by index."""
        return {index: runs[-1] for index, runs in self.by_call().items() if not runs[-1].ended}

    def unknown(self) -> frozenset[int]:
        """The calls the resume may not run again and must show as of unknown outcome."""
        return frozenset(i for i, run in self.cut_off().items() if run.at_most_once)

    def retried(self) -> frozenset[int]:
        """The ``retry`` calls a run of which was cut off (and that must run again)."""
        return frozenset(
            index
            for index, runs in self.by_call().items()
            if not runs[0].at_most_once and any(not run.ended for run in runs)
        )


@dataclass
class Observed:
    transcript: list[dict[str, Any]] | None
    final_status: StreamStatus | None
    tool_runs: int
    readers: list[ReaderTrace] = field(default_factory=list)
    final_streamed: dict[str, Any] | None = None
    fence: FenceEvidence | None = None
    unfinished: str | None = None  # why the turn did not reach a verdict in time
    message_id: str | None = None
    stored: StoredTurn | None = None
    """The recording and checkpoint as stored after the round (None: unreadable)."""
    last_turn_status: str | None = None
    """The conversation's last-turn status (complete, cancelled, ...)."""
    cancel: CancelEvidence | None = None
    """Set in a round that cancelled the turn: cancelled is a verdict it may end with."""
    conversation_store: bool = True
    """False: the servers keep no transcript; the recording is checked instead."""
    tool_outcome_unknown: bool = False
    """True where no reader got the tool's result before the fault: the fault may
    have fallen between the call and the checkpoint recording its result, and the
    resume then runs it once more (at-least-once until tool calls record
    *started* and *completed*, issue 14). One extra run is allowed, never two;
    once a result was shown, none."""
    tool_calls: ToolCalls | None = None
    """The turn's tool runs from the tool-call ledger (None: its tools record none)."""


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
    if observed.conversation_store:
        violations += _transcript(expected, observed)
        violations += _user_message(expected, observed)
        violations += _one_answer(observed)
    else:
        violations += _recorded_answer(expected, observed)
    violations += _tool_once(expected, observed)
    violations += _no_regress(observed.readers, producer_break)
    violations += _shown_kept(observed)
    violations += _unique_ids(observed.readers)
    violations += _own_checkpoint(expected, observed)
    if observed.cancel is not None:
        violations += _verdict(observed)
    if observed.fence is not None:
        violations += _fenced(observed.fence, expected)
    if observed.tool_calls is not None:
        violations += _at_most_once(observed, observed.tool_calls)
    return violations


def _verdict_of(observed: Observed) -> str | None:
    return observed.final_status.status if observed.final_status is not None else None


def _cancelled(observed: Observed) -> bool:
    return observed.cancel is not None and _verdict_of(observed) == "cancelled"


def _terminal(observed: Observed) -> list[Violation]:
    if observed.unfinished is not None:
        return [Violation("terminal", observed.unfinished)]
    status = observed.final_status
    if status is None:
        return [Violation("terminal", "the server knows no turn for the conversation")]
    allowed = ("done", "cancelled") if observed.cancel is not None else ("done",)
    if status.status not in allowed:
        return [
            Violation("terminal", f"the turn ended {status.status}, not {' or '.join(allowed)}")
        ]
    return []


def _transcript(expected: Expected, observed: Observed) -> list[Violation]:
    if observed.transcript is None:
        return [Violation("transcript", "the conversation does not exist")]
    actual = normalize_all(observed.transcript)
    if _cancelled(observed):
        return _partial_answer(expected, actual)
    violations = []
    unknown = _unknown(observed)
    if unknown:
        problem = _masked_difference(expected.transcript, actual, unknown)
        if problem is not None:
            violations.append(Violation("transcript", problem))
    elif actual != expected.transcript:
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


def _partial_answer(expected: Expected, actual: Sequence[dict[str, Any]]) -> list[Violation]:
    """A cancelled turn keeps a partial answer: everything but the answer as in
    the crash-free run, and the answer a beginning of the crash-free one."""
    others = [m for m in actual if m.get("sender") != "bot"]
    expected_others = [m for m in expected.transcript if m.get("sender") != "bot"]
    violations = []
    if others != expected_others:
        violations.append(
            Violation(
                "transcript", "besides the answer, the transcript differs from the crash-free run"
            )
        )
    bots = [m for m in actual if m.get("sender") == "bot"]
    whole = _answer(expected)
    if bots and not whole.startswith(str(bots[-1].get("content", ""))):
        kept = str(bots[-1].get("content", ""))
        violations.append(
            Violation(
                "transcript",
                f"the cancelled turn kept an answer that is not a beginning of the crash-free "
                f"one (differs at character {len(_common_prefix(whole, kept))} of {len(kept)})",
            )
        )
    return violations


def _answer(expected: Expected) -> str:
    bots = [m for m in expected.transcript if m.get("sender") == "bot"]
    return str(bots[-1].get("content", "")) if bots else ""


def _recorded_answer(expected: Expected, observed: Observed) -> list[Violation]:
    """Without a conversation store, the answer is the recording's last message."""
    bots = [m for m in expected.transcript if m.get("sender") == "bot"]
    want = bots[-1] if bots else None
    violations = []
    unknown = _unknown(observed)
    streamed = observed.final_streamed
    if streamed is not None and unknown and want is not None:
        problem = _answer_difference(want, normalize(streamed), unknown)
        if problem is not None:
            violations.append(Violation("transcript", f"the last answer streamed: {problem}"))
    elif streamed is not None and normalize(streamed) != want:
        violations.append(
            Violation(
                "transcript", "the last answer streamed to the client is not the crash-free one"
            )
        )
    stored = observed.stored
    if stored is None:
        return violations
    if stored.recorded_final is None or stored.recorded_message_id != observed.message_id:
        violations.append(Violation("transcript", "the turn's recording is gone"))
        return violations
    kept = normalize(stored.recorded_final)
    if _cancelled(observed):
        if not _answer(expected).startswith(str(kept.get("content", ""))):
            violations.append(
                Violation(
                    "transcript", "the cancelled turn's recording is not a beginning of the answer"
                )
            )
    elif unknown and want is not None:
        problem = _answer_difference(want, kept, unknown)
        if problem is not None:
            violations.append(Violation("transcript", f"the recording's last message: {problem}"))
    elif kept != want:
        violations.append(
            Violation("transcript", "the recording's last message is not the crash-free answer")
        )
    return violations


def _unknown(observed: Observed) -> frozenset[int]:
    """The calls a done turn must show as of unknown outcome (none if cancelled)."""
    if observed.tool_calls is None or _cancelled(observed):
        return frozenset()
    return observed.tool_calls.unknown()


def _masked_difference(
    expected: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]], unknown: frozenset[int]
) -> str | None:
    """How ``actual`` differs from the crash-free transcript beyond what the
    calls of unknown outcome change (see ``_answer_difference``); None if not."""
    if len(expected) != len(actual):
        return _difference(expected, actual)
    answer = max((n for n, m in enumerate(expected) if m.get("sender") == "bot"), default=None)
    for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if position == answer and got.get("sender") == "bot":
            problem = _answer_difference(want, got, unknown)
            if problem is not None:
                return f"message {position} (bot): {problem}"
        elif want != got:
            return _difference([want], [got]).replace("message 0", f"message {position}", 1)
    return None


def _answer_difference(
    want: dict[str, Any], got: dict[str, Any], unknown: frozenset[int]
) -> str | None:
    """How the answer ``got`` differs from the crash-free ``want`` beyond what
    the calls ``unknown`` (by index among the answer's tool calls) change; None
    if it does not.

    Compared exactly: every field but the content; the parts up to the end of
    the tool request (a run of adjacent tool parts) that holds the first of
    those calls, each call's result included, except those calls', which must
    be errors saying the call may or may not have happened; and the content's
    beginning, the text before the first tool request. Not compared: the parts
    after that request, the model's reply to results other than the crash-free
    run's; there must be at least one, with text.
    """
    fields = {k: v for k, v in got.items() if k not in ("content", "content_parts")}
    if fields != {k: v for k, v in want.items() if k not in ("content", "content_parts")}:
        return "fields besides its content differ from the crash-free run's"
    want_parts = list(want.get("content_parts") or [])
    got_parts = list(got.get("content_parts") or [])
    tools = [n for n, part in enumerate(want_parts) if part.get("type") == "tool"]
    if min(unknown) >= len(tools):
        return f"it has no tool call {min(unknown)}: the crash-free run has {len(tools)}"
    end = tools[min(unknown)]
    while end + 1 < len(want_parts) and want_parts[end + 1].get("type") == "tool":
        end += 1
    compared = end + 1
    if len(got_parts) < compared:
        return f"{len(got_parts)} parts; the crash-free run has {compared} up to its tool results"
    call = -1
    for position in range(compared):
        wanted, part = want_parts[position], got_parts[position]
        if wanted.get("type") != "tool":
            if part != wanted:
                return f"part {position} ({wanted.get('type')}) differs from the crash-free run's"
            continue
        call += 1
        if call not in unknown:
            if part != wanted:
                return f"tool call {call} differs from the crash-free run's"
            continue
        tool, wanted_tool = dict(part.get("tool") or {}), dict(wanted.get("tool") or {})
        status, response = tool.pop("status", None), tool.pop("response", None)
        wanted_tool.pop("status", None)
        wanted_tool.pop("response", None)
        if tool != wanted_tool or part.get("type") != "tool":
            return f"tool call {call} is not the crash-free run's call"
        if status != "error" or UNKNOWN_OUTCOME not in str(response):
            return (
                f"tool call {call} ({tool.get('name')}) was cut off, yet is shown {status} "
                f"({str(response)[:60]!r}), not as {UNKNOWN_OUTCOME!r}"
            )
    reply = [
        part for part in got_parts[compared:] if part.get("type") == "text" and part.get("text")
    ]
    if not reply:
        return "the model wrote nothing after the tool results"
    opening = want_parts[0].get("text") if want_parts[0].get("type") == "text" else None
    if opening and not str(got.get("content", "")).startswith(str(opening)):
        return "its content does not begin with the crash-free run's text before the tool calls"
    return None


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


def _one_answer(observed: Observed) -> list[Violation]:
    """Exactly one bot message per turn (each user message is one turn), and
    exactly one carrying this turn's message id."""
    if observed.transcript is None:
        return []
    users = [m for m in observed.transcript if m.get("sender") == "user"]
    bots = [m for m in observed.transcript if m.get("sender") == "bot"]
    violations = []
    if len(bots) != len(users):
        violations.append(
            Violation(
                "one-answer",
                f"the transcript has {len(bots)} bot messages for {len(users)} user messages",
            )
        )
    if observed.message_id is not None:
        own = [m for m in bots if m.get("message_id") == observed.message_id]
        if len(own) != 1:
            violations.append(
                Violation(
                    "one-answer",
                    f"the transcript has {len(own)} bot messages of turn {observed.message_id}",
                )
            )
    return violations


def _own_checkpoint(expected: Expected, observed: Observed) -> list[Violation]:
    """The checkpoint the turn leaves is its own: a resume loaded (and carried
    on) this turn's state, and answered this turn's question."""
    stored = observed.stored
    if stored is None or observed.message_id is None:
        return []
    if stored.checkpoint_message_id is None:
        return [Violation("own-checkpoint", "the agent state holds no turn marker")]
    violations = []
    if stored.checkpoint_message_id != observed.message_id:
        violations.append(
            Violation(
                "own-checkpoint",
                f"the checkpoint belongs to turn {stored.checkpoint_message_id}, "
                f"not {observed.message_id}",
            )
        )
    if stored.checkpoint_input is not None:
        users = [m for m in stored.checkpoint_input if m.get("sender") == "user"]
        if not users or users[-1].get("content") != expected.prompt:
            asked = repr(str(users[-1].get("content", ""))[:40]) if users else "no question"
            violations.append(
                Violation(
                    "own-checkpoint",
                    f"the checkpoint's turn input ends with {asked}, not the user's message",
                )
            )
    return violations


def _unique_ids(readers: Sequence[ReaderTrace]) -> list[Violation]:
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


def _verdict(observed: Observed) -> list[Violation]:
    """A cancel near the end: one verdict, told the same by every witness."""
    status = _verdict_of(observed)
    if status not in ("done", "cancelled"):
        return []  # ``terminal`` says so
    violations = []
    want = {"done": "complete", "cancelled": "cancelled"}[status]
    if observed.conversation_store and observed.last_turn_status != want:
        violations.append(
            Violation(
                "verdict",
                f"the supervision row says {status} but the transcript's last turn is "
                f"{observed.last_turn_status}",
            )
        )
    cancel = observed.cancel
    assert cancel is not None
    if cancel.response_status == 204 and status != "cancelled":
        violations.append(
            Violation("verdict", f"the cancel was accepted (204) but the turn is {status}")
        )
    if cancel.response_status == 410 and status != "done":
        violations.append(
            Violation("verdict", f"the cancel came too late (410) but the turn is {status}")
        )
    if cancel.reader_verdict in ("done", "cancelled") and cancel.reader_verdict != status:
        violations.append(
            Violation(
                "verdict",
                f"the client's stream ended {cancel.reader_verdict}; the row says {status}",
            )
        )
    return violations


def _tool_once(expected: Expected, observed: Observed) -> list[Violation]:
    # The tool log counts the calculator; the tool-call ledger every tool.
    tools = "the calculator" if observed.tool_calls is None else "the turn's tools"
    if _cancelled(observed):
        # Cancelled before its tool call, a turn runs it fewer times; never more.
        if observed.tool_runs > expected.tool_runs:
            return [
                Violation(
                    "tool-once",
                    f"{tools} ran {observed.tool_runs} times for a cancelled turn, "
                    f"{expected.tool_runs} in the crash-free run",
                )
            ]
        return []
    allowed = {expected.tool_runs}
    if observed.tool_outcome_unknown and expected.tool_runs:
        allowed.add(expected.tool_runs + 1)
    if observed.tool_runs not in allowed:
        return [
            Violation(
                "tool-once",
                f"{tools} ran {observed.tool_runs} times this round, "
                f"{expected.tool_runs} in the crash-free run",
            )
        ]
    return []


def _at_most_once(observed: Observed, calls: ToolCalls) -> list[Violation]:
    """The rule of issue 14, from the runs the tools recorded outside the server."""
    violations = []
    for index, runs in calls.by_call().items():
        first = runs[0]
        name = f"call {index} ({first.tool}, on_unknown={first.on_unknown})"
        if first.at_most_once and len(runs) > 1:
            violations.append(
                Violation(
                    "at-most-once",
                    f"{name} ran {len(runs)} times with key {first.key}: at most once",
                )
            )
        attempts = [run.attempt for run in runs]
        if attempts != list(range(1, len(runs) + 1)):
            violations.append(
                Violation(
                    "at-most-once",
                    f"{name} ran as attempts {attempts}: a run was not recorded as started",
                )
            )
        for run in runs:
            if run.ended_at is None:
                continue
            # Calls run one at a time, each recorded completed before the next
            # starts: another call starting after this run ended proves its
            # result was checkpointed, and no resume may run it again.
            proof = min(
                (
                    o.started_at
                    for o in calls.runs
                    if o.index != index and o.started_at > run.ended_at
                ),
                default=None,
            )
            if proof is not None and any(later.started_at > proof for later in runs):
                violations.append(
                    Violation(
                        "at-most-once",
                        f"{name} ran again after it completed (another call started after it)",
                    )
                )
                break
    if _verdict_of(observed) != "done" or _cancelled(observed):
        return violations
    answer = turn_answer(observed)
    if answer is None:
        return violations
    shown = [
        dict(part.get("tool") or {})
        for part in answer.get("content_parts") or []
        if part.get("type") == "tool"
    ]
    by_call = calls.by_call()
    for index in sorted(calls.unknown()):
        tool = shown[index] if index < len(shown) else {}
        if tool.get("status") != "error" or UNKNOWN_OUTCOME not in str(tool.get("response")):
            violations.append(
                Violation(
                    "at-most-once",
                    f"call {index} ({by_call[index][0].tool}) was cut off, yet the answer shows "
                    f"it {tool.get('status', 'missing')}, not as {UNKNOWN_OUTCOME!r}",
                )
            )
    for index in sorted(calls.retried()):
        runs = by_call[index]
        tool = shown[index] if index < len(shown) else {}
        if not runs[-1].ended or tool.get("status") != "completed":
            violations.append(
                Violation(
                    "at-most-once",
                    f"call {index} ({runs[0].tool}, on_unknown=retry) was cut off and did not "
                    f"run again to completion (last run ended: {runs[-1].ended}, shown "
                    f"{tool.get('status', 'missing')})",
                )
            )
    for index, tool in enumerate(shown):
        if tool.get("status") == "completed" and not any(
            run.ended for run in by_call.get(index, [])
        ):
            violations.append(
                Violation(
                    "at-most-once",
                    f"call {index} ({tool.get('name')}) is shown completed but no run of it ended",
                )
            )
    return violations


def turn_answer(observed: Observed) -> dict[str, Any] | None:
    """The turn's answer as kept: the transcript's, else the recording's, else
    the one last streamed."""
    if observed.transcript is not None:
        bots = [m for m in observed.transcript if m.get("sender") == "bot"]
        return bots[-1] if bots else None
    if observed.stored is not None and observed.stored.recorded_final is not None:
        return observed.stored.recorded_final
    return observed.final_streamed


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
    return len(shown) - len(_common_prefix(shown, now))


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
    if _verdict_of(observed) != "done":
        return None
    answer = turn_answer(observed)
    return None if answer is None else _text(answer)


def _shown_kept(observed: Observed) -> list[Violation]:
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
