"""The Python client (``tether.client``): turns that recover by themselves, typed errors,
conversations, and ``tether chat`` on top of it.

The first part scripts the server's answers (an ``httpx2.MockTransport``), so
that each recovery path is one deterministic test: a stream that breaks, a
resume refused because a replica took the turn over first, a replayed event,
a stream gone to the transcript, a start whose answer was lost. The second
part runs real ``tether serve`` processes: a turn streams to its answer, a
replica is SIGKILLed mid-answer while the client streams from a list of
replica URLs, errors come typed with the server's code, cancel, the
conversation routes, and ``tether chat``.
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.support.project import make_project
from tests.support.servers import ServerProcess, free_port
from tether.cli.chat import run_chat
from tether.cli.main import app
from tether.client import (
    AuthenticationError,
    ConnectionFailedError,
    ConversationBusyError,
    NotFoundError,
    PermissionDeniedError,
    RecoveryError,
    SyncTetherClient,
    TetherClient,
    TetherHTTPError,
    TurnFailedError,
    TurnUpdate,
    UnprocessableEntityError,
)
from tether.client.errors import error_from_response
from tether.crashtest.cluster import Cluster

# ----------------------------------------------------- a scripted server

MID = "m1"
SESSION = "s1"


def _message(index: int, content: str, message_id: str = MID) -> bytes:
    data = {"sender": "bot", "content": content, "message_id": message_id, "session_id": SESSION}
    return f"event: new_message\nid: {message_id}:{index}\ndata: {json.dumps(data)}\n\n".encode()


def _verdict(reason: str) -> bytes:
    return f"event: stream_status\ndata: {json.dumps({'reason': reason})}\n\n".encode()


def _error_event(code: str) -> bytes:
    return f"event: error\ndata: {json.dumps({'code': code, 'message': 'no'})}\n\n".encode()


class _Body(httpx2.AsyncByteStream):
    """A stream body that, when ``broken``, fails the way a dying replica's does."""

    def __init__(self, *chunks: bytes, broken: bool = False) -> None:
        self.chunks = chunks
        self.broken = broken

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.broken:
            raise httpx2.ReadError("the replica went away")


def _stream(*chunks: bytes, broken: bool = False, status: int = 200) -> httpx2.Response:
    headers = {"content-type": "text/event-stream", "x-tether-message-id": MID}
    return httpx2.Response(status, headers=headers, stream=_Body(*chunks, broken=broken))


def _status(verdict: str, message_id: str = MID) -> httpx2.Response:
    body = {"session_id": SESSION, "message_id": message_id, "status": verdict, "epoch": 2}
    return httpx2.Response(200, json=body)


def _refusal(status: int, code: str, **extra: Any) -> httpx2.Response:
    return httpx2.Response(status, json={"code": code, "message": code.lower(), **extra})


Answer = httpx2.Response | Exception


class _Scripted:
    """Answers each request with the next answer scripted for its kind (start,
    resume, attach, status, conversation, cancel), and keeps every request."""

    def __init__(self, **answers: list[Answer]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, httpx2.Request]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        kind = self.kind(request)
        self.requests.append((kind, request))
        queue = self.answers.get(kind) or []
        if not queue:
            raise AssertionError(f"nothing scripted for {kind}: {request.method} {request.url}")
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    @staticmethod
    def kind(request: httpx2.Request) -> str:
        path = request.url.path
        if request.method == "POST":
            return "resume" if request.url.params.get("resume") == "true" else "start"
        if request.method == "DELETE":
            return "cancel"
        if path == "/chat/stream/status":
            return "status"
        if path.startswith("/chat/stream/"):
            return "attach"
        return "conversation"

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.requests]

    def hosts(self) -> list[str]:
        return [request.url.host for _, request in self.requests]


def _client(script: _Scripted, urls: str | list[str] = "http://a", **options: Any) -> Any:
    return TetherClient(
        urls,
        tenant="t",
        requester_uuid="alice",
        transport=httpx2.MockTransport(script),
        **options,
    )


async def _read(client: TetherClient, **options: Any) -> tuple[list[TurnUpdate], Any]:
    async with client, client.stream(agent_identifier="writer", message="Hi", **options) as turn:
        updates = [update async for update in turn]
    return updates, turn


