"""A real load balancer: HAProxy (Debian's package) on loopback in front of three replicas.

The client is given one URL, HAProxy's, and the replica streaming its answer
is SIGKILLed mid-answer: the client recovers through the load balancer by
itself (HAProxy's health checks on ``/probes/ready`` take the dead replica
out, its retries send a refused connection elsewhere) and yields the complete
answer, as a crash-free run gives it. Then the crash test runs its rounds
through the load balancer (``--via-load-balancer``), the client doing every
recovery.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx2
import pytest
from typer.testing import CliRunner

from tests.support.haproxy import require_haproxy
from tests.support.metrics import scrape
from tests.support.node import node_and_npm
from tests.support.project import make_project
from tether.cli.main import app
from tether.cli.server_app import example_project_dir
from tether.client import TetherClient, TurnUpdate
from tether.crashtest.cluster import Cluster
from tether.crashtest.load_balancer import PIN_HEADER, SERVER_HEADER

pytestmark = [pytest.mark.processes, pytest.mark.timeout(150)]

PROMPT = "Tell me about rivers and the towns along them."


@pytest.fixture(autouse=True)
def haproxy() -> str:
    return require_haproxy()


async def test_the_load_balancer_balances_pins_and_streams_without_buffering(
    tmp_path: Path,
) -> None:
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=40, tool_call_after_chunks=None
    )
    cluster = Cluster(
        project, f"sqlite:///{tmp_path}/tether.db", size=3, workdir=tmp_path, load_balancer=True
    )
    async with cluster, httpx2.AsyncClient(timeout=10) as http:
        front = cluster.front_url
        assert front is not None
        served = [
            (await http.get(f"{front}/probes/ready")).headers[SERVER_HEADER] for _ in range(6)
        ]
        assert sorted(served) == ["r1", "r1", "r2", "r2", "r3", "r3"]  # round-robin
        pinned = await http.get(f"{front}/probes/ready", headers={PIN_HEADER: "r2"})
        assert pinned.headers[SERVER_HEADER] == "r2"

        # Each message reaches the client as the server sends it (its delta-mode
        # stream: at most one every 0.125 s), not in batches: HAProxy holds
        # nothing back.
        async with TetherClient(front, tenant="t", requester_uuid="ivy") as client:
            arrivals = []
            async for _ in client.stream(agent_identifier="plain", message=PROMPT):
                arrivals.append(time.monotonic())
        gaps = sorted(b - a for a, b in pairwise(arrivals))
        assert gaps[len(gaps) // 2] < 0.25, gaps


async def test_the_client_recovers_through_the_load_balancer_while_its_replica_is_killed(
    tmp_path: Path,
) -> None:
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=160, tool_call_after_chunks=None
    )
    cluster = Cluster(
        project, f"sqlite:///{tmp_path}/tether.db", size=3, workdir=tmp_path, load_balancer=True
    )
    async with cluster:
        assert cluster.front is not None
        async with TetherClient(cluster.front.url, tenant="t", requester_uuid="jo") as client:
            reference = await client.stream(agent_identifier="plain", message=PROMPT).answer()
            assert reference is not None

            updates: list[TurnUpdate] = []
            killed = None
            async with client.stream(agent_identifier="plain", message=PROMPT) as turn:
                async for update in turn:
                    updates.append(update)
                    if len(updates) == 10:
                        # The load balancer says which replica streams the answer.
                        name = turn.connections[0].headers[SERVER_HEADER.lower()]
                        killed = next(r for r in cluster.replicas if r.name == name)
                        killed.send(signal.SIGKILL)
            assert killed is not None
            states = await cluster.front.states()
    assert states[killed.name].startswith("DOWN"), states
    assert turn.outcome == "done" and turn.recovered, turn.path
    indexes = [u.index for u in updates]
    assert all(i is not None for i in indexes)
    assert all(a < b for a, b in pairwise(i for i in indexes if i is not None)), indexes
    assert len({u.event_id for u in updates}) == len(updates)
    assert updates[-1].content == reference.content
    # Every connection after the kill was served by a surviving replica.
    recovered_by = {c.headers.get(SERVER_HEADER.lower()) for c in turn.connections[1:]}
    assert recovered_by and killed.name not in recovered_by, turn.connections


TYPESCRIPT_CLIENT = Path(__file__).resolve().parents[1] / "clients/typescript/src/index.js"
FOLLOW_SCRIPT = """
import { TetherClient } from %s;
const [url, prompt] = process.argv.slice(2);
const client = new TetherClient({ urls: [url], tenant: "t", user: "ts" });
const turn = await client.startTurn({ agent: "plain", content: prompt });
for await (const event of turn.events()) console.log(JSON.stringify(event));
"""


async def test_the_typescript_client_recovers_through_the_load_balancer_while_its_replica_is_killed(
    tmp_path: Path,
) -> None:
    """The same as above with the TypeScript client under Node: one URL,
    HAProxy's; the producing replica SIGKILLed after 20 messages."""
    node, _ = node_and_npm()
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=160, tool_call_after_chunks=None
    )
    cluster = Cluster(
        project, f"sqlite:///{tmp_path}/tether.db", size=3, workdir=tmp_path, load_balancer=True
    )
    script = tmp_path / "follow.mjs"
    script.write_text(FOLLOW_SCRIPT % json.dumps(str(TYPESCRIPT_CLIENT)))
    async with cluster:
        front = cluster.front
        assert front is not None
        async with TetherClient(front.url, tenant="t", requester_uuid="ts") as client:
            reference = await client.stream(agent_identifier="plain", message=PROMPT).answer()
        assert reference is not None
        process = await asyncio.create_subprocess_exec(
            node, str(script), front.url, PROMPT, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        events: list[dict[str, Any]] = []
        killed = None
        async with asyncio.timeout(90):
            async for line in process.stdout:
                events.append(json.loads(line))
                messages = [e for e in events if e["type"] == "message"]
                if killed is None and len(messages) == 20:
                    # The one replica producing a turn now.
                    producing = [
                        r for r in cluster.replicas if scrape(r.url).value("tether_turns_in_flight")
                    ]
                    assert len(producing) == 1, producing
                    killed = producing[0]
                    killed.send(signal.SIGKILL)
            assert await process.wait() == 0
    assert killed is not None
    kinds = [e["type"] for e in events]
    assert "recovering" in kinds, kinds
    assert events[-1] == {"type": "end", "reason": "done", "error": None}, events[-1]
    messages = [e for e in events if e["type"] == "message"]
    indexes = [m["index"] for m in messages if m["index"] is not None]
    assert all(a < b for a, b in pairwise(indexes)), indexes
    ids = [m["eventId"] for m in messages if m["eventId"] is not None]
    assert len(set(ids)) == len(ids)
    assert messages[-1]["message"]["content"] == reference.content


def _fast_project(directory: Path) -> Path:
    """The example project, its long agent at 40 chunks a second for 80 chunks."""
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


def test_the_crash_test_runs_its_rounds_through_the_load_balancer(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    started = time.monotonic()
    result = CliRunner().invoke(
        app,
        [
            "crash-test", str(_fast_project(tmp_path / "project")), "--replicas", "3",
            "--rounds", "2", "--conversations", "3", "--fault", "kill",
            "--via-load-balancer", "--seed", "7", "--json", str(report_file),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "through HAProxy" in result.output
    report: dict[str, Any] = json.loads(report_file.read_text())
    assert report["settings"]["via_load_balancer"] is True
    assert report["violations"] == 0
    assert report["turns_passed"] == report["turns"] == 6
    assert report["passed"] == report["rounds"] == 2
    assert time.monotonic() - started < 120


async def test_a_replica_restarted_on_a_new_port_is_balanced_again(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project", chunks_per_second=400, answer_chunks=10)
    cluster = Cluster(
        project, f"sqlite:///{tmp_path}/tether.db", size=2, workdir=tmp_path, load_balancer=True
    )
    async with cluster, httpx2.AsyncClient(timeout=10) as http:
        assert cluster.front is not None
        first = cluster.replicas[0]
        old_port = first.port
        first.send(signal.SIGKILL)
        assert await asyncio.to_thread(first.process.wait, 10) is not None
        await first.start()  # a fresh port; the cluster moves the server there
        assert first.port != old_port
        assert (await cluster.front.states())[first.name] == "UP"
        pinned = await http.get(f"{cluster.front.url}/probes/ready", headers={PIN_HEADER: "r1"})
        assert pinned.status_code == 200 and pinned.headers[SERVER_HEADER] == "r1"
