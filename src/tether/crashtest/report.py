"""The crash test on screen: a live table of turns (round.conversation) with the
current phase and a progress bar of rounds, then the summary. On a terminal the
view redraws in place; piped or captured, each turn is one printed line."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tether.crashtest.results import CrashTestReport, RoundResult
from tether.crashtest.rounds import RoundPlan

# Keep the live table to a screenful; the summary has every round.
_VISIBLE_ROUNDS = 20


class LiveView:
    def __init__(self, console: Console, rounds: int) -> None:
        self.console = console
        self._phase = "starting"
        self._rows: dict[tuple[int, int], list[RenderableType]] = {}
        self._progress = Progress(
            TextColumn("rounds"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task("rounds", total=rounds)
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self._live = Live(
                get_renderable=self._render, console=self.console, refresh_per_second=8
            )
            self._live.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._phase = "finished" if kind is None else "stopped"
            self._live.stop()
            self._live = None

    def phase(self, text: str) -> None:
        self._phase = text

    def round_started(self, plan: RoundPlan) -> None:
        for slot in range(len(plan.prompts)):
            self._rows[(plan.number, slot)] = [
                f"{plan.number}.{slot}",
                plan.producer.name,
                str(plan.fault.kind),
                plan.fault.describe(),
                "",
                "",
                Text("running", style="yellow"),
            ]

    def round_finished(self, results: list[RoundResult]) -> None:
        for result in results:
            self._rows[(result.number, result.conversation)] = _row(result)
            if self._live is None:
                line = Text.assemble(
                    f"turn {result.label:>6}  {result.producer}  {result.fault:<14}  "
                    f"{result.point:<20}  {result.path_text:<24}  "
                    f"{_seconds(result.recovery_latency):>8}  {result.final_status or '-':<9}  ",
                    _verdict(result),
                )
                self.console.print(line, soft_wrap=True)
        self._progress.advance(self._task)

    def _render(self) -> RenderableType:
        table = _rounds_table()
        for key in sorted(self._rows)[-_VISIBLE_ROUNDS:]:
            table.add_row(*self._rows[key])
        return Group(table, Text(self._phase, style="cyan"), self._progress)


def _rounds_table() -> Table:
    table = Table(title="tether crash-test", title_justify="left", expand=False)
    for header in ("turn", "replica", "fault", "point", "recovery path", "recovered in", "result"):
        table.add_column(header, justify="right" if header in ("turn", "recovered in") else "left")
    return table


def _row(result: RoundResult) -> list[RenderableType]:
    return [
        result.label,
        result.producer,
        result.fault,
        result.point,
        result.path_text,
        _seconds(result.recovery_latency),
        _verdict(result),
    ]


def _verdict(result: RoundResult) -> Text:
    if result.passed:
        return Text("pass", style="green")
    if result.error is not None and not result.violations:
        return Text("error", style="magenta")
    names = sorted({v.invariant for v in result.violations})
    return Text("FAIL " + ",".join(names), style="bold red")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1.0:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def _spread(values: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_seconds(value)}" for name, value in values.items())


def _tool_calls(counts: dict[str, int]) -> str:
    """The tool-call ledger's figures in a sentence."""
    return (
        f"{counts['calls']} calls in {counts['turns']} turns, {counts['runs']} runs; cut off "
        f"by the kill: {counts['cut_off_at_most_once']} that may not run twice (ran once "
        f"{counts['cut_off_at_most_once_ran_once']}, shown 'may or may not have happened' "
        f"{counts['cut_off_at_most_once_shown_unknown']}), {counts['cut_off_retry']} retry "
        f"(ran again to completion {counts['cut_off_retry_ran_again']}); ran twice: "
        f"{counts['at_most_once_ran_twice']} that may not, {counts['completed_ran_again']} "
        "completed"
    )


def render_summary(report: CrashTestReport) -> RenderableType:
    """The closing summary: the counts, the timings, the paths, and every finding."""
    summary = report.summary()
    ok = report.ok
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rounds = f"{report.passed} of {report.planned_rounds}"
    if report.rounds_run < report.planned_rounds:
        rounds += f" ({report.rounds_run} run)"
    table.add_row("rounds passed", Text(rounds, style="green" if ok else "red"))
    turns = (
        f"{report.turns_passed} of {len(report.results)} "
        f"({report.conversations} conversations a round)"
    )
    table.add_row("turns passed", Text(turns, style="green" if ok else "red"))
    table.add_row(
        "invariant violations",
        Text(str(report.violations), style="green" if not report.violations else "bold red"),
    )
    rewound = summary["rewound_characters"]
    table.add_row(
        "text rewound",
        Text(
            f"{rewound} characters in {summary['turns_rewound']} turns",
            style="green" if not rewound else "bold red",
        ),
    )
    if report.errors:
        table.add_row("turns that broke off", Text(str(report.errors), style="magenta"))
    table.add_row("time to first message", _spread(summary["time_to_first_message_s"]))
    table.add_row("inter-message gap", _spread(summary["inter_message_gap_s"]))
    table.add_row("recovery latency", _spread(summary["recovery_latency_s"]))
    table.add_row("takeover latency", _spread(summary["takeover_latency_s"]))
    for fault, of_fault in summary["by_fault"].items():
        verdicts = ", ".join(f"{name} x{count}" for name, count in of_fault["verdicts"].items())
        fenced = ""
        if of_fault["fence_checked"] or of_fault["fence_unchecked"]:
            fenced = f"; fence checked in {of_fault['fence_checked']} turns"
            if of_fault["fence_unchecked"]:
                fenced += f", not in {of_fault['fence_unchecked']} (continued before takeover)"
        if of_fault["dead_to_new_content_s"]["p50"] is not None:
            fenced += f"; dead to new content {_spread(of_fault['dead_to_new_content_s'])}"
        if of_fault.get("before_threshold"):
            fenced += (
                f"; {of_fault['before_threshold']} taken over before the dead threshold "
                "(presence lock)"
            )
        table.add_row(
            f"  {fault} ({of_fault['rounds']} rounds, {of_fault['turns']} turns)",
            f"recovery {_spread(of_fault['recovery_latency_s'])}; "
            f"takeover {_spread(of_fault['takeover_latency_s'])}; ended {verdicts}{fenced}",
        )
    tools = summary["tool_calls"]
    if tools["calls"]:
        table.add_row("tool calls (ledger)", _tool_calls(tools))
    paths = ", ".join(f"{path} x{count}" for path, count in summary["paths"].items())
    table.add_row("recovery paths", paths or "-")
    table.add_row(
        "settings",
        ", ".join(f"{key}={value}" for key, value in report.settings.items()),
    )
    parts: list[RenderableType] = [table]
    findings = [
        f"turn {result.label}: {item}"
        for result in report.results
        for item in (
            [f"[{v.invariant}] {v.detail}" for v in result.violations]
            + ([f"[error] {result.error}"] if result.error else [])
            + [f"[note] {note}" for note in result.notes]
        )
    ]
    findings += [f"[warning] {warning}" for warning in report.warnings]
    if report.error:
        findings.append(f"[error] {report.error}")
    if report.interrupted:
        findings.append("[interrupted] the run was stopped before its last round")
    for finding in findings:
        parts.append(Text(finding, style="red" if "[note]" not in finding else "yellow"))
    if report.workdir:
        parts.append(Text(f"replica logs kept in {report.workdir}", style="dim"))
    return Group(*parts)
