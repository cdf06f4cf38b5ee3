"""A tool call cut off by SIGKILL, with real replicas: at most once unless the tool
says retry.

The ``calls-*`` agents of the test project call one tool, which SIGKILLs its own
replica in the middle of the call's first attempt (after logging the run). The
other replica takes the turn over by itself. The writing tool (``send_note``,
``on_unknown="fail"`` by default) is not run again, and the model is told the
call may or may not have happened; the reading tool (``fetch_note``,
``read_only=True``, so ``retry``) runs again with the same idempotency key.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.project import make_project
from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster

pytestmark = [pytest.mark.processes, pytest.mark.timeout(90)]


async def _cut_off_call(tmp_path: Path, agent: str) -> tuple[dict[str, Any], list[str]]:
    """Run one turn of ``agent`` whose tool kills its producer; the answer it
    ends with (on the survivor) and the tool's runs ("NAME KEY#ATTEMPT")."""
    project = make_project(tmp_path / "project", chunks_per_second=40, answer_chunks=20)
    runs = tmp_path / "runs.log"
    env = {"TETHER_TEST_TOOL_LOG": str(runs)}
    cluster = Cluster(project, f"sqlite:///{tmp_path}/tether.db", size=2, workdir=tmp_path, env=env)
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, agent)
        producer, survivor = cluster.replicas
        session = f"s-{uuid.uuid4().hex[:10]}"
        reader = api.start_turn(producer.url, producer.name, "Please send it.", session)
        assert await reader.ended(30)
        await reader.aclose()
        # The tool killed its replica in the middle of the call.
        assert await producer.wait_exit(10) is not None, producer.log_tail()
        status = None
        async with asyncio.timeout(30):
            while status is None or status.status in ("running", "dead"):
                status = await api.status(survivor.url, session)
                await asyncio.sleep(0.1)  # polling the verdict, not synchronizing on time
        assert status.status == "done", status
        transcript = await api.transcript(survivor.url, session)
        assert transcript is not None
        lines = runs.read_text().splitlines() if runs.exists() else []
        return transcript[-1], [" ".join(line.split()[1:]) for line in lines]


def _tool_part(answer: dict[str, Any]) -> dict[str, Any]:
    [tool] = [p["tool"] for p in answer["content_parts"] if p["tool"] is not None]
    return dict(tool)


async def test_a_writing_tool_cut_off_by_a_kill_never_runs_twice(tmp_path: Path) -> None:
    answer, runs = await _cut_off_call(tmp_path, "calls-send_note")
    assert len(runs) == 1 and runs[0].startswith("send_note ") and runs[0].endswith(":0#1")
    tool = _tool_part(answer)
    assert tool["status"] == "error"
    assert "may or may not have happened" in str(tool["response"])
    # The model was told so, and its answer says what it was told.
    assert "may or may not have happened" in answer["content"]


async def test_a_reading_tool_cut_off_by_a_kill_runs_again_with_the_same_key(
    tmp_path: Path,
) -> None:
    answer, runs = await _cut_off_call(tmp_path, "calls-fetch_note")
    assert [run.split()[0] for run in runs] == ["fetch_note", "fetch_note"]
    keys = [run.split()[1] for run in runs]
    assert keys[0].endswith("#1") and keys[1].endswith("#2")
    assert keys[0].split("#")[0] == keys[1].split("#")[0]  # one call, one key
    tool = _tool_part(answer)
    assert (tool["status"], tool["response"]) == ("completed", "fetch_note done")
