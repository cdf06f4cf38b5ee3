"""The TypeScript client (``clients/typescript``) under Node's own test runner.

The Node tests are the client's; this module gives them what they need: the
package's dev dependencies (``npm ci``, once), and real ``tether serve``
replicas on one store, named to the tests in ``TETHER_TEST_REPLICAS`` (JSON:
name, url, pid; a test SIGKILLs a replica by its pid at the point it chooses).
Node's output is shown when a test fails. Without Node (20 or newer) these
tests skip, saying how to get it; with ``TETHER_REQUIRE_SERVICES=1`` they fail.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from fastapi import FastAPI

from tests.support.node import node_and_npm
from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tests.support.services import missing
from tether.api.routers import web
from tether.cli.server_app import example_project_dir
from tether.crashtest.cluster import Cluster

CLIENT = Path(__file__).resolve().parents[1] / "clients" / "typescript"
STATIC = Path(web.__file__).resolve().parents[2] / "web" / "static"
NODE_TIMEOUT = 360.0


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    """Node, with the client's dev dependencies installed (TypeScript, for the
    type check). One install at a time: test workers share the directory."""
    executable, _ = node_and_npm()
    with open(CLIENT / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # npm's record of what node_modules holds: missing, or older than the
        # lockfile (a dependency changed since), means install again.
        installed_lock = CLIENT / "node_modules" / ".package-lock.json"
        lockfile = CLIENT / "package-lock.json"
        if not installed_lock.exists() or installed_lock.stat().st_mtime < lockfile.stat().st_mtime:
            installed = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund"],
                cwd=CLIENT,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if installed.returncode != 0:
                missing(
                    "npm ci failed in clients/typescript (is the npm registry reachable?):\n"
                    + installed.stdout
                    + installed.stderr
                )
    yield executable


def _run_node(node: str, files: list[str], env: dict[str, str] | None = None) -> None:
    """Run the Node test files (one after another) and fail with their report."""
    run = subprocess.run(
        [node, "--test", "--test-concurrency=1", "--test-reporter=spec", *files],
        cwd=CLIENT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, f"node --test {' '.join(files)} failed:\n{report}"
    # A test or suite that skipped (a suite skips when no replicas are named
    # to it) would pass having tested nothing.
    skipped = re.search(r"^\S* ?skipped (\d+)$", report, re.MULTILINE)
    assert skipped is not None and skipped.group(1) == "0", report
    assert "# no replicas" not in report, report


def _replicas_env(cluster: Cluster, tool_log: Path) -> dict[str, str]:
    replicas = [
        {"name": replica.name, "url": replica.url, "pid": replica.process.pid}
        for replica in cluster.replicas
        if replica.process is not None
    ]
    return {"TETHER_TEST_REPLICAS": json.dumps(replicas), "TETHER_TEST_TOOL_LOG": str(tool_log)}


def _cluster(tmp_path: Path, size: int, env: dict[str, str]) -> tuple[Cluster, Path]:
    # 120 chunks at 40/s: a 3 s answer, long enough to cut, kill or cancel
    # mid-way; the writer calls its calculator after 5 chunks.
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=120, tool_call_after_chunks=5
    )
    tool_log = tmp_path / "calculator.log"
    cluster = Cluster(
        project,
        f"sqlite:///{tmp_path}/tether.db",
        size=size,
        workdir=tmp_path,
        env={"TETHER_TEST_TOOL_LOG": str(tool_log), **env},
    )
    return cluster, tool_log


def test_the_client_type_checks_and_parses_without_a_server(node: str) -> None:
    """tsc --noEmit (strict, checkJs) passes, the committed declarations are
    the sources' own, the code is formatted, the SSE parser and every
    status's error class hold, and retries back off with jitter."""
    _run_node(
        node,
        [
            "test/types.test.js",
            "test/format.test.js",
            "test/sse.test.js",
            "test/errors.test.js",
            "test/retry.test.js",
        ],
    )


@pytest.mark.processes
@pytest.mark.timeout(NODE_TIMEOUT + 60)
async def test_the_client_against_replicas_that_take_over(node: str, tmp_path: Path) -> None:
    """Three replicas as deployed (automatic takeover on): turns, a load
    balancer's cut, a new turn's lost answer, typed refusals, cancel,
    conversations, and a producer SIGKILLed mid-answer (r3, which only that
    test uses)."""
    cluster, tool_log = _cluster(tmp_path, 3, {})
    async with cluster:
        files = [
            "test/turns.test.js",
            "test/lost.test.js",
            "test/refusals.test.js",
            "test/cancel.test.js",
            "test/conversations.test.js",
            "test/takeover.test.js",
        ]
        env = _replicas_env(cluster, tool_log)
        try:
            await asyncio.to_thread(_run_node, node, files, env)
        except AssertionError:
            for replica in cluster.replicas:
                print(f"--- {replica.name}\n{replica.log_tail()}")
            raise


