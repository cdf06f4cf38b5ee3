"""What a crash test found: one result per turn, the run's summary, its JSON form.

A round runs several conversations at once on the replica it fails; each of
their turns is checked on its own and has its own result (``RoundResult``,
numbered by round and conversation). A round passes when all of its turns do.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.crashtest.invariants import Violation


@dataclass
class RoundResult:
    """One turn of one round: the conversation ``conversation`` of round ``number``."""

    number: int
    producer: str
    fault: str
    point: str
    prompt: str
    conversation: int = 0
    variant: str | None = None
    """For pause-in-write, the write paused in (checkpoint, transcript, recording)."""
    session_id: str = ""
    message_id: str | None = None
    path: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    rewound_characters: int = 0
    """Characters its readers were shown and then taken back (0 when sound:
    ``invariants.rewound_characters``)."""
    error: str | None = None
    """The round could not be run as planned (not a finding about the server)."""
    notes: list[str] = field(default_factory=list)
    time_to_first_message: float | None = None
    gaps: list[float] = field(default_factory=list)
    recovery_latency: float | None = None
    """Fault to the first content the client had not seen, from any stream."""
    takeover_latency: float | None = None
    """Fault to the first new content from another replica (None: no takeover)."""
    dead_to_new_content: float | None = None
    """Unattended rounds: from the moment the turn read dead (its last heartbeat
    plus the dead threshold, by the store's clock) to the first new content;
    None when the new content came before that moment."""
    before_threshold: bool = False
    """Unattended rounds: the new content came before the turn could read dead
    by its heartbeat's age (the producer's free presence lock said so first)."""
    duration: float = 0.0
    tool_runs: int | None = None
    expected_tool_runs: int | None = None
    readers: list[dict[str, Any]] = field(default_factory=list)
    """Each SSE connection of the round: where, what it got, how it ended."""
    fence: dict[str, Any] | None = None
    """For a stop round: the epochs and what the continued producer's readers heard."""
    final_status: str | None = None
    """The turn's verdict after the round (done, cancelled, ...)."""
    fence_checked: bool | None = None
    """In a stop or pause-in-write round: whether the fence could be checked
    (False: the producer was continued before the turn was taken over)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Turns of the tool agent: each tool call, from the tool-call ledger (its
    tool, ``on_unknown``, runs and attempts, whether a run was cut off, how the
    answer shows it)."""

    @property
    def passed(self) -> bool:
        return not self.violations and self.error is None

    @property
    def label(self) -> str:
        """``round.conversation``, as the report names the turn."""
        return f"{self.number}.{self.conversation}"

    @property
    def fault_label(self) -> str:
        """The fault, with the write paused in for pause-in-write."""
        return f"{self.fault}/{self.variant}" if self.variant else self.fault

    @property
    def path_text(self) -> str:
        return ">".join(self.path) or "-"

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.number,
            "conversation": self.conversation,
            "passed": self.passed,
            "producer": self.producer,
            "fault": self.fault,
            "variant": self.variant,
            "point": self.point,
            "prompt": self.prompt,
            "session_id": self.session_id,
            "message_id": self.message_id,
            "path": self.path_text,
            "violations": [{"invariant": v.invariant, "detail": v.detail} for v in self.violations],
            "rewound_characters": self.rewound_characters,
            "error": self.error,
            "notes": self.notes,
            "time_to_first_message_s": _rounded(self.time_to_first_message),
            "inter_message_gap_p50_s": _rounded(percentile(self.gaps, 50)),
            "recovery_latency_s": _rounded(self.recovery_latency),
            "takeover_latency_s": _rounded(self.takeover_latency),
            "dead_to_new_content_s": _rounded(self.dead_to_new_content),
            "before_threshold": self.before_threshold,
            "duration_s": _rounded(self.duration),
            "tool_runs": self.tool_runs,
            "expected_tool_runs": self.expected_tool_runs,
            "final_status": self.final_status,
            "fence_checked": self.fence_checked,
            "tool_calls": self.tool_calls,
            "readers": self.readers,
            "fence": self.fence,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile, interpolating between closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _spread(values: Sequence[float], *, with_max: bool = False) -> dict[str, float | None]:
    spread = {"p50": _rounded(percentile(values, 50)), "p99": _rounded(percentile(values, 99))}
    if with_max:
        spread["max"] = _rounded(max(values)) if values else None
    return spread


