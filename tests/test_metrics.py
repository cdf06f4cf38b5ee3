"""``GET /metrics`` of real replicas: the counters move as turns start, end, die and resume."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx2
import pytest

from tests.support.browser import wait_for
from tests.support.metrics import moved, scrape
from tests.support.replicas import Replicas

pytestmark = [
    pytest.mark.processes,
    # 60 chunks at 30/s: a 2 s answer with a calculator call after 5 chunks.
    # The client's resume is what the kill test counts: with automatic takeover
    # on, the survivor's own scan could take the dead turn first (a 409 then).
    # The automatic path's metrics are tested in tests/test_takeover.py.
    pytest.mark.replica_cluster(
        chunks_per_second=30, answer_chunks=60, env={"TETHER_TAKEOVER": "false"}
    ),
]

ALICE = {"requester-uuid": "alice"}


def _turn(session: str, agent: str = "writer") -> dict[str, Any]:
    return {
        "agent_identifier": agent,
        "stateful": True,
        "session_id": session,
        "conversation": [{"sender": "user", "content": "Tell me about rivers."}],
    }


def _in_background(url: str, body: dict[str, Any]) -> threading.Thread:
    """A streamed turn read to its end (or its replica's death) in a thread."""

    def read() -> None:
        try:
            with httpx2.stream("POST", url, headers=ALICE, json=body, timeout=30) as response:
                for _ in response.iter_bytes():
                    pass
        except httpx2.HTTPError:
            pass  # the replica was killed under it: that is the point

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _status(url: str, session: str) -> str | None:
    response = httpx2.get(
        f"{url}/chat/stream/status?tenant=t&session_id={session}", headers=ALICE, timeout=5
    )
    return str(response.json()["status"]) if response.status_code == 200 else None


def test_a_completed_turn_moves_the_turn_and_store_metrics(replicas: Replicas) -> None:
    url = replicas.one.url
    before = scrape(url)
    session = f"m-{uuid.uuid4().hex[:8]}"
    response = httpx2.post(
        f"{url}/chat/response?tenant=t", headers=ALICE, json=_turn(session), timeout=30
    )
    assert response.status_code == 201, response.text
    after = wait_for(lambda: _settled(url), 5, "the turn to be counted")

    assert moved(before, after, "tether_turns_started_total") == 1
    assert moved(before, after, "tether_turns_completed_total") == 1
    assert moved(before, after, "tether_turns_errored_total") == 0
    assert after.value("tether_turns_in_flight") == 0
    # Checkpoints after the tool call and at the end, at least; sized in bytes.
    assert moved(before, after, "tether_checkpoint_bytes_count") >= 2
    assert moved(before, after, "tether_checkpoint_bytes_sum") > 100
    # Every store on the hot path is timed, labelled by store and backend (the
    # recording's operation names depend on how it batches; any will do).
    for store in ("agent_state", "recording", "supervision"):
        count = "tether_store_operation_seconds_count"
        assert moved(before, after, count, store=store, backend="sqlite") >= 1, store
    assert moved(before, after, count, store="agent_state", operation="save") >= 1
    assert moved(before, after, "tether_heartbeat_batch_seconds_count") >= 1


def _settled(url: str) -> Any:
    current = scrape(url)
    return current if current.value("tether_turns_in_flight") == 0 else None


def test_the_exposition_is_prometheus_text_without_created_series(replicas: Replicas) -> None:
    response = httpx2.get(f"{replicas.one.url}/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert "# TYPE tether_turns_completed_total counter" in response.text
    assert "_created" not in response.text


def test_an_errored_turn_is_counted(replicas: Replicas) -> None:
    before = scrape(replicas.one.url)
    session = f"m-{uuid.uuid4().hex[:8]}"
    httpx2.post(
        f"{replicas.one.url}/chat/stream?tenant=t",
        headers=ALICE,
        json=_turn(session, agent="broken"),
        timeout=30,
    )
    after = wait_for(lambda: _settled(replicas.one.url), 5, "the turn to be counted")
    assert moved(before, after, "tether_turns_errored_total") == 1
    assert moved(before, after, "tether_turns_completed_total") == 0


def test_a_cancel_from_the_other_replica_fences_the_producer(replicas: Replicas) -> None:
    one, two = replicas.one.url, replicas.two.url
    before_one, before_two = scrape(one), scrape(two)
    session = f"m-{uuid.uuid4().hex[:8]}"
    reader = _in_background(f"{one}/chat/stream?tenant=t", _turn(session))
    wait_for(lambda: _status(two, session) == "running", 5, "the turn to run")
    message_id = httpx2.get(
        f"{two}/chat/stream/status?tenant=t&session_id={session}", headers=ALICE
    ).json()["message_id"]
    time.sleep(0.5)
    cancel = httpx2.delete(
        f"{two}/chat/stream/{message_id}?tenant=t&session_id={session}", headers=ALICE
    )
    assert cancel.status_code == 204, cancel.text
    reader.join(10)
    after_one = wait_for(lambda: _settled(one), 5, "the producer to stop")
    after_two = scrape(two)

    assert moved(before_one, after_one, "tether_turns_cancelled_total") == 1
    assert moved(before_one, after_one, "tether_fencing_rejections_total") == 1
    assert moved(before_one, after_one, "tether_turns_completed_total") == 0
    assert moved(before_two, after_two, "tether_turns_started_total") == 0
    # The kept partial answer leaves the conversation's agent as it was.
    summary = httpx2.get(f"{two}/conversations/{session}?tenant=t", headers=ALICE).json()
    assert summary["conversation"]["last_turn_status"] == "cancelled"
    assert summary["conversation"]["agent_identifier"] == "writer"


def test_a_resume_after_a_kill_counts_a_takeover_on_the_resuming_replica(
    replicas: Replicas,
) -> None:
    one, two = replicas.one.url, replicas.two.url
    session = f"m-{uuid.uuid4().hex[:8]}"
    _in_background(f"{one}/chat/stream?tenant=t", _turn(session))
    wait_for(lambda: _status(two, session) == "running", 5, "the turn to run")
    time.sleep(0.7)  # past the tool call and its checkpoint
    before = scrape(two)
    replicas.one.kill()
    wait_for(lambda: _status(two, session) == "dead", 10, "the dead verdict")
    message_id = httpx2.get(
        f"{two}/chat/stream/status?tenant=t&session_id={session}", headers=ALICE
    ).json()["message_id"]
    resumed = httpx2.post(
        f"{two}/chat/stream?tenant=t&resume=true&message_id={message_id}",
        headers=ALICE,
        json={**_turn(session), "conversation": []},
        timeout=30,
    )
    assert resumed.status_code == 201, resumed.text
    after = wait_for(lambda: _settled(two), 5, "the resumed turn to end")

    assert moved(before, after, "tether_turns_resumed_total") == 1
    assert moved(before, after, "tether_takeovers_total", cause="client") == 1
    assert moved(before, after, "tether_takeover_first_content_seconds_count", cause="client") == 1
    assert moved(before, after, "tether_turns_started_total") == 1
    assert moved(before, after, "tether_turns_completed_total") == 1


def test_first_content_http_durations_and_process_metrics(replicas: Replicas) -> None:
    """A turn's time to first content is observed for its agent, each request's
    duration by its route's template and status, and the process's own series
    are on the same registry."""
    url = replicas.one.url
    before = scrape(url)
    session = f"m-{uuid.uuid4().hex[:8]}"
    response = httpx2.post(
        f"{url}/chat/response?tenant=t", headers=ALICE, json=_turn(session), timeout=30
    )
    assert response.status_code == 201, response.text
    message_id = response.json()["message_id"]
    missing = httpx2.get(
        f"{url}/chat/stream/{message_id}-nope?tenant=t&session_id={session}",
        headers=ALICE,
        timeout=5,
    )
    after = wait_for(lambda: _settled(url), 5, "the turn to be counted")

    first = "tether_turn_first_content_seconds_count"
    assert moved(before, after, first, agent="writer") == 1
    assert after.value("tether_turn_first_content_seconds_sum", agent="writer") > 0
    http = "tether_http_request_seconds_count"
    assert moved(before, after, http, method="POST", route="/chat/response", status="201") == 1
    template = "/chat/stream/{message_id}"
    status = str(missing.status_code)
    assert moved(before, after, http, method="GET", route=template, status=status) == 1
    assert after.value("process_cpu_seconds_total") > 0
    assert after.value("process_resident_memory_bytes") > 0
