"""What a crash test found: one result per round, the run's summary, its JSON form."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.crashtest.invariants import Violation


@dataclass
class RoundResult:
    number: int
    producer: str
    fault: str
    point: str
    prompt: str
    session_id: str = ""
    message_id: str | None = None
    path: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    error: str | None = None
    """The round could not be run as planned (not a finding about the server)."""
    notes: list[str] = field(default_factory=list)
    time_to_first_message: float | None = None
    gaps: list[float] = field(default_factory=list)
    recovery_latency: float | None = None
    """Fault to the first content the client had not seen, from any stream."""
    takeover_latency: float | None = None
    """Fault to the first new content from another replica (None: no takeover)."""
    duration: float = 0.0
    tool_runs: int | None = None
    expected_tool_runs: int | None = None
    readers: list[dict[str, Any]] = field(default_factory=list)
    """Each SSE connection of the round: where, what it got, how it ended."""
    fence: dict[str, Any] | None = None
    """For a stop round: the epochs and what the continued producer's readers heard."""

    @property
    def passed(self) -> bool:
        return not self.violations and self.error is None

    @property
    def path_text(self) -> str:
        return ">".join(self.path) or "-"

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.number,
            "passed": self.passed,
            "producer": self.producer,
            "fault": self.fault,
            "point": self.point,
            "prompt": self.prompt,
            "session_id": self.session_id,
            "message_id": self.message_id,
            "path": self.path_text,
            "violations": [{"invariant": v.invariant, "detail": v.detail} for v in self.violations],
            "error": self.error,
            "notes": self.notes,
            "time_to_first_message_s": _rounded(self.time_to_first_message),
            "inter_message_gap_p50_s": _rounded(percentile(self.gaps, 50)),
            "recovery_latency_s": _rounded(self.recovery_latency),
            "takeover_latency_s": _rounded(self.takeover_latency),
            "duration_s": _rounded(self.duration),
            "tool_runs": self.tool_runs,
            "expected_tool_runs": self.expected_tool_runs,
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
    results: list[RoundResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None
    """The run itself could not go on (a replica would not start, say)."""
    workdir: str | None = None

    @property
    def passed(self) -> int:
        return sum(1 for result in self.results if result.passed)

    @property
    def violations(self) -> int:
        return sum(len(result.violations) for result in self.results)

    @property
    def errors(self) -> int:
        return sum(1 for result in self.results if result.error is not None)

    @property
    def ok(self) -> bool:
        """Every planned round ran and passed."""
        return (
            not self.interrupted
            and self.error is None
            and len(self.results) == self.planned_rounds
            and self.passed == self.planned_rounds
        )

    def summary(self) -> dict[str, Any]:
        results = self.results
        by_fault: dict[str, dict[str, Any]] = {}
        for fault in sorted({r.fault for r in results}):
            of_fault = [r for r in results if r.fault == fault]
            by_fault[fault] = {
                "rounds": len(of_fault),
                "recovery_latency_s": _spread(
                    _present(r.recovery_latency for r in of_fault), with_max=True
                ),
                "takeover_latency_s": _spread(
                    _present(r.takeover_latency for r in of_fault), with_max=True
                ),
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
            "paths": dict(Counter(r.path_text for r in results).most_common()),
            "violations_by_invariant": dict(
                Counter(v.invariant for r in results for v in r.violations).most_common()
            ),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "rounds": len(self.results),
            "planned_rounds": self.planned_rounds,
            "passed": self.passed,
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


def _present(values: Iterable[float | None]) -> list[float]:
    return [value for value in values if value is not None]
