"""``tether crash-test``: prove a deployment's durability with real replicas and real signals.

It starts replicas of a project against one store set and, each round, runs
several turns at once on one of them, then fails it: kills, terminates or pauses
it at a random point, pauses it inside a store write, drains it and then the
replica that resumed its turns, cancels the turns from another replica as
they end, or kills it in the middle of a tool call. It recovers each turn as
a client would and checks design §5's invariants (and issue 14's at-most-once
rule for tool calls) from the outside, turn by turn. Exit code: 0 when every round
passed, 1 on any violation or broken-off turn, 2 when it could not run, 130
when interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.console import Console

from tether.cli.serve import DEFAULT_STORE_URL
from tether.cli.server_app import example_project_dir
from tether.crashtest.cluster import ClusterError
from tether.crashtest.faults import FaultChoice
from tether.crashtest.instruments.pause_in_write import WriteKind
from tether.crashtest.report import LiveView, render_summary
from tether.crashtest.results import CrashTestReport
from tether.crashtest.runner import CrashTestConfig, new_report, project_agents, run_crash_test

EXIT_VIOLATIONS = 1
EXIT_CANNOT_RUN = 2
EXIT_INTERRUPTED = 130
_MAY_GO_WITHOUT = ("conversation",)
_LONG_AGENT = "long-writer"
_TOOL_AGENT = "note-writer"
_MAX_CONVERSATIONS = 200


def default_store_url(directory: Path) -> str:
    """The embedded default store of ``tether serve``, in a fresh directory."""
    if urlsplit(DEFAULT_STORE_URL).scheme == "sqlite":
        return f"sqlite:///{directory / 'tether.db'}"
    return f"file://{directory}"


def crash_test_command(
    project_dir: Annotated[
        Path | None,
        typer.Argument(help="Project directory with an agents/ package (default: the example)."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="Store URL every replica shares (default: the embedded store in a fresh "
            "temporary directory)."
        ),
    ] = None,
    stream_store: Annotated[
        str | None,
        typer.Option(
            help="Store URL for the recording and supervision stores (as tether serve "
            "--stream-store), e.g. redis:// beside a postgresql:// --store."
        ),
    ] = None,
    replicas: Annotated[int, typer.Option(min=2, help="Server processes to run.")] = 2,
    rounds: Annotated[int, typer.Option(min=1, help="Faults to inject, one a round.")] = 10,
    conversations: Annotated[
        int,
        typer.Option(
            min=1,
            max=_MAX_CONVERSATIONS,
            help="Turns each round runs at once on the replica it fails (all are hit).",
        ),
    ] = 4,
    fault: Annotated[
        FaultChoice,
        typer.Option(
            help="kill (SIGKILL), unattended (SIGKILL, and no client recovers: only a "
            "second device attached through another replica watches), term (SIGTERM: "
            "drain), stop (SIGSTOP, then SIGCONT), "
            "pause-in-write (the replica stops itself inside a checkpoint, transcript or "
            "recording write, continued once its turns finished elsewhere), rolling-deploy "
            "(drain it, then the replica that resumed its turns), cancel-at-end (cancel "
            "from another replica as the answers end), tool (SIGKILL in the middle of a "
            "tool call of the --tool-agent's turns: a write, on_unknown=fail, or a read, "
            "retry; checks that a write never ran twice), queue (a second message with a "
            "drawn multitask strategy while the producer is killed; the conversation "
            "checked as a whole), erase (erase while the survivors take a killed "
            "producer's turns over; nothing may be left), or mixed (every single-turn "
            "fault; tool where the project has the --tool-agent)."
        ),
    ] = FaultChoice.MIXED,
    pause_in: Annotated[
        list[WriteKind] | None,
        typer.Option(
            help="The writes pause-in-write rounds pause in (repeatable; default: "
            "checkpoint, transcript and recording, one chosen per round)."
        ),
    ] = None,
    without: Annotated[
        list[str] | None,
        typer.Option(
            help="Run the replicas without this store (as tether serve --without); "
            "only 'conversation' leaves a deployment the crash test can fail and recover."
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of every random choice (default: a random one).")
    ] = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the report to this JSON file.")
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            help="agent_identifier of the long agent, the one every round but tool rounds "
            "runs: a long, deterministic answer (so a resumed turn can be compared with a "
            "crash-free one) whose tool counts its runs in TETHER_TOOL_LOG, like the "
            "example's long-writer (the default) or pydantic-writer (the same on "
            "PydanticAI). With --fault tool and no --tool-agent: the tool agent."
        ),
    ] = None,
    tool_agent: Annotated[
        str | None,
        typer.Option(
            help="agent_identifier of the agent tool rounds run: its tools record their runs "
            "in the crash test's tool-call ledger "
            "(tether.crashtest.instruments.tool_ledger.recorded), like the example's "
            "note-writer (the default) or pydantic-note-writer (the same on PydanticAI)."
        ),
    ] = None,
    via_load_balancer: Annotated[
        bool,
        typer.Option(
            "--via-load-balancer",
            help="Put a real HAProxy (Debian's haproxy package) in front of the replicas: "
            "round-robin, health checks on /probes/ready. Every request goes through it, "
            "each round's turns pinned to the replica it fails; the Python client "
            "(tether.client) recovers them through it.",
        ),
    ] = False,
) -> None:
    """Fail the replica producing several long turns, round after round, and check that
    nothing was lost, duplicated, re-run or overwritten."""
    console = Console()
    if any(url is not None and urlsplit(url).scheme == "memory" for url in (store, stream_store)):
        console.print("[red]memory:// is private to each process; replicas cannot share it[/red]")
        raise typer.Exit(EXIT_CANNOT_RUN)
    left_out = tuple(dict.fromkeys(without or []))
    unusable = [name for name in left_out if name not in _MAY_GO_WITHOUT]
    if unusable:
        console.print(
            f"[red]--without {', '.join(unusable)}: stateful turns that resume on another "
            "replica need the state, recording and supervision stores; only "
            f"{', '.join(_MAY_GO_WITHOUT)} can be left out[/red]"
        )
        raise typer.Exit(EXIT_CANNOT_RUN)
    writes = tuple(dict.fromkeys(pause_in or list(WriteKind)))
    if "conversation" in left_out and writes == (WriteKind.TRANSCRIPT,):
        console.print("[red]--pause-in transcript needs the conversation store[/red]")
        raise typer.Exit(EXIT_CANNOT_RUN)
    project = (project_dir or example_project_dir()).resolve()
    agents = project_agents(project)
    if tool_agent is None:
        # Only tool rounds run: the agent named is the one they run.
        tool_agent = agent if fault is FaultChoice.TOOL and agent is not None else _TOOL_AGENT
    agent = agent or _LONG_AGENT
    if fault is not FaultChoice.TOOL and agent not in agents:
        console.print(
            f"[red]--agent {agent!r}: {project} does not define it (its setups name "
            f"{', '.join(sorted(agents)) or 'no agent'})[/red]"
        )
        raise typer.Exit(EXIT_CANNOT_RUN)
    if fault is FaultChoice.TOOL and tool_agent not in agents:
        console.print(
            f"[red]--fault tool runs the agent {tool_agent!r} (--tool-agent, or --agent "
            f"without it), which {project} does not define[/red]"
        )
        raise typer.Exit(EXIT_CANNOT_RUN)
    workdir = Path(tempfile.mkdtemp(prefix="tether-crash-test-"))
    config = CrashTestConfig(
        project_dir=project,
        store_url=store or default_store_url(workdir / "store"),
        stream_store_url=stream_store,
        replicas=replicas,
        rounds=rounds,
        conversations=conversations,
        without=left_out,
        pause_in=writes,
        fault=fault,
        seed=seed if seed is not None else random.SystemRandom().randrange(1, 10**6),
        agent=agent,
        tool_agent=tool_agent,
        workdir=workdir,
        via_load_balancer=via_load_balancer,
    )
    report = new_report(config)
    code = _run(config, report, console)
    if report.ok or (report.interrupted and not report.violations and not report.errors):
        # Keep the replicas' logs only when there is something to read in them.
        shutil.rmtree(workdir, ignore_errors=True)
        report.workdir = None
    console.print(render_summary(report))
    if json_file is not None:
        json_file.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    if code:
        raise typer.Exit(code)


def _run(config: CrashTestConfig, report: CrashTestReport, console: Console) -> int:
    front = ", through HAProxy" if config.via_load_balancer else ""
    console.print(
        f"tether crash-test: {config.rounds} rounds of {config.conversations} turns, "
        f"fault {config.fault}, {config.replicas} replicas{front}, {config.stores_described}, "
        f"seed {config.seed}"
    )
    try:
        with LiveView(console, config.rounds) as view:
            asyncio.run(_main(config, view, report))
    except (KeyboardInterrupt, asyncio.CancelledError):
        report.interrupted = True
        return EXIT_INTERRUPTED
    except ClusterError as error:
        report.error = str(error)
        return EXIT_CANNOT_RUN
    return 0 if report.ok else EXIT_VIOLATIONS


async def _main(config: CrashTestConfig, view: LiveView, report: CrashTestReport) -> None:
    # SIGTERM to the crash test stops it like Ctrl-C: rounds hang up, replicas stop.
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    installed = False
    if task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
            installed = True
    try:
        await run_crash_test(config, view, report)
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)
