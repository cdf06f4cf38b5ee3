"""Isolation between users of one tenant, against real server processes (design §5.8).

Writes are owner-only; reads are the owner's, or anyone's in the tenant once
the owner shares the conversation. Another user never gets a private
conversation's content by any route: reading, listing, status, attaching,
cancelling, resuming or appending to it is a 403 or a 404. With ``--auth jwt``
the identity headers are ignored, so forging them grants nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import jwt
import pytest

from tests.support.client import read_stream, turn_body
from tests.support.project import make_project
from tests.support.replicas import LiveRead, read_in_background, started
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.processes

ALICE = {"requester-uuid": "alice"}
BOB = {"requester-uuid": "bob"}
SECRET = "isolation-tests-shared-secret-0123456789"
REFUSED = {403, 404}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("isolation")
    # 60 chunks at 40/s: a turn lasts about 1.5 s, long enough to act on it live.
    project = make_project(root / "project", chunks_per_second=40, answer_chunks=60)
    process = ServerProcess(project, store_url="memory://", log_path=root / "server.log").start()
    yield process
    process.stop()


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        yield http


def _session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


def _body(content: str, session: str) -> dict[str, Any]:
    return turn_body(content, agent="plain", stateful=True, session_id=session)


def _resume_body(session: str) -> dict[str, Any]:
    return {
        "agent_identifier": "plain",
        "stateful": True,
        "session_id": session,
        "conversation": [],
    }


async def _conversation(
    client: httpx2.AsyncClient, session: str, headers: dict[str, str]
) -> tuple[str, dict[str, Any]]:
    """A finished stateful turn by ``headers``' user: its message id and the transcript."""
    read = await read_stream(
        client,
        "POST",
        "/chat/stream?tenant=t",
        json=_body("A secret plan", session),
        headers=headers,
    )
    assert read.status_code == 201 and read.message_id, read.events
    transcript = await client.get(f"/conversations/{session}?tenant=t", headers=headers)
    assert transcript.status_code == 200
    return read.message_id, dict(transcript.json())


def _assert_refused(response: httpx2.Response, secret: str, allowed: set[int] = REFUSED) -> None:
    assert response.status_code in allowed, (response.status_code, response.text)
    assert secret not in response.text and "secret plan" not in response.text.lower()


async def _writes_by(
    client: httpx2.AsyncClient, headers: dict[str, str], session: str, message_id: str
) -> dict[str, httpx2.Response]:
    """Every write another user could try on the conversation."""
    resume = f"/chat/stream?tenant=t&resume=true&message_id={message_id}"
    return {
        "append": await client.post(
            "/chat/stream?tenant=t", json=_body("me too", session), headers=headers
        ),
        "resume": await client.post(resume, json=_resume_body(session), headers=headers),
        "cancel": await client.delete(
            f"/chat/stream/{message_id}?tenant=t&session_id={session}", headers=headers
        ),
        "unshare": await client.patch(
            f"/conversations/{session}?tenant=t", json={"shared": False}, headers=headers
        ),
        "delete": await client.delete(f"/conversations/{session}?tenant=t", headers=headers),
    }


