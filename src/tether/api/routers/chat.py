"""Chat routes: a turn as one JSON body, a turn as a stream, attach, status, cancel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from tether.api.forms import (
    ChatResponseBody,
    ChatResponseForm,
    ErrorBody,
    QueuedTurnBody,
    StreamStatusBody,
)
from tether.api.identity import request_identity
from tether.api.ids import (
    ID_PATTERN,
    MAX_ID_LENGTH,
    MessageIdPath,
    OptionalSessionQuery,
    SessionQuery,
    TenantQuery,
)
from tether.api.sse import MAX_START_INDEX, frame, parse_last_event_id
from tether.api.stream_mode import StreamMode, StreamModeQuery
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import TurnEndedError, TurnRequestError
from tether.handlers.queue import Ticket
from tether.handlers.turn import Turn
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

router = APIRouter(tags=["chat"])

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (400, 403, 404, 409, 410, 413, 429, 503)
}
MESSAGE_ID_HEADER = "X-Tether-Message-Id"
SHUTDOWN_GRACE_SECONDS = 1.0
"""When the server shuts down, a stream still being written (the verdict of a
turn the drain just handed off) gets this long to finish before it is cut."""


def _handler(request: Request) -> ChatHandler:
    handler: ChatHandler = request.app.state.chat_handler
    return handler


def _chat_request(tenant: str, form: ChatResponseForm, request: Request) -> ChatRequest:
    return ChatRequest(
        tenant=tenant,
        request_headers=request_identity(request),
        agent_identifier=form.agent_identifier,
        conversation=form.conversation,
        conversation_context=form.conversation_context,
        bot_params=form.bot_params,
        stateful=form.stateful,
        session_id=form.session_id,
        multitask_strategy=form.multitask_strategy,
    )


@router.post("/chat/response", status_code=201, response_model=ChatResponseBody, responses=_ERRORS)
@router.post(
    "/chats/responses",
    status_code=201,
    response_model=ChatResponseBody,
    responses=_ERRORS,
    include_in_schema=False,
)
async def chat_response(
    tenant: TenantQuery, form: ChatResponseForm, request: Request, response: Response
) -> ChatResponseBody:
    """Run a turn and answer as one JSON body: the request's conversation with
    the bot's message appended (the SDK's shape), that message's fields beside it.
    An enqueued turn is answered when it has run, wherever it ran."""
    handler = _handler(request)
    started = await _start(handler, _chat_request(tenant, form, request))
    if isinstance(started, Ticket):
        message_id = started.message_id
        requester = request_identity(request).requester_uuid
        events, _ = await handler.attach(tenant, requester, form.session_id, message_id, 0)
        # Followed from another replica, the turn's end is settled by the
        # transcript once its row names the next queued turn (``Lease.pass_on``).
        latest, end = await _last_of(events)
    else:
        message_id = started.message_id
        assert started.task is not None
        await started.task
        end = started.buffer.end
        latest = started.buffer.latest.message if started.buffer.latest is not None else None
    response.headers[MESSAGE_ID_HEADER] = message_id
    if end is not None and end.reason is EndReason.ERRORED:
        raise _TurnFailedError(end.error_code or "INTERNAL", end.error_message or "turn failed")
    if end is not None and end.reason is not EndReason.DONE:
        raise TurnEndedError(f"the turn ended {end.reason}")
    answer = latest or ChatMessage(sender=ChatMessageSender.BOT, message_id=message_id)
    return ChatResponseBody(
        **answer.model_dump(),
        agent_identifier=form.agent_identifier,
        conversation=[*form.conversation, answer],
        conversation_context=form.conversation_context,
        bot_params=form.bot_params,
    )


async def _start(handler: ChatHandler, chat_request: ChatRequest) -> Turn | Ticket:
    """Start the turn, or queue it (``multitask_strategy="enqueue"``)."""
    if chat_request.multitask_strategy == "enqueue":
        return await handler.queue.submit(chat_request)
    return await handler.start_turn(chat_request)


async def _last_of(
    events: AsyncIterator[StreamEvent | StreamEnd],
) -> tuple[ChatMessage | None, StreamEnd | None]:
    """The last message of a followed turn, and how it ended."""
    latest: ChatMessage | None = None
    async for item in events:
        if isinstance(item, StreamEvent):
            latest = item.message
        else:
            return latest, item
    return latest, None


class _TurnFailedError(TurnRequestError):
    status_code = 500

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@router.post("/chat/stream", status_code=201, responses=_ERRORS)
async def chat_stream(
    tenant: TenantQuery,
    form: ChatResponseForm,
    request: Request,
    resume: bool = False,
    message_id: Annotated[
        str | None, Query(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)
    ] = None,
    stream_mode: StreamModeQuery = StreamMode.CUMULATIVE,
) -> EventSourceResponse:
    """Run a turn, streamed as SSE. ``resume=true&message_id=M`` takes over dead turn M.
    ``stream_mode=delta``: after the first, events carry only the text appended.

    With ``multitask_strategy=enqueue`` on a busy conversation the answer is a
    202 at once, naming the queued turn (header and a first ``queued`` event),
    whose events follow when it starts."""
    if resume and not message_id:
        raise TurnRequestError("resume=true needs the message_id of the turn to resume")
    handler = _handler(request)
    chat_request = _chat_request(tenant, form, request)
    if resume:
        turn = await handler.start_turn(chat_request, resume_message_id=message_id)
    else:
        started = await _start(handler, chat_request)
        if isinstance(started, Ticket):
            return await _queued_stream(handler, chat_request, started, stream_mode)
        turn = started
    return EventSourceResponse(
        frame(turn.message_id, turn.buffer.follow(0), stream_mode),
        status_code=201,
        headers={MESSAGE_ID_HEADER: turn.message_id},
        shutdown_grace_period=SHUTDOWN_GRACE_SECONDS,
    )


async def _queued_stream(
    handler: ChatHandler, chat_request: ChatRequest, ticket: Ticket, mode: StreamMode
) -> EventSourceResponse:
    events, _ = await handler.attach(
        chat_request.tenant,
        chat_request.request_headers.requester_uuid,
        chat_request.session_id,
        ticket.message_id,
        0,
    )

    async def queued_then_events() -> AsyncIterator[ServerSentEvent]:
        yield ServerSentEvent(
            data=json.dumps({"message_id": ticket.message_id, "position": ticket.position}),
            event="queued",
        )
        async for event in frame(ticket.message_id, events, mode):
            yield event

    return EventSourceResponse(
        queued_then_events(),
        status_code=202,
        headers={MESSAGE_ID_HEADER: ticket.message_id},
        shutdown_grace_period=SHUTDOWN_GRACE_SECONDS,
    )


@router.get("/chat/stream/status", response_model=StreamStatusBody, responses=_ERRORS)
async def chat_stream_status(
    tenant: TenantQuery, session_id: SessionQuery, request: Request
) -> StreamStatusBody:
    """Which turn occupies the conversation, and whether it is running, done or dead."""
    identity = request_identity(request)
    status = await _handler(request).status(tenant, identity.requester_uuid, session_id)
    return StreamStatusBody(
        session_id=session_id,
        message_id=status.message_id,
        status=status.status,
        epoch=status.epoch,
        heartbeat_at=status.heartbeat_at.isoformat() if status.heartbeat_at else None,
        queue=[
            QueuedTurnBody(
                message_id=entry.message_id,
                enqueued_at=entry.mark.enqueued_at.isoformat(),
                content=entry.message.content,
            )
            for entry in status.queue
        ],
    )


@router.get("/chat/stream/{message_id}", responses=_ERRORS)
async def chat_stream_attach(
    tenant: TenantQuery,
    message_id: MessageIdPath,
    request: Request,
    session_id: OptionalSessionQuery = None,
    start_index: Annotated[int, Query(ge=0, le=MAX_START_INDEX)] = 0,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    stream_mode: StreamModeQuery = StreamMode.CUMULATIVE,
) -> EventSourceResponse:
    """Attach to a turn: every event from ``start_index`` (or after ``Last-Event-ID``).
    ``stream_mode=delta``: after the first, events carry only the text appended."""
    resumed_from = parse_last_event_id(last_event_id, message_id)
    if resumed_from is not None:
        start_index = resumed_from
    identity = request_identity(request)
    events, _ = await _handler(request).attach(
        tenant, identity.requester_uuid, session_id, message_id, start_index
    )
    return EventSourceResponse(
        frame(message_id, events, stream_mode), shutdown_grace_period=SHUTDOWN_GRACE_SECONDS
    )


@router.delete("/chat/stream/{message_id}", status_code=204, responses=_ERRORS)
async def chat_stream_cancel(
    tenant: TenantQuery,
    message_id: MessageIdPath,
    request: Request,
    session_id: OptionalSessionQuery = None,
) -> Response:
    """Cancel a turn, from any replica; the partial answer is kept. Without
    ``session_id`` the turn is found by its message id among the requester's own."""
    identity = request_identity(request)
    await _handler(request).cancel(tenant, identity.requester_uuid, session_id, message_id)
    return Response(status_code=204)
