"""``tether crash-test``: real replicas under real signals, and a checker that can fail.

The process tests run the command itself on a copy of the example project whose
long agent streams fast (80 chunks at 40/s, the calculator after 5), so that a
round takes seconds. The unit tests feed the invariant checker doctored evidence
and show that each invariant catches what it is for.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tether.cli.main import app
from tether.cli.server_app import example_project_dir
from tether.crashtest.client import StreamStatus
from tether.crashtest.faults import FaultChoice, FaultKind, FaultPoint, TurnShape, plan_fault
from tether.crashtest.invariants import (
    Expected,
    FenceEvidence,
    Observed,
    ReaderTrace,
    SeenEvent,
    Snapshot,
    check_round,
    normalize_all,
)

PROMPT = "Tell me about rivers and the towns along them."
BREAK = 5000


def _fast_project(directory: Path) -> Path:
    shutil.copytree(example_project_dir(), directory)
    setups_file = directory / "agents" / "agent_setups.json"
    setups = json.loads(setups_file.read_text())
    for setup in setups:
        if setup["agent_identifier"] == "long-writer":
            setup["agent_configuration"]["llm"].update(
                chunks_per_second=40, answer_chunks=80, tool_call_after_chunks=5
            )
    setups_file.write_text(json.dumps(setups, indent=2))
    return directory


@pytest.fixture(scope="module")
def fast_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fast_project(tmp_path_factory.mktemp("crash") / "project")


@pytest.mark.processes
@pytest.mark.parametrize(("fault", "rounds"), [("kill", 3), ("stop", 2), ("term", 2)])
def test_the_command_recovers_every_round_with_no_violation(
    fast_project: Path, tmp_path: Path, fault: str, rounds: int
) -> None:
    report_file = tmp_path / "report.json"
    result = CliRunner().invoke(
        app,
        [
            "crash-test", str(fast_project), "--fault", fault, "--rounds", str(rounds),
            "--seed", "7", "--json", str(report_file),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "rounds passed" in result.output

    report = json.loads(report_file.read_text())
    assert (report["rounds"], report["passed"], report["violations"]) == (rounds, rounds, 0)
    assert len(report["results"]) == rounds
    summary = report["summary"]
    assert summary["recovery_latency_s"]["max"] is not None
    assert summary["inter_message_gap_s"]["p50"] is not None
    for entry in report["results"]:
        assert entry["passed"] and entry["fault"] == fault and entry["violations"] == []
        assert entry["tool_runs"] == entry["expected_tool_runs"] == 1
        assert entry["path"] != "-"
        if fault == "kill":
            # The client had to take the turn over: nobody else was producing it.
            assert entry["path"].endswith("resume")
        if fault == "stop":
            fence = entry["fence"]
            assert fence["epoch_of_new_owner"] > fence["epoch_before_fault"]
            assert fence["old_readers_heard"] == ["gone"]


@pytest.mark.parametrize("option", ["--store", "--stream-store"])
def test_memory_store_is_refused(option: str) -> None:
    result = CliRunner().invoke(app, ["crash-test", option, "memory://", "--rounds", "1"])
    assert result.exit_code == 2
    assert "memory://" in result.output


# ---------------------------------------------------------------- the checker


def _bot(content: str, *, tool_status: str = "completed") -> dict[str, Any]:
    return {
        "sender": "bot",
        "content": content,
        "message_id": "m",
        "session_id": "s",
        "content_parts": [
            {"type": "text", "text": content},
            {
                "type": "tool",
                "tool": {"tool_call_id": "c1", "name": "calculator", "status": tool_status},
            },
        ],
    }


def _user() -> dict[str, Any]:
    return {"sender": "user", "content": PROMPT, "message_id": "m-user", "session_id": "s"}


ANSWER = "The calculator says 2 + 2 = 4. The river follows the road."
EXPECTED = Expected(PROMPT, normalize_all([_user(), _bot(ANSWER)]), tool_runs=1)


def _sound_round() -> Observed:
    """A killed-and-resumed round as it should look: the start reader, then a
    resume whose indexes begin past anything seen, restarting from a checkpoint."""
    start = ReaderTrace(
        "start",
        tuple(SeenEvent(i, _bot(ANSWER[: 10 + i], tool_status="running")) for i in range(5)),
        consumed=5,
    )
    resume = ReaderTrace(
        "resume",
        (SeenEvent(10_003, _bot(ANSWER[:12])), SeenEvent(10_004, _bot(ANSWER))),
        consumed=2,
    )
    return Observed(
        transcript=[_user(), {**_bot(ANSWER), "message_id": "other"}],
        final_status=StreamStatus("m", "done", 2, "t"),
        tool_runs=1,
        readers=[start, resume],
        final_streamed=_bot(ANSWER),
    )


def _invariants(observed: Observed) -> set[str]:
    return {v.invariant for v in check_round(EXPECTED, observed, producer_break=BREAK)}


def test_the_checker_passes_a_sound_round() -> None:
    assert check_round(EXPECTED, _sound_round(), producer_break=BREAK) == []


def test_the_checker_catches_a_duplicated_user_message() -> None:
    observed = _sound_round()
    assert observed.transcript is not None
    observed.transcript.insert(1, _user())
    assert _invariants(observed) == {"user-message", "transcript"}


def test_the_checker_catches_a_regressing_index() -> None:
    observed = _sound_round()
    start = observed.readers[0]
    events = list(start.events)
    events[3] = SeenEvent(1, events[3].message)
    observed.readers[0] = ReaderTrace(start.label, tuple(events), start.consumed)
    assert _invariants(observed) == {"no-regress"}


def test_the_checker_catches_a_replay_across_readers() -> None:
    observed = _sound_round()
    observed.readers.append(ReaderTrace("attach", (SeenEvent(4, _bot(ANSWER)),), consumed=1))
    assert _invariants(observed) == {"no-regress"}


def test_the_checker_catches_shrinking_content_within_one_producer() -> None:
    observed = _sound_round()
    resume = observed.readers[1]
    shrunk = (SeenEvent(10_003, _bot(ANSWER)), SeenEvent(10_004, _bot(ANSWER[:20])))
    observed.readers[1] = ReaderTrace(resume.label, shrunk, resume.consumed)
    assert _invariants(observed) == {"no-regress"}


def test_the_checker_catches_a_second_tool_execution() -> None:
    observed = _sound_round()
    observed.tool_runs = 2
    assert _invariants(observed) == {"tool-once"}


def test_the_checker_catches_a_different_answer_and_an_unfinished_turn() -> None:
    observed = _sound_round()
    assert observed.transcript is not None
    observed.transcript[-1] = _bot(ANSWER + " And again.")
    observed.final_status = StreamStatus("m", "errored", 2, "t")
    assert _invariants(observed) == {"transcript", "terminal"}


def test_the_checker_catches_a_fenced_producer_that_wrote() -> None:
    observed = _sound_round()
    left = Snapshot(StreamStatus("m", "done", 2, "t1"), EXPECTED.transcript)
    observed.fence = FenceEvidence(
        epoch_before_fault=1,
        left_by_new_owner=left,
        after_continue=Snapshot(StreamStatus("m", "done", 1, "t2"), EXPECTED.transcript),
        old_readers_ended=True,
        recorded_final=_bot(ANSWER),
        recorded_epoch=1,
        checkpoint_epoch=2,
    )
    violations = check_round(EXPECTED, observed, producer_break=BREAK)
    assert {v.invariant for v in violations} == {"fenced"}
    assert len(violations) == 2  # the row changed; the recording carries the old epoch


def test_every_planned_fault_lands_inside_the_turn() -> None:
    rng = random.Random(3)
    shape = TurnShape(messages=200, duration=20.0, tool_message=11)
    plans = [plan_fault(rng, FaultChoice.MIXED, shape, checkpoint_interval=5.0) for _ in range(200)]
    assert {plan.kind for plan in plans} == set(FaultKind)
    assert {plan.point for plan in plans} == set(FaultPoint)
    for plan in plans:
        if plan.after_messages is not None:
            assert 2 <= plan.after_messages <= 170
        if plan.after_seconds is not None:
            assert 4.9 <= plan.after_seconds <= 17.0 + 0.25
    short = TurnShape(messages=80, duration=2.0, tool_message=6)
    for _ in range(50):
        plan = plan_fault(rng, FaultChoice.STOP, short, checkpoint_interval=5.0)
        assert plan.kind is FaultKind.STOP and plan.point is not FaultPoint.CHECKPOINT
