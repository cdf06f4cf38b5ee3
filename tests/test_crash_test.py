"""``tether crash-test``: the command itself, running real replicas under real signals.

The process tests run the command on a copy of the example project whose long
agent and tool agent stream fast (80 chunks at 40/s, the tool calls after 5),
so that a round takes seconds; the rolling deploy's copy streams a little
longer (120 chunks at 20/s), so that each of its drains lands seconds before
the answer's end. Its clients resume only once the first replica is back, so
that replica's restart, however slow, never races the answer. Each fault the
command plans runs here (kill, stop, term, a pause inside a write, a rolling
deploy, unattended turns, a second message, an erase, a cancel at the end, a
kill inside a tool call), with the options it refuses, the crash-free runs it
compares against (a bounded number at once) and the replicas' environment (no
fair limits unless asked). The checker, the fault planning and the
instruments have modules of their own (``test_crash_test_invariants``,
``test_crash_test_faults``, ``test_crash_test_instruments``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from tether.cli.main import app
from tether.cli.server_app import example_project_dir
from tether.crashtest import reference
from tether.crashtest.cluster import Replica, inherited_env
from tether.crashtest.faults import TurnShape


def _fast_project(directory: Path, *, chunks_per_second: int = 40, chunks: int = 80) -> Path:
    shutil.copytree(example_project_dir(), directory)
    setups_file = directory / "agents" / "agent_setups.json"
    setups = json.loads(setups_file.read_text())
    for setup in setups:
        if setup["agent_identifier"] in ("long-writer", "note-writer"):
            setup["agent_configuration"]["llm"].update(
                chunks_per_second=chunks_per_second, answer_chunks=chunks, tool_call_after_chunks=5
            )
    setups_file.write_text(json.dumps(setups, indent=2))
    return directory


@pytest.fixture(scope="module")
def fast_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fast_project(tmp_path_factory.mktemp("crash") / "project")


@pytest.fixture(scope="module")
def slower_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fast_project(
        tmp_path_factory.mktemp("crash") / "project", chunks_per_second=20, chunks=120
    )


def _crash_test(project: Path, report_file: Path, *args: str) -> dict[str, Any]:
    """Run the command; its JSON report, once it passed."""
    result = CliRunner().invoke(
        app, ["crash-test", str(project), "--json", str(report_file), *args]
    )
    assert result.exit_code == 0, result.output
    assert "rounds passed" in result.output and "turns passed" in result.output
    report: dict[str, Any] = json.loads(report_file.read_text())
    assert report["violations"] == 0
    assert report["summary"]["rewound_characters"] == 0  # no screen's text went back
    assert report["turns_passed"] == report["turns"] == len(report["results"])
    assert report["passed"] == report["rounds"] == report["planned_rounds"]
    return report


@pytest.mark.processes
@pytest.mark.parametrize(("fault", "rounds"), [("kill", 3), ("stop", 2), ("term", 2)])
def test_the_command_recovers_every_round_with_no_violation(
    fast_project: Path, tmp_path: Path, fault: str, rounds: int, request: pytest.FixtureRequest
) -> None:
    report_file = tmp_path / "report.json"
    # SIGSTOP can freeze a replica inside an SQLite transaction, holding the
    # embedded database's write lock: the survivor then cannot take the turns
    # over, the producer is continued anyway and the fence goes unchecked (it
    # happened under a loaded run). PostgreSQL has no lock a stopped client holds.
    store = ["--store", request.getfixturevalue("postgres_url")] if fault == "stop" else []
    result = CliRunner().invoke(
        app,
        [
            "crash-test", str(fast_project), "--fault", fault, "--rounds", str(rounds),
            "--conversations", "2", "--seed", "7", "--json", str(report_file), *store,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "rounds passed" in result.output

    report = json.loads(report_file.read_text())
    assert (report["rounds"], report["passed"], report["violations"]) == (rounds, rounds, 0)
    assert report["summary"]["rewound_characters"] == 0  # no screen's text went back
    assert len(report["results"]) == report["turns"] == report["turns_passed"] == 2 * rounds
    summary = report["summary"]
    assert summary["recovery_latency_s"]["max"] is not None
    assert summary["inter_message_gap_s"]["p50"] is not None
    for entry in report["results"]:
        assert entry["passed"] and entry["fault"] == fault and entry["violations"] == []
        # Once, or once more where the fault came before any reader got the
        # result (the other conversation's call may be in flight: the checker
        # allows that, and the round says so in its notes).
        assert entry["expected_tool_runs"] == 1
        assert entry["tool_runs"] == 1 or (
            entry["tool_runs"] == 2 and any("ran once more" in n for n in entry["notes"])
        ), entry["notes"]
        assert entry["path"] != "-"
        if fault == "kill":
            # The turn was taken over: by a surviving replica on its own (the
            # client attached to it), or by the client's resume if first.
            assert entry["path"].endswith(("resume", "attach")), entry["path"]
        if fault == "stop":
            fence = entry["fence"]
            assert fence["epoch_of_new_owner"] > fence["epoch_before_fault"]
            assert fence["old_readers_heard"] == ["gone"]


@pytest.mark.parametrize("option", ["--store", "--stream-store"])
def test_memory_store_is_refused(option: str) -> None:
    result = CliRunner().invoke(app, ["crash-test", option, "memory://", "--rounds", "1"])
    assert result.exit_code == 2
    assert "memory://" in result.output


@pytest.mark.processes
@pytest.mark.parametrize("write", ["checkpoint", "transcript", "recording"])
def test_a_replica_paused_inside_a_write_changes_nothing_when_continued(
    fast_project: Path, tmp_path: Path, write: str
) -> None:
    report = _crash_test(
        fast_project, tmp_path / "report.json",
        "--fault", "pause-in-write", "--pause-in", write, "--rounds", "1",
        "--conversations", "2", "--seed", "3",
    )  # fmt: skip
    results = report["results"]
    assert len(results) == 2
    for entry in results:
        assert (entry["fault"], entry["variant"], entry["final_status"]) == (
            "pause-in-write",
            write,
            "done",
        )
        assert not any("never came" in note for note in entry["notes"]), entry["notes"]
        # The producer was continued only once its turns were done elsewhere,
        # and the fence was checked: its late write changed nothing.
        assert entry["fence_checked"] is True, entry["notes"]
    assert any(entry["path"].endswith(("resume", "attach")) for entry in results)


def _slow_first_restart(monkeypatch: pytest.MonkeyPatch, *, seconds: float) -> None:
    """The first replica restarted in this test (a start after its first)
    waits ``seconds`` before its process starts."""
    start = Replica.start
    slowed: list[str] = []

    async def slow_start(self: Replica, *args: Any, **kwargs: Any) -> None:
        if self.starts and not self.alive and not slowed:
            slowed.append(self.name)
            await asyncio.sleep(seconds)
        await start(self, *args, **kwargs)

    monkeypatch.setattr(Replica, "start", slow_start)


@pytest.mark.processes
def test_a_rolling_deploy_resumes_twice_to_the_crash_free_answer(
    slower_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short drain grace, so that the drains hand turns off rather than finish
    # them; and the client-driven resume of the seed, not the replicas' own.
    monkeypatch.setenv("TETHER_DRAIN_GRACE", "0.2")
    monkeypatch.setenv("TETHER_TAKEOVER", "false")
    # The drained replica comes back only after longer than a whole answer
    # takes (120 chunks at 20/s), as a loaded machine may make it: the turns
    # must be in no replica's hands meanwhile, or they end before the second
    # drain.
    _slow_first_restart(monkeypatch, seconds=7.0)
    report = _crash_test(
        slower_project, tmp_path / "report.json",
        "--fault", "rolling-deploy", "--rounds", "1", "--conversations", "2", "--seed", "5",
    )  # fmt: skip
    for entry in report["results"]:
        assert entry["final_status"] == "done"
        # Resumed on the second replica with an empty body, then again once that
        # one was drained too: the answer is still the crash-free one.
        assert entry["path"].split(">").count("resume") >= 2, entry["path"]
        assert any(note.startswith("drained") for note in entry["notes"]), entry["notes"]
        replicas = [reader["replica"] for reader in entry["readers"]]
        assert len(set(replicas)) == 2 and replicas[0] == replicas[-1]


@pytest.mark.processes
def test_with_no_client_recovering_every_turn_still_ends_as_the_crash_free_run(
    fast_project: Path, tmp_path: Path
) -> None:
    """Unattended rounds: the producer is SIGKILLed, the client hangs up, and
    nobody attaches again, resumes or asks; only a second device, attached
    through the survivor before the kill, watches the turn finish."""
    report = _crash_test(
        fast_project, tmp_path / "report.json",
        "--fault", "unattended", "--rounds", "2", "--conversations", "2", "--seed", "7",
    )  # fmt: skip
    for entry in report["results"]:
        assert entry["final_status"] == "done"
        assert entry["path"] == "unattended>witness:done", entry["path"]
        # The witness, a follower on the survivor, never saw its text shrink.
        assert entry["rewound_characters"] == 0 and entry["violations"] == []
        assert [reader["kind"] for reader in entry["readers"]] == ["start", "witness"]
        # The replicas hold presence locks (SQLite: an flock each), so the
        # survivor knows the killed producer dead before its heartbeat is old
        # enough to say so.
        assert entry["before_threshold"] is True, entry
        assert entry["dead_to_new_content_s"] is None
    assert report["summary"]["by_fault"]["unattended"]["before_threshold"] == len(report["results"])


@pytest.mark.processes
def test_a_second_message_over_a_killed_producers_turn_keeps_the_conversation_whole(
    fast_project: Path, tmp_path: Path
) -> None:
    """Queue rounds: a second message with a drawn multitask strategy goes
    through the survivor just before or after the producer is SIGKILLed; the
    conversation is checked as a whole (alternation, one verdict heard and
    kept per turn, crash-free answers, each strategy's promise, no text
    shown and taken back)."""
    report = _crash_test(
        fast_project, tmp_path / "report.json",
        "--fault", "queue", "--rounds", "3", "--conversations", "2", "--seed", "5",
    )  # fmt: skip
    assert {entry["variant"] for entry in report["results"]} >= {"enqueue", "interrupt"}
    for entry in report["results"]:
        assert entry["fault"] == "queue"
        assert all("0 characters rewound" in note for note in entry["notes"]), entry["notes"]


@pytest.mark.processes
def test_an_erase_while_a_killed_turn_is_taken_over_leaves_nothing(
    fast_project: Path, tmp_path: Path
) -> None:
    """Erase rounds: the producer is SIGKILLed and its conversations erased
    through the survivor while the survivor takes their turns over; after
    each erase returned, no replica serves anything of them (transcript,
    status, the turn's stream) and the stores hold nothing, then and after
    the takeover window."""
    report = _crash_test(
        fast_project, tmp_path / "report.json",
        "--fault", "erase", "--rounds", "2", "--conversations", "2", "--seed", "6",
    )  # fmt: skip
    for entry in report["results"]:
        assert entry["fault"] == "erase"
        assert entry["final_status"] == "erased"


@pytest.mark.processes
def test_a_cancel_as_the_answer_ends_leaves_one_consistent_verdict(
    fast_project: Path, tmp_path: Path
) -> None:
    report = _crash_test(
        fast_project, tmp_path / "report.json",
        "--fault", "cancel-at-end", "--rounds", "2", "--conversations", "2", "--seed", "5",
    )  # fmt: skip
    for entry in report["results"]:
        assert entry["final_status"] in ("done", "cancelled")
        assert entry["path"].startswith("cancel:")


@pytest.mark.processes
def test_a_kill_inside_a_tool_call_runs_a_write_at_most_once(
    fast_project: Path, tmp_path: Path
) -> None:
    """Tool rounds: the producer is SIGKILLed while every turn's call of a
    ``fail`` tool (send_note, a write) or a ``retry`` tool (the calculator, a
    read) is held inside the tool, after its start was checkpointed. The runs
    are counted outside the servers, in the tool-call ledger."""
    report_file = tmp_path / "report.json"
    # Seed 1 draws a round cut off in a write, then one cut off in a read.
    result = CliRunner().invoke(
        app,
        [
            "crash-test", str(fast_project), "--fault", "tool", "--rounds", "2",
            "--conversations", "2", "--seed", "1", "--json", str(report_file),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "tool calls (ledger)" in result.output
    report = json.loads(report_file.read_text())
    assert report["violations"] == 0 and report["turns_passed"] == report["turns"] == 4
    assert report["settings"]["tool_agent"] == "note-writer"
    results = report["results"]
    assert [entry["variant"] for entry in results] == ["fail", "fail", "retry", "retry"]
    for entry in results:
        assert (entry["fault"], entry["point"]) == ("tool", f"in {entry['variant']} tool call")
        assert entry["final_status"] == "done" and entry["error"] is None
        calls = {call["tool"]: call for call in entry["tool_calls"]}
        read, write = calls["calculator"], calls["send_note"]
        assert (read["call"], read["on_unknown"], write["call"], write["on_unknown"]) == (
            0, "retry", 1, "fail",
        )  # fmt: skip
        if entry["variant"] == "fail":
            # Cut off: run once, never again, and the model was told so.
            assert (write["attempts"], write["cut_off"], write["shown"]) == ([1], True, "unknown")
            # Completed before the kill: not run again.
            assert (read["attempts"], read["cut_off"], read["shown"]) == ([1], False, "completed")
        else:
            # Cut off, and run again with the same key: attempt 2.
            assert (read["attempts"], read["cut_off"], read["shown"]) == ([1, 2], True, "completed")
            assert (write["attempts"], write["cut_off"], write["shown"]) == (
                [1],
                False,
                "completed",
            )
    counts = report["summary"]["tool_calls"]
    assert counts == {
        "turns": 4,
        "calls": 8,
        "runs": 10,
        "cut_off_at_most_once": 2,
        "cut_off_at_most_once_ran_once": 2,
        "cut_off_at_most_once_shown_unknown": 2,
        "cut_off_retry": 2,
        "cut_off_retry_ran_again": 2,
        "at_most_once_ran_twice": 0,
        "completed_ran_again": 0,
    }


def test_tool_rounds_need_the_tool_agent(tmp_path: Path) -> None:
    project = _fast_project(tmp_path / "project")
    result = CliRunner().invoke(
        app, ["crash-test", str(project), "--fault", "tool", "--tool-agent", "nobody"]
    )
    assert result.exit_code == 2
    assert "'nobody'" in result.output


def test_the_long_agent_must_be_one_the_project_defines(tmp_path: Path) -> None:
    project = _fast_project(tmp_path / "project")
    result = CliRunner().invoke(app, ["crash-test", str(project), "--agent", "nobody"])
    assert result.exit_code == 2
    assert "--agent 'nobody'" in result.output
    assert "pydantic-writer" in result.output  # the agents it does define are named


@pytest.mark.processes
@pytest.mark.parametrize("fault", ["kill", "pause-in-write"])
def test_the_seed_wiring_without_a_conversation_store(
    fast_project: Path, tmp_path: Path, fault: str
) -> None:
    report = _crash_test(
        fast_project, tmp_path / "report.json", "--without", "conversation",
        "--fault", fault, "--rounds", "1", "--conversations", "2", "--seed", "11",
    )  # fmt: skip
    assert report["settings"]["without"] == ["conversation"]
    assert "transcript" not in report["settings"]["pause_in"]
    for entry in report["results"]:
        assert entry["final_status"] == "done"
        assert entry["path"].endswith(("resume", "attach")), entry["path"]


def test_only_the_conversation_store_can_be_left_out() -> None:
    result = CliRunner().invoke(app, ["crash-test", "--without", "state", "--rounds", "1"])
    assert result.exit_code == 2
    assert "only conversation" in result.output


async def test_crash_free_runs_stream_a_bounded_number_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both agents' crash-free runs share one HTTP client of 100 connections:
    each agent's stay within ``CRASH_FREE_AT_ONCE`` (all at once, a 1,000-turn
    run's 80 prompts per agent exhausted the client's pool)."""
    running = 0
    most = 0
    release = asyncio.Event()

    async def run(api: Any, cluster: Any, prompt: str, number: int, *, within: float) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == reference.CRASH_FREE_AT_ONCE:
            release.set()  # as many as may run at once are running: let them end
        await release.wait()
        running -= 1
        return reference._Run(prompt, f"m{number}", [], TurnShape(1, 1.0, None))

    class Counting:
        def tool_runs(self) -> int:
            return 0

    monkeypatch.setattr(reference, "_run", run)
    prompts = [f"prompt {n}" for n in range(3 * reference.CRASH_FREE_AT_ONCE)]
    references, _ = await reference.crash_free_runs(
        cast(Any, None), cast(Any, Counting()), prompts, within=1.0
    )
    assert len(references) == len(prompts)
    assert most == reference.CRASH_FREE_AT_ONCE


def test_the_replicas_run_without_fair_limits_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """One requester runs ``--conversations`` turns at once on one replica (20
    in the README's runs): with the fair limits' defaults (8 a requester) the
    ninth was a 429 and the run broke off. A limit the environment sets holds."""
    monkeypatch.delenv("TETHER_MAX_TURNS_PER_REQUESTER", raising=False)
    monkeypatch.setenv("TETHER_MAX_TURNS_PER_TENANT", "100")
    env = inherited_env()
    assert env["TETHER_MAX_TURNS_PER_REQUESTER"] == "0"
    assert env["TETHER_MAX_TURNS_PER_TENANT"] == "100"
