"""A front end built on the AI SDK streams, reconnects and stops against real replicas.

The front end is Node code using the real ``ai`` and ``@ai-sdk/react``
packages from npm (``tests/ai_sdk``: the ``Chat`` that ``useChat`` wraps,
``DefaultChatTransport``, ``readUIMessageStream``), behind a small load
balancer, against two real ``tether serve`` replicas on one SQLite store.
Each test here runs one group of the Node tests by name and then checks,
from the outside, what the group cannot see (how often the tool ran).

Needs Node.js 18 or newer and npm; the packages are installed here with
``npm ci`` from the committed lockfile. Without Node the tests skip; with
``TETHER_REQUIRE_SERVICES=1`` they fail.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.node import node_and_npm
from tests.support.services import missing
from tether.crashtest.cluster import Cluster

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
    # A 4 s answer (120 chunks at 30/s) with one calculator call after 5
    # chunks: long enough to reload, kill or stop mid-answer.
    pytest.mark.replica_cluster(
        crash_test=True,
        chunks_per_second=30,
        answer_chunks=120,
        tool_call_after_chunks=5,
        tool_log=True,
    ),
]

PACKAGE = Path(__file__).parent / "ai_sdk"
PROMPT = "Tell me about rivers and the towns along them."
TENANT = "aisdk"
NODE_TIMEOUT = 180


def _install(npm: str) -> None:
    """``npm ci`` from the lockfile, once per lockfile (a stamp remembers it),
    under a lock: test processes running side by side share ``node_modules``."""
    lock = Path(tempfile.gettempdir()) / "tether-ai-sdk-npm.lock"
    digest = hashlib.sha256(
        (PACKAGE / "package.json").read_bytes() + (PACKAGE / "package-lock.json").read_bytes()
    ).hexdigest()
    stamp = PACKAGE / "node_modules" / ".tether-installed"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == digest:
            return
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=PACKAGE,
            capture_output=True,
            text=True,
            timeout=240,
        )
        if done.returncode != 0:
            missing(
                f"npm ci failed in {PACKAGE} (is the npm registry reachable?):\n"
                f"{done.stdout}\n{done.stderr}"
            )
        stamp.write_text(digest)


@pytest.fixture(scope="module")
def node() -> str:
    path, npm = node_and_npm()
    _install(npm)
    return path


@pytest.fixture(scope="module")
def reference(crash_test_cluster: Cluster) -> str:
    """The answer to PROMPT in a crash-free run, over tether's own API."""
    response = httpx2.post(
        f"{crash_test_cluster.replicas[0].url}/chat/response?tenant={TENANT}",
        headers={"requester-uuid": "reference"},
        json={
            "agent_identifier": "writer",
            "stateful": True,
            "session_id": f"reference-{uuid.uuid4().hex[:8]}",
            "conversation": [{"sender": "user", "content": PROMPT}],
        },
        timeout=60,
    )
    assert response.status_code == 201, response.text
    text = str(response.json()["content"])
    assert len(text) > 1000
    return text


def run_node(node: str, cluster: Cluster, reference: str, group: str) -> str:
    """Run the Node tests whose names start with ``group``; their TAP output."""
    config = {
        "replicas": [
            {"url": r.url, "pid": r.process.pid if r.process else None} for r in cluster.replicas
        ],
        "tenant": TENANT,
        "prompt": PROMPT,
        "reference": reference,
    }
    done = subprocess.run(
        [
            node,
            "--test",
            "--test-reporter=tap",
            f"--test-name-pattern=^{group}:",
            "chat.test.mjs",
        ],
        cwd=PACKAGE,
        env={**os.environ, "TETHER_AI_SDK": json.dumps(config)},
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    output = done.stdout + done.stderr
    logs = "\n".join(f"--- {r.name}\n{r.log_tail()}" for r in cluster.replicas)
    assert done.returncode == 0, f"{output}\n{logs}"
    passed = re.search(r"^# pass (\d+)$", done.stdout, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) > 0, f"no test ran:\n{output}"
    return done.stdout


def test_a_front_end_streams_answers_and_errors(
    node: str, replicas: Cluster, reference: str
) -> None:
    """useChat's Chat streams a whole answer (text, the tool call and its
    result) with the default agent; the wire is the protocol's; an agent's
    failure is the chat's error; nothing to resume is a 204."""
    output = run_node(node, replicas, reference, "stream")
    assert "# pass 3" in output


def test_a_reload_mid_answer_resumes_through_the_other_replica(
    node: str, replicas: Cluster, reference: str
) -> None:
    """The tab closes mid-answer (its fetch aborted: the turn goes on); the
    reloaded page reconnects through the other replica, gets the answer so
    far at once, then the rest, to the same end as a crash-free run."""
    run_node(node, replicas, reference, "reconnect")


def test_a_producer_killed_mid_answer_and_the_answer_completes(
    node: str, replicas: Cluster, reference: str
) -> None:
    """The replica producing the answer is SIGKILLed past its tool call; the
    chat reconnects through the survivor, which took the turn over by
    itself, and ends with the crash-free answer; the tool did not run again."""
    before = replicas.tool_runs()
    producer = replicas.replicas[0]
    run_node(node, replicas, reference, "kill")
    assert producer.process is not None
    assert producer.process.wait(timeout=10) == -signal.SIGKILL
    # One calculator call in the answer, run once: its completed result was
    # checkpointed before the kill, so the takeover did not run it again.
    assert replicas.tool_runs() - before == 1


def test_stop_cancels_the_turn_from_any_replica(
    node: str, replicas: Cluster, reference: str
) -> None:
    """The stop endpoint, called through the other replica, cancels the turn;
    a second screen is told (``abort``); the partial answer is kept."""
    run_node(node, replicas, reference, "stop")


def test_a_drained_replica_tells_the_front_end_to_reconnect(
    replicas: Cluster, reference: str
) -> None:
    """A rolling deploy: SIGTERM on the replica streaming an answer. Its stream
    ends with an error part the front end can act on (``resumeStream()``), and
    the reconnect through the other replica gets the whole answer."""
    one, two = replicas.replicas
    session = f"drain{uuid.uuid4().hex[:10]}"
    headers = {"requester-uuid": "drainer"}
    body = {
        "id": session,
        "trigger": "submit-message",
        "messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": PROMPT}]}],
    }
    parts: list[Any] = []
    with httpx2.stream(
        "POST", f"{one.url}/ai-sdk/chat?tenant={TENANT}", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            parts.append(line[len("data: ") :])
            if len(parts) == 5:
                one.send(signal.SIGTERM)
    assert parts[-1] == "[DONE]"
    last = json.loads(parts[-2])
    assert last["type"] == "error"
    assert last["errorText"].startswith("REPLICA_DRAINING: ")

    with httpx2.stream(
        "GET",
        f"{two.url}/ai-sdk/chat/{session}/stream?tenant={TENANT}",
        headers=headers,
        timeout=60,
    ) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    assert chunks[-1]["type"] == "finish"
    texts: dict[str, str] = {}
    for chunk in chunks:
        if chunk["type"] == "text-delta":
            texts[chunk["id"]] = texts.get(chunk["id"], "") + chunk["delta"]
    assert "\n\n".join(texts.values()) == reference
    # The drained replica exits by itself, its drain done.
    assert asyncio.run(one.wait_exit(20)) is not None
