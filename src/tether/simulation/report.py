"""What a run of many histories says: each failing seed with its schedule, and the tally."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tether.simulation.scheduler import History


@dataclass
class RunReport:
    """The histories of one run, as they finish."""

    histories: int = 0
    failed: list[History] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    first: dict[str, int] = field(default_factory=dict)
    """Per kind of violation, after how many histories it was first found."""

    def add(self, history: History) -> None:
        self.histories += 1
        if not history.violations:
            return
        self.failed.append(history)
        for kind in sorted({kind_of(v) for v in history.violations}):
            self.kinds[kind] += 1
            self.first.setdefault(kind, self.histories)

    @property
    def violations(self) -> int:
        """Histories with at least one violation."""
        return len(self.failed)


def kind_of(violation: str) -> str:
    """A violation's invariant: the words before its first colon."""
    return violation.split(":", 1)[0]


def describe_failure(history: History, *, options: str) -> str:
    lines = [
        f"history seed {history.seed} broke: " + "; ".join(history.violations),
        f"  replay: tether simulate --replay {history.seed}{options}",
        "  schedule:",
    ]
    lines.extend(f"    {step}" for step in history.schedule)
    return "\n".join(lines)


def tally(report: RunReport) -> list[str]:
    return [
        f"  {count:5d} x {kind} (first after {report.first[kind]} histories)"
        for kind, count in report.kinds.most_common()
    ]