async def test_a_broken_stream_is_attached_again_after_its_last_event() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "Once"), _message(1, "Once upon"), broken=True)],
        status=[_status("running")],
        attach=[_stream(_message(2, "Once upon a"), _message(3, "Once upon a time"))],
    )
    updates, turn = await _read(_client(script))
    assert [u.index for u in updates] == [0, 1, 2, 3]
    assert updates[-1].content == "Once upon a time"
    assert (turn.outcome, turn.path, turn.message_id) == ("done", ["start", "attach"], MID)
    attach = next(request for kind, request in script.requests if kind == "attach")
    assert attach.headers["last-event-id"] == f"{MID}:1"
    assert attach.url.params["session_id"] == turn.session_id
    assert attach.headers["requester-uuid"] == "alice"


async def test_a_refused_resume_attaches_to_the_turn_a_replica_took_over() -> None:
    # Dead when asked; by the time the resume lands a replica took it over (409).
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[_status("dead"), _status("running")],
        resume=[_refusal(409, "CONVERSATION_BUSY", message_id=MID)],
        attach=[_stream(_message(20000, "A B"), _verdict("done"))],
    )
    updates, turn = await _read(_client(script))
    assert [u.index for u in updates] == [0, 20000]
    assert turn.path == ["start", "resume:409", "attach"]
    resume = next(request for kind, request in script.requests if kind == "resume")
    assert resume.url.params["message_id"] == MID
    assert json.loads(resume.content) == {
        "agent_identifier": "writer",
        "stateful": True,
        "session_id": turn.session_id,
        "conversation": [],
    }


async def test_a_dead_turn_is_resumed_by_the_client() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[_status("dead")],
        resume=[_stream(_message(20000, "A B"), status=201)],
    )
    updates, turn = await _read(_client(script))
    assert [u.content for u in updates] == ["A", "A B"]
    assert (turn.outcome, turn.path) == ("done", ["start", "resume"])


async def test_an_event_seen_before_is_never_shown_twice() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), _message(1, "A B"), broken=True)],
        status=[_status("running")],
        attach=[_stream(_message(1, "A B"), _message(2, "A B C"), _verdict("done"))],
    )
    updates, _ = await _read(_client(script))
    assert [u.index for u in updates] == [0, 1, 2]


async def test_a_stream_that_ends_dead_is_recovered_too() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), _verdict("dead"))],
        status=[_status("running")],
        attach=[_stream(_message(20000, "A B"), _verdict("done"))],
    )
    updates, turn = await _read(_client(script))
    assert [u.index for u in updates] == [0, 20000] and turn.path == ["start", "attach"]


async def test_a_turn_whose_stream_is_gone_is_read_from_the_transcript() -> None:
    conversation = {
        "conversation": {
            "tenant": "t",
            "session_id": SESSION,
            "owner_uuid": "alice",
            "agent_identifier": "writer",
            "created_at": "2030-01-01T00:00:00Z",
            "updated_at": "2030-01-01T00:00:01Z",
            "last_turn_status": "complete",
        },
        "messages": [
            {"sender": "user", "content": "Hi", "message_id": f"{MID}-user"},
            {"sender": "bot", "content": "A B C", "message_id": MID},
        ],
    }
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[_status("done")],
        attach=[_refusal(410, "TURN_GONE")],
        conversation=[httpx2.Response(200, json=conversation)],
    )
    updates, turn = await _read(_client(script))
    assert [(u.index, u.content) for u in updates] == [(0, "A"), (None, "A B C")]
    assert turn.path == ["start", "attach:410", "transcript"] and turn.outcome == "done"


async def test_a_start_whose_answer_was_lost_is_followed_not_sent_again() -> None:
    # The POST reached a replica that died before answering: the turn exists.
    script = _Scripted(
        start=[httpx2.ReadError("reset before the answer")],
        status=[_status("running")],
        attach=[_stream(_message(0, "A"), _verdict("done"))],
    )
    updates, turn = await _read(_client(script))
    assert [u.content for u in updates] == ["A"]
    assert script.kinds().count("start") == 1 and turn.message_id == MID


async def test_a_start_that_never_arrived_is_sent_again() -> None:
    script = _Scripted(
        start=[httpx2.ReadError("reset before the answer"), _stream(_message(0, "A"))],
        status=[httpx2.Response(404, json={"code": "TURN_NOT_FOUND", "message": "none"})],
    )
    updates, _ = await _read(_client(script))
    assert [u.content for u in updates] == ["A"] and script.kinds() == ["start", "status", "start"]


