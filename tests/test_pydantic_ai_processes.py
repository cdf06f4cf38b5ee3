"""A PydanticAI agent's turn survives a real SIGKILL of its producer, no client recovering.

Two ``tether serve`` processes share one SQLite store and run the example
project's ``pydantic-writer`` (a ``pydantic_ai.Agent`` on tether's offline
model, paced faster here): it calls the calculator, then streams a long
answer. Its producer is SIGKILLed in the middle of that answer with a
follower attached through the other replica and nobody resuming: the
survivor finds the turn dead, takes it over from its checkpoint (the
PydanticAI history and the tool ledger), and the follower's stream ends
``done`` with the crash-free answer; the calculator ran once for the turn
(every execution is a line in the cluster's tool log).

And ``tether crash-test --fault tool --agent pydantic-note-writer`` passes
its tool rounds: the producer of ``pydantic-note-writer`` (``note-writer`` on
PydanticAI, its tools recording their runs in the crash test's tool-call
ledger) is SIGKILLed inside a write (``on_unknown="fail"``: not run again, shown
as of unknown outcome) and inside a read (``retry``: run again with the same
idempotency key).
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.services import import_or_skip

import_or_skip("pydantic_ai", "install the pydantic-ai extra: make install-dev")

from tether.cli.main import app  # noqa: E402
from tether.cli.server_app import example_project_dir  # noqa: E402
from tether.crashtest.client import TetherAPI  # noqa: E402
from tether.crashtest.cluster import Cluster  # noqa: E402
from tether.crashtest.reader import Received  # noqa: E402

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

AGENT = "pydantic-writer"
PROMPT = "Tell me about rivers. Start by working out 2 * 1001."
EXPRESSION = "2 * 1001"


def _project(directory: Path, agent: str = AGENT, answer_chunks: int = 160) -> Path:
    """The example project, a PydanticAI agent of it paced for a test:
    ``answer_chunks`` at 40 a second, the tools after 5."""
    shutil.copytree(example_project_dir(), directory)
    setups_file = directory / "agents" / "agent_setups.json"
    setups = json.loads(setups_file.read_text())
    (setup,) = [s for s in setups if s["agent_identifier"] == agent]
    setup["agent_configuration"]["llm"].update(
        chunks_per_second=40, answer_chunks=answer_chunks, tool_call_after_chunks=5
    )
    setups_file.write_text(json.dumps(setups, indent=2))
    return directory


def _content(event: Received) -> str:
    return str((event.message or {}).get("content", ""))


def _after_the_result(messages: list[Received]) -> str:
    """The answer's text after its report of the calculator's result ("" before it)."""
    text = _content(messages[-1]) if messages else ""
    return text.partition("The calculator says")[2]


def _tools(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p["tool"] for p in message.get("content_parts") or [] if p.get("type") == "tool"]


async def test_a_killed_producers_pydantic_ai_turn_ends_as_the_crash_free_one(
    tmp_path: Path,
) -> None:
    cluster = Cluster(
        _project(tmp_path / "project"),
        f"sqlite:///{tmp_path}/tether.db",
        size=2,
        workdir=tmp_path,
    )
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, AGENT)
        a, b = cluster.replicas
        crash_free = api.start_turn(b.url, b.name, PROMPT, f"ref-{uuid.uuid4().hex[:8]}")
        assert await crash_free.ended(60) and crash_free.describe_end() == "done"
        reference = crash_free.messages[-1].message or {}
        assert [t["status"] for t in _tools(reference)] == ["completed"]
        assert cluster.tool_runs_by_expression()[EXPRESSION] == 1

        session = f"s-{uuid.uuid4().hex[:10]}"
        direct = api.start_turn(a.url, a.name, PROMPT, session)
        # The calculator's result is shown, and the long answer after it is
        # well under way: the kill lands in the middle of the second response.
        assert await direct.wait_for(lambda r: len(_after_the_result(r.messages)) > 150, 30)
        assert direct.message_id is not None
        follower = api.attach(b.url, b.name, direct.message_id, session)
        assert await follower.wait_for(lambda r: len(r.messages) >= 1, 10)
        assert not direct.done
        a.send(signal.SIGKILL)  # no drain, and no client will resume
        await direct.aclose()

        assert await follower.ended(60), "the follower's stream did not end"
        assert follower.describe_end() == "done", follower.describe_end()
        final = follower.messages[-1].message or {}
        assert final["content"] == reference["content"]
        assert [t["status"] for t in _tools(final)] == ["completed"]
        assert _tools(final)[0]["params"] == {"expression": EXPRESSION}

        # The calculator ran once for the killed turn (and once for the crash-free one).
        assert cluster.tool_runs_by_expression()[EXPRESSION] == 2

        # Shown implies kept: the follower's text only grew across the takeover,
        # and what the killed producer's reader was shown is a prefix of the end.
        contents = [_content(e) for e in follower.messages]
        for before, after in itertools.pairwise(contents):
            assert after.startswith(before), f"the text went from {before!r} to {after!r}"
        assert contents[-1].startswith(_content(direct.messages[-1]))

        status = await api.status(b.url, session)
        assert status is not None and status.status == "done"
        transcript = await api.transcript(b.url, session)
        assert transcript is not None
        assert [m["content"] for m in transcript if m["sender"] == "bot"] == [reference["content"]]


def test_the_crash_tests_tool_rounds_pass_with_a_pydantic_ai_agent(tmp_path: Path) -> None:
    """Two tool rounds of one turn each (seed 2 draws a write, then a read),
    ``--agent`` naming the tool agent as the only agent the rounds run."""
    project = _project(tmp_path / "project", "pydantic-note-writer", answer_chunks=40)
    report_file = tmp_path / "report.json"
    result = CliRunner().invoke(
        app,
        [
            "crash-test", str(project), "--fault", "tool", "--agent", "pydantic-note-writer",
            "--rounds", "2", "--conversations", "1", "--seed", "2", "--json", str(report_file),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(report_file.read_text())
    assert report["settings"]["tool_agent"] == "pydantic-note-writer"
    assert report["violations"] == 0 and report["turns_passed"] == report["turns"] == 2
    assert [entry["variant"] for entry in report["results"]] == ["fail", "retry"]
    for entry in report["results"]:
        assert entry["final_status"] == "done" and entry["error"] is None
        calls = {call["tool"]: call for call in entry["tool_calls"]}
        read, write = calls["calculator"], calls["send_note"]
        assert (read["call"], read["on_unknown"], write["call"], write["on_unknown"]) == (
            0, "retry", 1, "fail",
        )  # fmt: skip
        if entry["variant"] == "fail":
            # Cut off: run once, never again, shown so; the read before it not run again.
            assert (write["attempts"], write["cut_off"], write["shown"]) == ([1], True, "unknown")
            assert (read["attempts"], read["shown"]) == ([1], "completed")
        else:
            # Cut off, run again with the same key; the write after it ran once.
            assert (read["attempts"], read["cut_off"], read["shown"]) == ([1, 2], True, "completed")
            assert (write["attempts"], write["shown"]) == ([1], "completed")
    counts = report["summary"]["tool_calls"]
    assert (counts["at_most_once_ran_twice"], counts["completed_ran_again"]) == (0, 0)
    assert counts["cut_off_at_most_once_shown_unknown"] == counts["cut_off_retry_ran_again"] == 1
