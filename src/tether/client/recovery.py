"""Following one turn to its end, whatever happens to its connection or its replica.

A stream can end four ways: with the answer (``stream_status: done``, or a
clean live close from a server of an older release), ``cancelled``,
``errored``, or without the answer:
the connection broke, a replica answered 5xx, or the stream ended ``dead`` or
``gone``. In the last case the client does what "What a client does when it
lands on a conversation" (docs/deployment/model.md) says, on any replica:

1. ``GET /chat/stream/status``: which turn occupies the conversation.
2. ``running``: attach (``GET /chat/stream/{id}`` with ``Last-Event-ID``, so the
   stream goes on after the last message it had).
3. ``dead``: resume (``POST /chat/stream?resume=true``). A replica may have
   taken the turn over by itself first: the resume is then refused (409) and
   the status, asked again, says ``running``: attach.
4. ``done``, ``cancelled``, ``errored``: attach too, for what the client had
   not seen and the verdict; once the turn's stream is gone (410, after the
   grace period), its answer is read from the transcript.

Each failed attempt moves to the next base URL (``Endpoints``) and waits a
little longer (50 ms doubling to 1 s, each pause jittered between half its
step and the step: ``Backoff``); the client gives up with
``RecoveryError`` when no new message came for ``recovery_timeout`` seconds.
Indexes only grow: a message at or below the last index shown is dropped, so a
reconnect never shows anything twice.

A new turn's ``POST`` that fails before its answer arrives may or may not have
started the turn. Refused before it was sent (connection refused, 503): sent
again. Otherwise the status says: no turn, send it again; a turn answering
this client's message (the session is the client's own, or the transcript's
last user message is its message and belongs to that turn), follow it; with
``enqueue``, the last message of the status's queue when it is this client's.

A turn sent with ``multitask_strategy="enqueue"`` to a busy conversation is
answered 202: its id at once, a first ``queued`` event, then its messages
once it starts. While it waits the status lists it in ``queue`` rather than
naming it: the client attaches (the attach waits for it to start). A queued
turn that left the queue without starting (cancelled) and left nothing in the
transcript ends ``cancelled``.
"""

from __future__ import annotations

import asyncio
import random as _random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx2

from tether.client import routes
from tether.client.backoff import Backoff
from tether.client.endpoints import Endpoints
from tether.client.errors import (
    ConnectionFailedError,
    ConversationBusyError,
    RecoveryError,
    TetherHTTPError,
    TurnFailedError,
    TurnOutcomeUnknownError,
    error_from_response,
)
from tether.client.events import ErrorEvent, MessageEvent, QueuedEvent, StatusEvent, decode
from tether.client.held_message import STREAM_MODE, StreamedMessage, goes_backwards, taken_back
from tether.client.models import TurnStatus, TurnUpdate
from tether.client.observer import Connection, TurnObserver
from tether.client.replica_questions import RETRYABLE_STATUSES, ReplicaQuestions, Unreachable
from tether.client.sse import SSEEvent, iter_sse
from tether.client.turn_events import (
    MessageDropped,
    MessageShown,
    Recovering,
    RecoveryCause,
    StreamFailure,
    StreamOpened,
    TurnEnded,
    TurnEvent,
    TurnKnown,
    TurnQueued,
)
from tether.domain.chat_message import ChatMessage
from tether.handlers.turn_ends import ending_of

_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 1.0
_ASK_AGAIN = frozenset({404, 409, 410, *RETRYABLE_STATUSES})
"""Refusals of an attach or a resume that the status explains: not found here
yet (404), live or taken over (409), ended (410), or this replica cannot serve."""
_TRANSIENT_STREAM_ERRORS = frozenset({"STORE_UNAVAILABLE"})
"""``event: error`` codes that end the stream but not the turn: attach again."""