async def test_a_lost_start_in_someone_elses_turn_is_not_taken_for_ours() -> None:
    # A session the caller named: the turn found must prove it answers our message.
    other = {
        "conversation": {
            "tenant": "t",
            "session_id": SESSION,
            "owner_uuid": "alice",
            "agent_identifier": "writer",
            "created_at": "2030-01-01T00:00:00Z",
            "updated_at": "2030-01-01T00:00:01Z",
        },
        "messages": [{"sender": "user", "content": "Something else", "message_id": "m9-user"}],
    }
    script = _Scripted(
        start=[httpx2.ReadError("reset")],
        status=[_status("running", message_id="m9")],
        conversation=[httpx2.Response(200, json=other)],
    )
    with pytest.raises(Exception, match="cannot be told"):
        await _read(_client(script), session_id=SESSION)


async def test_a_replica_that_refuses_connections_is_skipped_for_the_next() -> None:
    script = _Scripted(
        start=[httpx2.ConnectError("refused"), _stream(_message(0, "A"))],
    )
    updates, _ = await _read(_client(script, ["http://a", "http://b"]))
    assert [u.content for u in updates] == ["A"] and script.hosts() == ["a", "b"]


async def test_a_replica_that_cannot_serve_is_left_for_another() -> None:
    # The stream from a broke: b is asked next; b is draining (503): back to a.
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[_refusal(503, "DRAINING"), _status("running")],
        attach=[_stream(_message(1, "A B"), _verdict("done"))],
    )
    updates, _ = await _read(_client(script, ["http://a", "http://b"]))
    assert [u.index for u in updates] == [0, 1]
    assert script.hosts() == ["a", "b", "a", "a"]


async def test_an_errored_turn_raises_with_the_servers_code() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), _error_event("TURN_TIMEOUT"), _verdict("errored"))]
    )
    with pytest.raises(TurnFailedError) as raised:
        await _read(_client(script))
    assert raised.value.code == "TURN_TIMEOUT" and raised.value.message_id == MID


async def test_a_cancelled_turn_ends_the_iteration_saying_so() -> None:
    script = _Scripted(start=[_stream(_message(0, "A"), _verdict("cancelled"))])
    updates, turn = await _read(_client(script))
    assert [u.content for u in updates] == ["A"] and turn.outcome == "cancelled"


async def test_recovery_gives_up_past_its_bound() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[httpx2.ConnectError("refused")] * 100,
    )
    started = time.monotonic()
    with pytest.raises(RecoveryError, match="no replica served"):
        await _read(_client(script, recovery_timeout=0.3))
    assert time.monotonic() - started < 5


async def test_a_turn_no_replica_accepts_is_given_up_after_the_request_timeout() -> None:
    script = _Scripted(start=[httpx2.ConnectError("refused")] * 100)
    with pytest.raises(ConnectionFailedError, match="no replica accepted the turn"):
        await _read(_client(script, ["http://a", "http://b"], timeout=0.3))
    assert script.kinds() == ["start"] * len(script.requests) and len(script.requests) > 2


@pytest.mark.parametrize(
    ("status", "body", "cls", "code"),
    [
        (400, {"code": "BOT_PARAMS_REJECTED", "message": "x"}, "BadRequestError", None),
        (401, {"code": "UNAUTHENTICATED", "message": "x"}, "AuthenticationError", None),
        (403, {"code": "CONVERSATION_NOT_OWNED", "message": "x"}, "PermissionDeniedError", None),
        (404, {"code": "UNKNOWN_AGENT", "message": "x"}, "NotFoundError", None),
        (409, {"code": "CONVERSATION_BUSY", "message": "x"}, "ConversationBusyError", None),
        (410, {"code": "TURN_GONE", "message": "x"}, "GoneError", None),
        (413, {"code": "BODY_TOO_LARGE", "message": "x"}, "PayloadTooLargeError", None),
        (
            422,
            {"detail": [{"loc": ["body", "session_id"], "msg": "bad"}]},
            "UnprocessableEntityError",
            "VALIDATION_ERROR",
        ),
        (500, {"code": "INTERNAL", "message": "x"}, "InternalServerError", None),
        (
            501,
            {"code": "NOT_IMPLEMENTED_BY_STORE", "message": "x"},
            "NotImplementedByServerError",
            None,
        ),
        (502, "<html>502 Bad Gateway</html>", "BadGatewayError", "HTTP_502"),
        (503, {"code": "DRAINING", "message": "x"}, "ServiceUnavailableError", None),
        (504, "<html>504 Gateway Time-out</html>", "GatewayTimeoutError", "HTTP_504"),
        (418, {"code": "TEAPOT", "message": "x"}, "TetherHTTPError", None),
    ],
)
def test_every_error_status_is_a_class_carrying_the_servers_code(
    status: int, body: Any, cls: str, code: str | None
) -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    error = error_from_response(status, text, {"Retry-After": "1"})
    assert type(error).__name__ == cls
    assert isinstance(error, TetherHTTPError) and error.status_code == status
    assert error.code == (code or body["code"])
    assert error.retry_after == 1.0