async def test_a_private_conversation_is_invisible_to_another_user(
    client: httpx2.AsyncClient,
) -> None:
    session = _session()
    message_id, before = await _conversation(client, session, ALICE)
    answer = before["messages"][-1]["content"]
    attach = f"/chat/stream/{message_id}?tenant=t"

    _assert_refused(await client.get(f"/conversations/{session}?tenant=t", headers=BOB), answer)
    listed = await client.get("/conversations?tenant=t", headers=BOB)
    assert listed.status_code == 200
    assert session not in listed.text
    status = f"/chat/stream/status?tenant=t&session_id={session}"
    _assert_refused(await client.get(status, headers=BOB), answer)
    for url in (f"{attach}&session_id={session}", attach, f"{attach}&session_id=s-bobs-own"):
        read = await read_stream(client, "GET", url, headers=BOB)
        assert read.status_code in REFUSED | {410}, read.events
        assert answer[:40] not in "".join(e.data for e in read.events)
    for name, response in (await _writes_by(client, BOB, session, message_id)).items():
        assert response.status_code in REFUSED, (name, response.status_code, response.text)
        assert answer not in response.text
    # An anonymous requester (no header) is just another user.
    _assert_refused(await client.get(f"/conversations/{session}?tenant=t"), answer)

    after = await client.get(f"/conversations/{session}?tenant=t", headers=ALICE)
    assert after.json()["messages"] == before["messages"]
    assert after.json()["conversation"]["shared"] is False
    assert (await client.get(status, headers=ALICE)).json()["message_id"] == message_id


async def test_another_user_cannot_cancel_a_running_turn(client: httpx2.AsyncClient) -> None:
    session = _session()
    read = await started(
        read_in_background(
            client, "POST", "/chat/stream?tenant=t", json=_body("Go on", session), headers=ALICE
        )
    )
    await read.until(lambda r: len(r.messages) >= 3)
    message_id = read.message_id
    with_session = f"/chat/stream/{message_id}?tenant=t&session_id={session}"
    assert (await client.delete(with_session, headers=BOB)).status_code in REFUSED
    assert (
        await client.delete(f"/chat/stream/{message_id}?tenant=t", headers=BOB)
    ).status_code in (REFUSED | {400})
    await read.finished()
    assert read.verdict() == "done"  # nobody cancelled it
    reference = await read_stream(
        client, "POST", "/chat/stream?tenant=t", json=_body("Go on", _session()), headers=ALICE
    )
    assert read.messages[-1]["content"] == reference.final_text


async def test_another_user_cannot_cancel_or_attach_a_stateless_turn(
    client: httpx2.AsyncClient,
) -> None:
    """A stateless turn has no conversation and no lease: its id is all there is."""
    read: LiveRead = await started(
        read_in_background(
            client,
            "POST",
            "/chat/stream?tenant=t",
            json=turn_body("Go on", agent="plain"),
            headers=ALICE,
        )
    )
    await read.until(lambda r: len(r.messages) >= 3)
    url = f"/chat/stream/{read.message_id}?tenant=t"
    assert (await client.delete(url, headers=BOB)).status_code in REFUSED
    peek = await read_stream(client, "GET", url, headers=BOB)
    assert peek.status_code in REFUSED and not peek.messages
    await read.finished()
    assert read.verdict() == "done"


async def test_a_shared_conversation_is_readable_but_not_writable(
    client: httpx2.AsyncClient,
) -> None:
    session = _session()
    message_id, before = await _conversation(client, session, ALICE)
    shared = await client.patch(
        f"/conversations/{session}?tenant=t", json={"shared": True}, headers=ALICE
    )
    assert shared.status_code == 200 and shared.json()["shared"] is True

    read = await client.get(f"/conversations/{session}?tenant=t", headers=BOB)
    assert read.status_code == 200
    assert read.json()["messages"] == before["messages"]
    assert session not in (await client.get("/conversations?tenant=t", headers=BOB)).text
    status = await client.get(f"/chat/stream/status?tenant=t&session_id={session}", headers=BOB)
    assert status.status_code == 200 and status.json()["message_id"] == message_id
    replay = await read_stream(
        client, "GET", f"/chat/stream/{message_id}?tenant=t&session_id={session}", headers=BOB
    )
    assert replay.status_code == 200
    assert replay.final_text == before["messages"][-1]["content"]

    for name, response in (await _writes_by(client, BOB, session, message_id)).items():
        assert response.status_code == 403, (name, response.status_code, response.text)
        assert response.json()["code"] == "CONVERSATION_NOT_OWNED"

    # Live: the owner's next turn can be watched, not cancelled.
    live = await started(
        read_in_background(
            client, "POST", "/chat/stream?tenant=t", json=_body("More", session), headers=ALICE
        )
    )
    await live.until(lambda r: len(r.messages) >= 3)
    watch = read_in_background(
        client,
        "GET",
        f"/chat/stream/{live.message_id}?tenant=t&session_id={session}",
        headers=BOB,
    )
    cancel = await client.delete(
        f"/chat/stream/{live.message_id}?tenant=t&session_id={session}", headers=BOB
    )
    assert cancel.status_code == 403
    await live.finished()
    await watch.finished()
    assert live.verdict() == "done"
    assert watch.status_code == 200 and watch.messages[-1] == live.messages[-1]

    after = (await client.get(f"/conversations/{session}?tenant=t", headers=ALICE)).json()
    assert after["messages"][: len(before["messages"])] == before["messages"]
    assert [m["sender"] for m in after["messages"]] == ["user", "bot", "user", "bot"]
    assert after["conversation"]["shared"] is True


