"""``tether simulate``: a seeded simulator of whole conversations over several replicas.

Replicas in one process share one set of stores and one virtual clock;
every store call is a switch point the seeded scheduler orders, while it
sends messages with every multitask strategy, cancels, polls, reads,
erases, kills and pauses replicas and moves time; design §5's invariants
are checked after every step (``tether.simulation``). A failing history
prints its seed and schedule, and ``--replay SEED`` runs it again, exactly.
Exit code 0 only when no history broke an invariant.
"""

from __future__ import annotations

import random
import time
from typing import Annotated

import typer

from tether.simulation.report import RunReport, describe_failure, tally
from tether.simulation.scheduler import Options, history_seed, run_history

_SHOWN_FAILURES = 3
"""Failing histories printed with their schedule (the rest by seed only)."""


def simulate_command(
    histories: Annotated[int, typer.Option(help="Histories to run.")] = 1000,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the run (default: random, printed).")
    ] = None,
    steps: Annotated[int, typer.Option(help="Steps per history.")] = Options.steps,
    store: Annotated[str, typer.Option(help="memory, or sqlite (a temporary file).")] = "memory",
    replicas: Annotated[int, typer.Option(help="Replicas at the start.")] = 3,
    replay: Annotated[
        int | None, typer.Option(help="Replay the history of this seed, printing its schedule.")
    ] = None,
) -> None:
    """Run seeded histories of conversations on several replicas and check the invariants."""
    if store not in ("memory", "sqlite"):
        raise typer.BadParameter("--store is memory or sqlite")
    options = Options(steps=steps, store=store, replicas=replicas)
    flags = _flags(options)
    report = RunReport()
    started = time.perf_counter()
    if replay is not None:
        history = run_history(replay, options)
        typer.echo("\n".join(history.schedule))
        report.add(history)
        for violation in history.violations:
            typer.echo(f"violation: {violation}")
    else:
        run_seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        typer.echo(f"seed {run_seed}: {histories} histories of {steps} steps, {store}, {flags}")
        for number in range(histories):
            history = run_history(history_seed(run_seed, number), options)
            report.add(history)
            if history.violations and report.violations <= _SHOWN_FAILURES:
                typer.echo(describe_failure(history, options=flags))
            elif history.violations:
                typer.echo(f"history seed {history.seed} broke: {history.violations[0]}")
    elapsed = time.perf_counter() - started
    for line in tally(report):
        typer.echo(line)
    rate = report.histories / elapsed if elapsed > 0 else 0.0
    typer.echo(f"{elapsed:.1f} s, {rate:.1f} histories/s")
    typer.echo(f"{report.histories} histories, {report.violations} violations")
    raise typer.Exit(0 if report.violations == 0 else 1)


def _flags(options: Options) -> str:
    defaults = Options()
    shown = ""
    if options.steps != defaults.steps:
        shown += f" --steps {options.steps}"
    if options.store != defaults.store:
        shown += f" --store {options.store}"
    if options.replicas != defaults.replicas:
        shown += f" --replicas {options.replicas}"
    return (shown.strip() and shown) or ""