def test_a_busy_conversation_names_its_occupant() -> None:
    body = {
        "code": "CONVERSATION_BUSY",
        "message": "busy",
        "detail": {"session_id": "s", "message_id": "m7"},
        "message_id": "m7",
    }
    error = error_from_response(409, json.dumps(body))
    assert isinstance(error, ConversationBusyError)
    assert (error.occupant, error.session_id, error.message) == ("m7", "s", "busy")


def test_the_sync_client_is_the_async_one_on_a_loop_of_its_own() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[_status("running")],
        attach=[_stream(_message(1, "A B"), _verdict("done"))],
    )
    with (
        SyncTetherClient(
            "http://a", tenant="t", token="tok", transport=httpx2.MockTransport(script)
        ) as client,
        client.stream(agent_identifier="writer", message="Hi") as turn,
    ):
        assert [u.content for u in turn] == ["A", "A B"]
        assert turn.outcome == "done" and turn.recovered
    assert all(r.headers["authorization"] == "Bearer tok" for _, r in script.requests)


# ------------------------------------------------------ real replicas

PROMPT = "Tell me about rivers and the towns along them."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One replica on SQLite, whose turns take about 1.5 s (150 chunks at 100/s)."""
    root = tmp_path_factory.mktemp("client")
    project = make_project(root / "project", chunks_per_second=100, answer_chunks=150)
    process = ServerProcess(
        project, store_url=f"sqlite:///{root}/tether.db", log_path=root / "server.log"
    ).start()
    yield process
    process.stop()


def _strictly_growing(updates: list[TurnUpdate]) -> bool:
    indexes = [u.index for u in updates]
    return all(i is not None for i in indexes) and all(
        a < b for a, b in pairwise(i for i in indexes if i is not None)
    )


@pytest.mark.processes
async def test_a_turn_streams_to_its_answer(server: ServerProcess) -> None:
    async with TetherClient(server.url, tenant="t", requester_uuid="alice") as client:
        async with client.stream(agent_identifier="writer", message=PROMPT) as turn:
            updates = [update async for update in turn]
        assert turn.outcome == "done" and turn.path == ["start"]
        # In delta mode at most one update per 0.125 s: a dozen over 1.5 s.
        assert len(updates) >= 5 and _strictly_growing(updates)
        for before, after in pairwise(updates):
            assert after.content.startswith(before.content)
        conversation = await client.get_conversation(turn.session_id)
        assert [m.sender for m in conversation.messages] == ["user", "bot"]
        assert conversation.messages[-1].content == updates[-1].content
        assert conversation.messages[-1].message_id == turn.message_id
        status = await client.status(turn.session_id)
        assert status is not None and (status.status, status.message_id) == (
            "done",
            turn.message_id,
        )


@pytest.mark.processes
def test_the_sync_client_streams_a_turn(server: ServerProcess) -> None:
    with SyncTetherClient(server.url, tenant="t", requester_uuid="sync-user") as client:
        with client.stream(agent_identifier="plain", message=PROMPT) as turn:
            final = turn.answer()
        assert final is not None and turn.outcome == "done"
        listed = client.list_conversations()
        assert [c.session_id for c in listed.items] == [turn.session_id]


@pytest.mark.processes
async def test_errors_come_typed_with_the_servers_code(server: ServerProcess) -> None:
    async with (
        TetherClient(server.url, tenant="t", requester_uuid="alice") as alice,
        TetherClient(server.url, tenant="t", requester_uuid="bob") as bob,
    ):
        session = f"s-{uuid.uuid4().hex[:10]}"
        async with alice.stream(
            agent_identifier="writer", message=PROMPT, session_id=session
        ) as turn:
            first = await anext(turn)
            # A second turn in the same conversation while the first runs: 409.
            with pytest.raises(ConversationBusyError) as busy:
                await alice.stream(
                    agent_identifier="writer", message="And more?", session_id=session
                ).answer()
            assert busy.value.code == "CONVERSATION_BUSY"
            assert busy.value.occupant == first.message_id == turn.message_id
            # Someone else's private conversation: 403 with the server's code.
            with pytest.raises(PermissionDeniedError) as denied:
                await bob.get_conversation(session)
            assert denied.value.code == "CONVERSATION_NOT_OWNED"
            await turn.answer()
        with pytest.raises(NotFoundError) as unknown_agent:
            await alice.stream(agent_identifier="nobody", message="Hi").answer()
        assert unknown_agent.value.code == "UNKNOWN_AGENT"
        with pytest.raises(NotFoundError) as unknown:
            await alice.get_conversation("no-such-conversation")
        assert unknown.value.code == "TURN_NOT_FOUND"
        with pytest.raises(UnprocessableEntityError) as invalid:
            bad = alice.stream(agent_identifier="writer", message="Hi", session_id="no/slash")
            await bad.answer()
        assert invalid.value.status_code == 422 and "session_id" in invalid.value.message


@pytest.mark.processes
async def test_a_cancel_ends_the_stream_cancelled_with_the_partial_kept(
    server: ServerProcess,
) -> None:
    async with TetherClient(server.url, tenant="t", requester_uuid="carol") as client:
        async with client.stream(agent_identifier="plain", message=PROMPT) as turn:
            updates: list[TurnUpdate] = []
            async for update in turn:
                updates.append(update)
                if len(updates) == 5:
                    assert await turn.cancel() is True
        assert turn.outcome == "cancelled"
        assert 5 <= len(updates) < 150
        assert await client.cancel(turn.session_id, turn.message_id or "") is False
        status = await client.status(turn.session_id)
        assert status is not None and status.status == "cancelled"
        conversation = await client.get_conversation(turn.session_id)
        assert conversation.summary.last_turn_status == "cancelled"
        assert conversation.messages[-1].content.startswith(updates[4].content)


@pytest.mark.processes
async def test_conversations_list_read_share_and_delete(server: ServerProcess) -> None:
    owner = f"dave-{uuid.uuid4().hex[:6]}"
    async with (
        TetherClient(server.url, tenant="t", requester_uuid=owner) as dave,
        TetherClient(server.url, tenant="t", requester_uuid="erin") as erin,
    ):
        sessions = []
        for prompt in ("First question", "Second question"):
            turn = dave.stream(agent_identifier="plain", message=prompt)
            await turn.answer()
            sessions.append(turn.session_id)
        page = await dave.list_conversations(limit=1)
        assert [c.session_id for c in page.items] == [sessions[1]] and page.next_cursor
        assert [c.session_id async for c in dave.conversations(page_size=1)] == sessions[::-1]
        read = await dave.get_conversation(sessions[0])
        assert read.messages[0].content == "First question"

        with pytest.raises(PermissionDeniedError):
            await erin.get_conversation(sessions[0])
        shared = await dave.share_conversation(sessions[0])
        assert shared.shared is True
        assert (await erin.get_conversation(sessions[0])).messages == read.messages
        with pytest.raises(PermissionDeniedError):
            await erin.delete_conversation(sessions[0])  # reading is not owning
        assert (await dave.share_conversation(sessions[0], shared=False)).shared is False

        await dave.delete_conversation(sessions[0])
        with pytest.raises(NotFoundError):
            await dave.get_conversation(sessions[0])
        assert [c.session_id async for c in dave.conversations()] == [sessions[1]]


@pytest.mark.processes
async def test_a_token_is_sent_and_refusals_are_typed(tmp_path: Path) -> None:
    secret = "a-test-secret-of-at-least-32-bytes!"
    project = make_project(tmp_path / "project", chunks_per_second=400, answer_chunks=10)
    process = ServerProcess(
        project,
        store_url="memory://",
        log_path=tmp_path / "server.log",
        extra_args=["--auth", "jwt", "--jwt-secret", secret],
    ).start()

    def token(**claims: Any) -> str:
        payload = {"sub": "frank", "exp": int(time.time()) + 300, "tenants": ["t"], **claims}
        return jwt.encode(payload, secret, algorithm="HS256")

    try:
        async with TetherClient(process.url, tenant="t", token=token()) as client:
            final = await client.stream(agent_identifier="plain", message="Hi").answer()
            assert final is not None
            listed = await client.list_conversations()
            assert [c.owner_uuid for c in listed.items] == ["frank"]
        async with TetherClient(process.url, tenant="t", token="not.a.jwt") as forged:
            with pytest.raises(AuthenticationError) as refused:
                await forged.list_conversations()
            assert refused.value.code == "UNAUTHENTICATED"
        async with TetherClient(
            process.url, tenant="other", token=token(tenants=["t"])
        ) as elsewhere:
            with pytest.raises(PermissionDeniedError) as denied:
                await elsewhere.stream(agent_identifier="plain", message="Hi").answer()
            assert denied.value.code == "TENANT_NOT_ALLOWED"
    finally:
        process.stop()


@pytest.mark.processes
async def test_tether_chat_streams_through_the_client(server: ServerProcess) -> None:
    # The first URL is a closed port: the client moves on to the replica.
    out = io.StringIO()
    console = Console(file=out, width=100_000)
    dead = f"http://127.0.0.1:{free_port()}"
    code = await run_chat(
        PROMPT, url=[dead, server.url], agent="writer", tenant="t", user="gina", console=console
    )
    text = out.getvalue()
    assert code == 0, text
    assert "calculator" in text and "message_id=" in text
    async with TetherClient(server.url, tenant="t", requester_uuid="gina") as client:
        [summary] = (await client.list_conversations()).items
        answer = (await client.get_conversation(summary.session_id)).messages[-1]
    assert answer.content.splitlines()[-1] in text


@pytest.mark.processes
def test_tether_chat_says_what_the_server_refused(server: ServerProcess) -> None:
    result = CliRunner().invoke(
        app, ["chat", "--url", server.url, "--agent", "nobody", "--tenant", "t", "Hi"]
    )
    assert result.exit_code == 1
    assert "HTTP 404: UNKNOWN_AGENT" in result.output


# ------------------------------------------- a replica killed mid-answer


@pytest.mark.processes
@pytest.mark.timeout(120)
async def test_a_replica_killed_mid_answer_is_recovered_from_the_other_urls(
    tmp_path: Path,
) -> None:
    """Three replicas, the client given all three URLs; the one streaming the
    answer (the first URL) is SIGKILLed mid-answer. The client recovers by
    itself on another and yields the complete answer, indexes strictly
    growing, equal to a crash-free run's."""
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=160, tool_call_after_chunks=None
    )
    cluster = Cluster(project, f"sqlite:///{tmp_path}/tether.db", size=3, workdir=tmp_path)
    async with cluster:
        urls = [replica.url for replica in cluster.replicas]
        async with TetherClient(urls, tenant="t", requester_uuid="hana") as client:
            reference = await client.stream(agent_identifier="plain", message=PROMPT).answer()
            assert reference is not None
            updates, turn = await _stream_and_kill(
                client, lambda turn: cluster.replicas[0], after=10
            )
    assert turn.outcome == "done" and turn.recovered, turn.path
    assert _strictly_growing(updates), [u.index for u in updates]
    assert len({u.event_id for u in updates}) == len(updates)
    assert updates[-1].content == reference.content
    assert all(c.url != urls[0] for c in turn.connections[1:])


async def _stream_and_kill(
    client: TetherClient, producer: Callable[[Any], Any], *, after: int
) -> tuple[list[TurnUpdate], Any]:
    """Stream a turn; SIGKILL its producer once ``after`` messages arrived."""
    updates: list[TurnUpdate] = []
    async with client.stream(agent_identifier="plain", message=PROMPT) as turn:
        async for update in turn:
            updates.append(update)
            if len(updates) == after:
                replica = producer(turn)
                replica.send(signal.SIGKILL)
                await asyncio.to_thread(replica.process.wait, 10)
    return updates, turn