@dataclass
class TurnKnowledge:
    """What the client knows of its turn."""

    session_id: str
    message_id: str | None = None
    last_event_id: str | None = None
    last_index: int | None = None
    latest: TurnUpdate | None = None
    outcome: str | None = None
    """done or cancelled, once the turn ended that way."""
    queued: bool = False
    """The server queued the turn behind others (``multitask_strategy="enqueue"``)."""
    queue_position: int | None = None
    """Its place in line (1: next) when the client last heard it waited."""
    path: list[str] = field(default_factory=list)
    """Each connection's label, and ``transcript`` when the answer came from there."""
    dropped_updates: int = 0
    """Updates not shown because their text does not extend the answer shown."""
    dropped_characters: int = 0
    """The characters of the answer shown they would have taken back."""
    connections: list[Connection] = field(default_factory=list)


@dataclass(frozen=True)
class Timeouts:
    stream: httpx2.Timeout
    control: httpx2.Timeout
    recovery: float
    """Seconds without a new message after which recovering gives up."""
    patience: float
    """Seconds a new turn or a plain request may find no replica to take it (no
    URL reachable, every replica draining) before the client says so, rather
    than wait as long as for a recovery."""


@dataclass(frozen=True)
class _ReadTranscript:
    """The decision to take the answer from the transcript: the stream is gone.
    ``displaced``: a newer turn holds the conversation."""

    displaced: bool = False


class Accepted:
    """What ``TurnDriver.run`` yields, once, when a replica accepted the new
    turn: started it (201) or queued it (202, after its ``queued`` event).
    ``Turn.start`` waits for it; iterating skips it."""


ACCEPTED = Accepted()


class _StillQueued:
    """The transcript still holds the turn's queued message: attach again."""