@pytest.mark.processes
@pytest.mark.timeout(NODE_TIMEOUT + 60)
async def test_the_client_resumes_where_no_replica_takes_over(node: str, tmp_path: Path) -> None:
    """With automatic takeover off the client's own resume carries a dead
    turn on; a resume that loses the race (409) attaches instead."""
    cluster, tool_log = _cluster(tmp_path, 3, {"TETHER_TAKEOVER": "false"})
    async with cluster:
        env = _replicas_env(cluster, tool_log)
        try:
            await asyncio.to_thread(_run_node, node, ["test/resume.test.js"], env)
        except AssertionError:
            for replica in cluster.replicas:
                print(f"--- {replica.name}\n{replica.log_tail()}")
            raise


@pytest.mark.processes
@pytest.mark.timeout(NODE_TIMEOUT + 60)
async def test_the_client_queues_interrupts_and_follows_queued_turns(
    node: str, tmp_path: Path
) -> None:
    """Double texting against three replicas: turns queued behind a running
    one (``enqueue``) run in order, a queued one is cancelled, followed from
    a second screen, and recovered when the replica its stream waited on is
    SIGKILLed (r3); ``interrupt`` starts at once."""
    cluster, tool_log = _cluster(tmp_path, 3, {})
    async with cluster:
        env = _replicas_env(cluster, tool_log)
        try:
            await asyncio.to_thread(_run_node, node, ["test/queue.test.js"], env)
        except AssertionError:
            for replica in cluster.replicas:
                print(f"--- {replica.name}\n{replica.log_tail()}")
            raise


@pytest.mark.processes
@pytest.mark.timeout(NODE_TIMEOUT + 60)
async def test_the_client_reads_deltas_and_never_goes_backwards(node: str, tmp_path: Path) -> None:
    """Two replicas: the client's streams are delta-mode and its messages
    whole; an answer that goes backwards (the rewinder agent, staged by the
    test) is not shown, and the updates dropped are counted."""
    cluster, tool_log = _cluster(tmp_path, 2, {})
    async with cluster:
        env = _replicas_env(cluster, tool_log)
        try:
            await asyncio.to_thread(_run_node, node, ["test/delta.test.js"], env)
        except AssertionError:
            for replica in cluster.replicas:
                print(f"--- {replica.name}\n{replica.log_tail()}")
            raise


async def test_the_chat_page_imports_the_clients_own_modules() -> None:
    """One implementation: the page's modules import the package's, which
    ``tether serve`` serves from the Python package (no Node needed)."""
    sources = {path.name for path in (CLIENT / "src").glob("*.js")}
    app = FastAPI()
    app.include_router(web.router)
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://page"
    ) as http:
        for name in sorted(sources):
            response = await http.get(f"/static/client/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"].startswith("text/javascript")
            assert "Content-Security-Policy" in response.headers
            assert response.text == (CLIENT / "src" / name).read_text(encoding="utf-8")
        for name in ("package.json", "..%2Fpackage.json", "nothing.js"):
            assert (await http.get(f"/static/client/{name}")).status_code == 404, name
    # Every relative import of the page's modules names a module that is served.
    for module in STATIC.glob("*.js"):
        for target in re.findall(r'from "\./([^"]+)"', module.read_text(encoding="utf-8")):
            folder, _, name = target.rpartition("/")
            served = sources if folder == "client" else {p.name for p in STATIC.glob("*.js")}
            assert name in served, f"{module.name} imports ./{target}"
    page = {path.name for path in STATIC.glob("*.js")}
    assert not page & sources, "no module of the client is copied into the page"


def _quick_start_snippet() -> str:
    """The quick start's TypeScript client snippet (docs/getting-started.md,
    the page the README's quick start continues on), as it is printed."""
    page = (CLIENT.parents[1] / "docs" / "getting-started.md").read_text(encoding="utf-8")
    quick_start = page.split("# Quick start", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```js\n(.*?)```", quick_start, re.DOTALL)
    return snippet


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_the_quick_start_snippet_runs_in_a_fresh_npm_project(tmp_path: Path) -> None:
    """As the quick start (docs/getting-started.md) says: `npm init -y`, install the client from the
    checkout (no registry), save the snippet as `quickstart.mjs`, run it
    against a server. Only the server's address is changed."""
    node, npm = node_and_npm()
    project = tmp_path / "fresh"
    project.mkdir()
    for command in ([npm, "init", "-y"], [npm, "install", "--no-audit", "--no-fund", str(CLIENT)]):
        done = subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    # A default project is CommonJS (no "type", or npm's own "commonjs"): a
    # `.js` file there cannot use `import`, which is why the quick start says `.mjs`.
    assert json.loads((project / "package.json").read_text()).get("type", "commonjs") == "commonjs"
    server = ServerProcess(example_project_dir(), log_path=tmp_path / "server.log").start(40)
    try:
        snippet = _quick_start_snippet()
        assert "http://127.0.0.1:8000" in snippet
        script = snippet.replace("http://127.0.0.1:8000", server.url)
        (project / "quickstart.mjs").write_text(script)
        run = subprocess.run(
            [node, "quickstart.mjs"], cwd=project, capture_output=True, text=True, timeout=120
        )
    finally:
        server.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    # One print per message of the answer as it grows (long-writer: 200 chunks).
    assert len(run.stdout.splitlines()) > 10, run.stdout