# ------------------------------------------------------------------ JWT


@pytest.fixture(scope="module")
def jwt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("isolation-jwt")
    project = make_project(root / "project", chunks_per_second=400, answer_chunks=10)
    process = ServerProcess(
        project,
        store_url="memory://",
        log_path=root / "server.log",
        extra_args=["--auth", "jwt"],
        env={"TETHER_JWT_SECRET": SECRET},
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def jwt_client(jwt_server: ServerProcess) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=jwt_server.url, timeout=30) as http:
        yield http


def _token(sub: str, **claims: Any) -> dict[str, str]:
    # A token names its tenants: without the claim it may use none.
    payload = {"sub": sub, "exp": int(time.time()) + 300, "tenants": ["t"], **claims}
    return {"Authorization": f"Bearer {jwt.encode(payload, SECRET, algorithm='HS256')}"}


async def test_with_jwt_a_forged_header_or_another_token_reads_nothing(
    jwt_client: httpx2.AsyncClient,
) -> None:
    session = _session()
    message_id, before = await _conversation(jwt_client, session, _token("alice"))
    answer = before["messages"][-1]["content"]
    url = f"/conversations/{session}?tenant=t"

    forged = await jwt_client.get(url, headers=ALICE)
    _assert_refused(forged, answer, {401})
    bob_as_alice = await jwt_client.get(url, headers={**_token("bob"), **ALICE})
    _assert_refused(bob_as_alice, answer)
    _assert_refused(await jwt_client.get(url, headers=_token("bob")), answer)
    status = f"/chat/stream/status?tenant=t&session_id={session}"
    _assert_refused(await jwt_client.get(status, headers={**_token("bob"), **ALICE}), answer)
    for name, response in (
        await _writes_by(jwt_client, {**_token("bob"), **ALICE}, session, message_id)
    ).items():
        assert response.status_code in REFUSED, (name, response.status_code, response.text)
    after = await jwt_client.get(url, headers=_token("alice"))
    assert after.json()["messages"] == before["messages"]


async def test_with_jwt_a_token_whose_tenants_exclude_the_tenant_is_403(
    jwt_client: httpx2.AsyncClient,
) -> None:
    session = _session()
    await _conversation(jwt_client, session, _token("alice"))
    elsewhere = _token("alice", tenants=["other"])
    for response in (
        await jwt_client.get(f"/conversations/{session}?tenant=t", headers=elsewhere),
        await jwt_client.get("/conversations?tenant=t", headers=elsewhere),
        await jwt_client.post(
            "/chat/stream?tenant=t", json=_body("hi", session), headers=elsewhere
        ),
    ):
        assert response.status_code == 403
        assert response.json()["code"] == "TENANT_NOT_ALLOWED"
    allowed = _token("alice", tenants=["other", "t"])
    assert (
        await jwt_client.get(f"/conversations/{session}?tenant=t", headers=allowed)
    ).status_code == 200