class TurnDriver:
    """Runs one turn's client side: start it (or pick it up), read it, recover
    it, until it ends. ``run()`` yields each new message."""

    def __init__(
        self,
        *,
        http: httpx2.AsyncClient,
        endpoints: Endpoints,
        tenant: str,
        state: TurnKnowledge,
        timeouts: Timeouts,
        start: routes.Route | None = None,
        agent_identifier: str | None = None,
        user_message: str | None = None,
        own_session: bool = False,
        multitask_strategy: str = "reject",
        recoverable: bool = True,
        headers: dict[str, str] | None = None,
        observer: TurnObserver | None = None,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.http = http
        self.endpoints = endpoints
        self.tenant = tenant
        self.state = state
        self.timeouts = timeouts
        self.agent_identifier = agent_identifier
        self.observer = observer or TurnObserver()
        self.headers = dict(headers or {})
        """Sent with every request: the caller's identity."""
        self._ask = ReplicaQuestions(http, tenant, self.headers, timeouts.control)
        self.recoverable = recoverable
        self._start = start
        self._user_message = user_message
        self._own_session = own_session
        self._strategy = multitask_strategy
        self._maybe_started = False
        """A start was sent and its answer lost: a turn may exist."""
        self._accepted = False
        """``ACCEPTED`` was yielded."""
        self._backoff = Backoff(_FIRST_PAUSE, _LONGEST_PAUSE, random=random)
        self._deadline = time.monotonic() + timeouts.recovery
        self.sink: Callable[[TurnEvent], None] | None = None
        """Hears every ``TurnEvent`` besides the observer (``Turn.events``)."""
        self._announced: str | None = None
        """The message id of the last ``turn`` event."""
        self._waits_at: int | None = None
        """The place in the queue of the turn the next stream attaches to: told
        as a ``queued`` event once that stream is open."""

    @property
    def starts(self) -> bool:
        """Whether this driver sends a new turn (rather than follow one)."""
        return self._start is not None

    async def run(self) -> AsyncGenerator[TurnUpdate | Accepted, None]:
        self._progress()  # the recovery bound counts from the first request
        request: routes.Route | None = self._start
        url: str | None = None
        while True:
            if request is None:
                decided = await self._decide()
                if isinstance(decided, _ReadTranscript):
                    ending = await self._from_transcript(displaced=decided.displaced)
                    if isinstance(ending, _StillQueued):
                        await self._wait()
                        continue
                    if ending is not None:
                        yield ending
                    return
                request, url = decided
            elif url is None:
                url = await self._usable_url()
            connection = Connection(request.kind, url, time.monotonic())
            async for update in self._read(request, connection):
                yield update
            if self._finished(connection):
                return
            if request.kind == "start":
                request, url = await self._after_start(request, connection)
                if self.state.message_id is not None and not self._accepted:
                    # A lost start found to have started (or queued) the turn.
                    self._accepted = True
                    yield ACCEPTED
                continue
            refusal = connection.refusal
            if refusal is not None and refusal.status_code == 410 and request.kind == "attach":
                # The stream is gone (cleaned up after the grace period, or
                # replaced): what is left of the turn is its transcript.
                ending = await self._from_transcript()
                if isinstance(ending, _StillQueued):
                    request = url = None
                    await self._wait()
                    continue
                if ending is not None:
                    yield ending
                return
            if refusal is not None and refusal.status_code not in _ASK_AGAIN:
                raise refusal
            self._recovering(connection)
            if connection.failure is not None or self._retryable(connection):
                self.endpoints.failed(connection.url)
            request = url = None
            await self._wait()

    # ------------------------------------------------------------ one stream

    async def _read(
        self, request: routes.Route, connection: Connection
    ) -> AsyncIterator[TurnUpdate | Accepted]:
        state, observer = self.state, self.observer
        state.connections.append(connection)
        observer.opened(connection)
        try:
            async with self.http.stream(
                request.method,
                request.url(connection.url),
                timeout=self.timeouts.stream,
                **request.options(self.headers),
            ) as response:
                connection.status_code = response.status_code
                connection.headers = {k.lower(): v for k, v in response.headers.items()}
                observer.responded(connection)
                if response.status_code >= 300:
                    await response.aread()
                    connection.refusal = error_from_response(
                        response.status_code, response.text, response.headers
                    )
                    return
                if request.kind == "start":
                    state.message_id = response.headers.get(routes.MESSAGE_ID_HEADER)
                    state.queued = state.queued or response.status_code == 202
                self._announce()
                self._emit(StreamOpened(request.kind, connection.url))
                if self._waits_at is not None and state.message_id is not None:
                    self._emit(TurnQueued(state.message_id, self._waits_at))
                self._waits_at = None
                if request.kind == "start":
                    if response.status_code != 202 and not self._accepted:
                        # Started at once; a 202 (queued) is accepted with
                        # its ``queued`` event, which says where it waits.
                        self._accepted = True
                        yield ACCEPTED
                streamed = StreamedMessage()
                async for sse in iter_sse(response):
                    observer.received(connection, sse)
                    update = self._apply(connection, sse, streamed)
                    if update is not None:
                        yield update
        except httpx2.TransportError as failure:
            connection.failure = failure
        finally:
            connection.closed_at = time.monotonic()
            state.path.append(connection.label)
            observer.closed(connection)
            if state.queued and state.latest is None and connection.refusal is None:
                # A wait in the queue, however long, was no failure: the
                # recovery bound counts from the end of it.
                self._progress()

    def _apply(
        self, connection: Connection, sse: SSEEvent, streamed: StreamedMessage
    ) -> TurnUpdate | Accepted | None:
        event = decode(sse)
        state = self.state
        if isinstance(event, QueuedEvent):
            if state.message_id is None and event.message_id:
                state.message_id = event.message_id
            self._waits(event.position)
            self._announce()
            self._emit(TurnQueued(state.message_id or event.message_id, event.position))
            if not self._accepted:
                self._accepted = True
                return ACCEPTED
        elif isinstance(event, StatusEvent):
            connection.verdict = event.reason
        elif isinstance(event, ErrorEvent):
            connection.error = event
        elif isinstance(event, MessageEvent):
            if state.message_id is None:
                state.message_id = event.message_id
            if event.message_id != state.message_id:
                return None
            self._announce()
            # Every event counts for the stream's message, shown or not: a
            # delta applies to the one before it.
            message = streamed.apply(event.data)
            if event.index is not None and state.last_index is not None:
                if event.index <= state.last_index:
                    return None  # seen already: never show anything twice
            state.last_index = event.index if event.index is not None else state.last_index
            state.last_event_id = event.event_id
            self._progress()
            if message is None:
                return None
            update = _update(message, event.index, event.event_id, state)
            if state.latest is not None and goes_backwards(state.latest.message, message):
                self.observer.dropped(connection, update, state.latest)
                shown = state.latest.message
                state.dropped_updates += 1
                state.dropped_characters += taken_back(shown, message)
                self._emit(MessageDropped(message, shown, event.event_id, event.index))
                return None
            state.latest = update
            self._emit(MessageShown(message, event.event_id, event.index))
            return update
        return None

    def _finished(self, connection: Connection) -> bool:
        """Whether the stream told the turn's end (raises for an errored one)."""
        if connection.failure is not None or connection.refusal is not None:
            return False
        error = connection.error
        if error is not None and error.code in _TRANSIENT_STREAM_ERRORS:
            return False
        if connection.verdict == "errored" or error is not None:
            self._end("errored", error)
            failed = error or ErrorEvent("ERRORED", "the turn ended errored")
            raise TurnFailedError(failed.code, failed.message, message_id=self.state.message_id)
        if connection.verdict in (None, "done"):
            # A clean close of a live stream is the answer's end (design §3).
            self._end("done")
            return True
        if connection.verdict == "cancelled":
            self._end("cancelled")
            return True
        return False  # dead, gone, or a verdict this client does not know: ask

    @staticmethod
    def _retryable(connection: Connection) -> bool:
        refusal = connection.refusal
        return refusal is not None and refusal.status_code in RETRYABLE_STATUSES

    # ---------------------------------------------------------- a new turn

    async def _after_start(
        self, request: routes.Route, connection: Connection
    ) -> tuple[routes.Route | None, str | None]:
        """What follows a start: recovery once it streamed, a retry when it was
        refused before anything started, else the question whether it started."""
        refusal, failure = connection.refusal, connection.failure
        if refusal is None and connection.status_code is not None:
            # It started; its stream broke or ended dead: recover it.
            self._recovering(connection)
            if self.state.message_id is None:
                self._maybe_started = True
                return await self._adopt(request)
            if failure is not None:
                self.endpoints.failed(connection.url)
            await self._wait()
            return None, None
        if isinstance(failure, httpx2.ConnectError | httpx2.ConnectTimeout) or (
            refusal is not None and refusal.status_code == 503
        ):
            # Never reached a replica, or one refused it before claiming anything.
            first_start = self.state.connections[0].opened_at
            if time.monotonic() - first_start > self.timeouts.patience:
                if refusal is not None:
                    raise refusal
                raise ConnectionFailedError(
                    f"no replica accepted the turn within {self.timeouts.patience:.0f} s "
                    f"(last tried {connection.url})"
                ) from failure
            self.endpoints.failed(connection.url)
            await self._wait(refusal.retry_after if refusal is not None else None)
            return request, None
        if isinstance(refusal, ConversationBusyError) and not self._maybe_started:
            raise refusal
        if refusal is not None and refusal.status_code not in (409, 502, 504):
            raise refusal
        # Sent, and its answer lost (or a proxy's 502/504, or a 409 after such a
        # loss): the turn may have started. The status tells.
        self._maybe_started = True
        self.endpoints.failed(connection.url)
        await self._wait()
        return await self._adopt(request)

    async def _adopt(self, request: routes.Route) -> tuple[routes.Route | None, str | None]:
        """After a start whose answer was lost: send it again if no turn started,
        follow the turn that did if it answers this client's message."""
        while True:
            url = await self._usable_url()
            try:
                status = await self._ask.status(url, self.state.session_id)
            except Unreachable:
                self.endpoints.failed(url)
                await self._wait()
                continue
            if status is None:
                return request, url  # nothing started: send it again
            queued = self._queued_message(status)
            if queued is not None:
                self.state.message_id = queued
                self._waits(status.queue_position(queued))
                self._waits_at = self.state.queue_position
                return self._attach(), url
            if await self._ours(url, status.message_id):
                self.state.message_id = status.message_id
                return await self._continuation(status, url)
            raise TurnOutcomeUnknownError(
                f"the request for a new turn was lost, and the conversation's turn "
                f"{status.message_id} cannot be told to answer it"
            )

    def _queued_message(self, status: TurnStatus) -> str | None:
        """The queued turn of this client's lost enqueue: the last one waiting,
        when it is this client's message (in a session the client made up, any)."""
        if self._strategy != "enqueue" or not status.queue:
            return None
        last = status.queue[-1]
        if self._own_session or last.content == (self._user_message or ""):
            return last.message_id
        return None

    async def _ours(self, url: str, message_id: str) -> bool:
        """Whether turn ``message_id`` answers this client's new message."""
        if self._own_session:
            return True  # a session id this client made up: nobody else's turn
        try:
            conversation = await self._ask.conversation(url, self.state.session_id)
        except (Unreachable, TetherHTTPError):
            return False
        users = [m for m in (conversation.messages if conversation else []) if m.sender == "user"]
        return bool(users) and (
            users[-1].message_id == f"{message_id}-user"
            and users[-1].content == (self._user_message or "")
        )

    # ------------------------------------------------------------- recovery

    async def _decide(self) -> tuple[routes.Route, str] | _ReadTranscript:
        """Ask a replica where the turn stands; the request that continues it."""
        state = self.state
        assert state.message_id is not None, "recovery needs the turn's message id"
        if not self.recoverable:
            raise RecoveryError(
                f"the stream of turn {state.message_id} broke, and a turn that is not "
                "stateful cannot be recovered",
                message_id=state.message_id,
            )
        while True:
            url = await self._usable_url()
            try:
                status = await self._ask.status(url, self.state.session_id)
            except Unreachable as unreachable:
                self._emit(Recovering(unreachable.cause, unreachable.__cause__))
                self.endpoints.failed(url)
                await self._wait()
                continue
            if status is not None and status.message_id == state.message_id:
                return await self._continuation(status, url)
            position = status.queue_position(state.message_id) if status is not None else None
            if position is not None:
                # Still waiting its turn: the attach waits for it to start.
                self._waits(position)
                self._waits_at = position
                return self._attach(), url
            return _ReadTranscript(displaced=status is not None)

    async def _continuation(self, status: TurnStatus, url: str) -> tuple[routes.Route, str]:
        """The request that continues the turn, given its status at ``url``."""
        state = self.state
        assert state.message_id is not None
        if status.status == "dead":
            agent = self.agent_identifier or await self._ask.agent(url, self.state.session_id)
            if agent is not None:
                route = routes.resume(
                    self.tenant,
                    agent_identifier=agent,
                    message_id=state.message_id,
                    session_id=state.session_id,
                    stream_mode=STREAM_MODE,
                )
                return route, url
        # Running (or dead, with no agent to resume it as: a replica will take
        # it over, and the follower waits for it), or ended: the rest of its
        # stream and its verdict.
        return self._attach(), url

    def _attach(self) -> routes.Route:
        state = self.state
        assert state.message_id is not None
        return routes.attach(
            self.tenant,
            message_id=state.message_id,
            session_id=state.session_id,
            last_event_id=state.last_event_id,
            stream_mode=STREAM_MODE,
        )

    def _waits(self, position: int | None) -> None:
        """The turn waits in the conversation's queue: waiting is no failure,
        so the recovery bound counts from now."""
        self.state.queued = True
        self.state.queue_position = position
        self._progress()

    async def _from_transcript(
        self, *, displaced: bool = False
    ) -> TurnUpdate | _StillQueued | None:
        """The turn's end from the transcript, its stream being gone: its
        answer when the client had not seen it whole (else None, the outcome
        set), or ``_StillQueued`` when its message still waits. ``displaced``:
        the status named a newer turn."""
        state = self.state
        while True:
            url = await self._usable_url()
            try:
                conversation = await self._ask.conversation(url, self.state.session_id)
                break
            except Unreachable as unreachable:
                self._emit(Recovering(unreachable.cause, unreachable.__cause__))
                self.endpoints.failed(url)
                await self._wait()
        messages = conversation.messages if conversation else []
        ids = {m.message_id for m in messages}
        if f"{state.message_id}-queued" in ids and f"{state.message_id}-user" not in ids:
            self._waits(state.queue_position)
            return _StillQueued()
        state.path.append("transcript")
        self._announce()
        answer = next((m for m in messages if m.message_id == state.message_id), None)
        if answer is None:
            if displaced or (state.queued and f"{state.message_id}-user" not in ids):
                # A newer turn took the conversation before this one recorded
                # an answer (an interrupt or a rollback, a cancel), or it left
                # the queue without starting: cancelled (or dropped, for it
                # could never run), as its own stream would have said.
                self._end("cancelled")
                return None
            raise RecoveryError(
                f"turn {state.message_id} is no longer known and left no answer",
                message_id=state.message_id,
            )
        # The answer says how its turn ended (``handlers.turn_ends``): the
        # verdict its own stream would have told.
        ending = ending_of(answer)
        if ending.reason == "errored":
            failure = StreamFailure(
                ending.error_code or "ERRORED", ending.error_message or "the turn ended errored"
            )
            self._end("errored", failure)
            raise TurnFailedError(failure.code, failure.message, message_id=state.message_id)
        latest = state.latest
        update: TurnUpdate | None = None
        if latest is None or latest.message != answer:
            # The answer the conversation keeps, shown even where it does not
            # extend what a stream showed: the transcript is what stays.
            update = _update(answer, None, None, state)
            state.latest = update
            self._emit(MessageShown(answer, None, None))
        self._end("done" if ending.reason == "done" else "cancelled")
        return update

    # ---------------------------------------------------------------- events

    def _emit(self, event: TurnEvent) -> None:
        self.observer.event(event)
        if self.sink is not None:
            self.sink(event)

    def _announce(self) -> None:
        """A ``turn`` event, once per turn followed, before anything else of it."""
        message_id = self.state.message_id
        if message_id is not None and message_id != self._announced:
            self._announced = message_id
            self._emit(TurnKnown(message_id))

    def _end(
        self, reason: Literal["done", "errored", "cancelled"], error: ErrorEvent | None = None
    ) -> None:
        """The turn's end: its outcome (done, cancelled) and the ``end`` event."""
        if reason != "errored":
            self.state.outcome = reason
        self._announce()
        self._emit(TurnEnded(reason, error))

    def _recovering(self, connection: Connection) -> None:
        """The ``recovering`` event for a stream that did not tell the turn's end."""
        failure, refusal = connection.failure, connection.refusal
        cause: RecoveryCause
        error: BaseException | StreamFailure | None
        if failure is not None:
            refused = connection.status_code is None and isinstance(
                failure, httpx2.ConnectError | httpx2.ConnectTimeout
            )
            cause, error = ("unreachable" if refused else "disconnected"), failure
        elif refusal is not None:
            retryable = refusal.status_code in RETRYABLE_STATUSES
            cause, error = ("unavailable" if retryable else "refused"), refusal
        elif connection.verdict in ("dead", "gone"):
            cause, error = ("dead" if connection.verdict == "dead" else "gone"), connection.error
        else:
            cause, error = "interrupted", connection.error
        self._emit(Recovering(cause, error))

    # ---------------------------------------------------------------- pacing

    async def _usable_url(self) -> str:
        while (url := self.endpoints.current()) is None:
            await self._wait()
        return url

    async def _wait(self, at_least: float | None = None) -> None:
        """Pause before the next attempt; give up past the recovery bound."""
        if time.monotonic() > self._deadline:
            raise RecoveryError(
                f"no replica served turn {self.state.message_id or '(not started)'} "
                f"for {self.timeouts.recovery:.0f} s (path: {' > '.join(self.state.path)})",
                message_id=self.state.message_id,
            )
        await asyncio.sleep(self._backoff.next(at_least))

    def _progress(self) -> None:
        self._backoff.reset()
        self._deadline = time.monotonic() + self.timeouts.recovery


def _update(
    message: ChatMessage, index: int | None, event_id: str | None, state: TurnKnowledge
) -> TurnUpdate:
    return TurnUpdate(
        message=message,
        index=index,
        event_id=event_id,
        message_id=state.message_id or "",
        session_id=state.session_id,
        data=message.model_dump(mode="json", exclude_none=True),
    )