@dataclass
class CrashTestReport:
    settings: dict[str, Any]
    planned_rounds: int
    conversations: int = 1
    """Turns each round runs at once on the replica it fails."""
    results: list[RoundResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None
    """The run itself could not go on (a replica would not start, say)."""
    workdir: str | None = None

    @property
    def rounds_run(self) -> int:
        return len({result.number for result in self.results})

    @property
    def passed(self) -> int:
        """Rounds every turn of which passed."""
        failed = {result.number for result in self.results if not result.passed}
        return self.rounds_run - len(failed)

    @property
    def turns_passed(self) -> int:
        return sum(1 for result in self.results if result.passed)

    @property
    def violations(self) -> int:
        return sum(len(result.violations) for result in self.results)

    @property
    def errors(self) -> int:
        """Turns that broke off (could not be run as planned)."""
        return sum(1 for result in self.results if result.error is not None)

    @property
    def ok(self) -> bool:
        """Every planned round ran, with every one of its turns, and passed."""
        return (
            not self.interrupted
            and self.error is None
            and self.rounds_run == self.planned_rounds
            and len(self.results) == self.planned_rounds * self.conversations
            and self.turns_passed == len(self.results)
        )

    def summary(self) -> dict[str, Any]:
        results = self.results
        by_fault: dict[str, dict[str, Any]] = {}
        for fault in sorted({r.fault_label for r in results}):
            of_fault = [r for r in results if r.fault_label == fault]
            by_fault[fault] = {
                "rounds": len({r.number for r in of_fault}),
                "turns": len(of_fault),
                "turns_passed": sum(1 for r in of_fault if r.passed),
                "verdicts": dict(Counter(r.final_status or "-" for r in of_fault).most_common()),
                "fence_checked": sum(1 for r in of_fault if r.fence_checked),
                "fence_unchecked": sum(1 for r in of_fault if r.fence_checked is False),
                "recovery_latency_s": _spread(
                    _present(r.recovery_latency for r in of_fault), with_max=True
                ),
                "takeover_latency_s": _spread(
                    _present(r.takeover_latency for r in of_fault), with_max=True
                ),
                "dead_to_new_content_s": _spread(
                    _present(r.dead_to_new_content for r in of_fault), with_max=True
                ),
                "before_threshold": sum(1 for r in of_fault if r.before_threshold),
            }
        return {
            "time_to_first_message_s": _spread(_present(r.time_to_first_message for r in results)),
            "inter_message_gap_s": _spread([gap for r in results for gap in r.gaps]),
            "recovery_latency_s": _spread(
                _present(r.recovery_latency for r in results), with_max=True
            ),
            "takeover_latency_s": _spread(
                _present(r.takeover_latency for r in results), with_max=True
            ),
            "by_fault": by_fault,
            "rewound_characters": sum(r.rewound_characters for r in results),
            "turns_rewound": sum(1 for r in results if r.rewound_characters),
            "paths": dict(Counter(r.path_text for r in results).most_common()),
            "violations_by_invariant": dict(
                Counter(v.invariant for r in results for v in r.violations).most_common()
            ),
            "tool_calls": tool_call_counts(results),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds_run,
            "planned_rounds": self.planned_rounds,
            "passed": self.passed,
            "conversations": self.conversations,
            "turns": len(self.results),
            "turns_passed": self.turns_passed,
            "violations": self.violations,
            "errors": self.errors,
            "interrupted": self.interrupted,
            "error": self.error,
            "settings": self.settings,
            "summary": self.summary(),
            "warnings": self.warnings,
            "workdir": self.workdir,
            "results": [result.to_json() for result in self.results],
        }


def tool_call_counts(results: Sequence[RoundResult]) -> dict[str, int]:
    """The tool-call ledger's figures over every turn of the tool agent: how
    many calls a kill cut off, and whether each ran as its policy says."""
    calls = [call for result in results for call in result.tool_calls]
    once = [call for call in calls if call["on_unknown"] != "retry"]
    retry = [call for call in calls if call["on_unknown"] == "retry"]
    return {
        "turns": sum(1 for result in results if result.tool_calls),
        "calls": len(calls),
        "runs": sum(call["runs"] for call in calls),
        "cut_off_at_most_once": sum(1 for call in once if call["cut_off"]),
        "cut_off_at_most_once_ran_once": sum(
            1 for call in once if call["cut_off"] and call["runs"] == 1
        ),
        "cut_off_at_most_once_shown_unknown": sum(
            1 for call in once if call["cut_off"] and call["shown"] == "unknown"
        ),
        "cut_off_retry": sum(1 for call in retry if call["cut_off"]),
        "cut_off_retry_ran_again": sum(
            1
            for call in retry
            if call["cut_off"] and call["runs"] > 1 and call["shown"] == "completed"
        ),
        "at_most_once_ran_twice": sum(1 for call in once if call["runs"] > 1),
        "completed_ran_again": sum(1 for call in calls if not call["cut_off"] and call["runs"] > 1),
    }


def _present(values: Iterable[float | None]) -> list[float]:
    return [value for value in values if value is not None]
