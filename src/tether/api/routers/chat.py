"""Chat routes: a turn as one JSON body, a turn as a stream, attach, status, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from sse_starlette import EventSourceResponse

from tether.api.forms import ChatResponseBody, ChatResponseForm, ErrorBody, StreamStatusBody
from tether.api.identity import request_identity
from tether.api.ids import MessageIdPath, OptionalSessionQuery, SessionQuery, TenantQuery
from tether.api.sse import frame, parse_last_event_id
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import TurnEndedError, TurnRequestError

router = APIRouter(tags=["chat"])

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (400, 403, 404, 409, 410, 413, 503)
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
    the bot's message appended (the SDK's shape), that message's fields beside it."""
    turn = await _handler(request).start_turn(_chat_request(tenant, form, request))
    response.headers[MESSAGE_ID_HEADER] = turn.message_id
    assert turn.task is not None
    await turn.task
    end = turn.buffer.end
    if end is not None and end.reason == "errored":
        raise _TurnFailedError(end.error_code or "INTERNAL", end.error_message or "turn failed")
    if end is not None and end.reason != "done":
        raise TurnEndedError(f"the turn ended {end.reason}")
    latest = turn.buffer.latest
    answer = (
        latest.message
        if latest is not None
        else ChatMessage(sender=ChatMessageSender.BOT, message_id=turn.message_id)
    )
    return ChatResponseBody(
        **answer.model_dump(),
        agent_identifier=form.agent_identifier,
        conversation=[*form.conversation, answer],
        conversation_context=form.conversation_context,
        bot_params=form.bot_params,
    )


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
    message_id: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
) -> EventSourceResponse:
    """Run a turn, streamed as SSE. ``resume=true&message_id=M`` takes over dead turn M."""
    if resume and not message_id:
        raise TurnRequestError("resume=true needs the message_id of the turn to resume")
    handler = _handler(request)
    turn = await handler.start_turn(
        _chat_request(tenant, form, request), resume_message_id=message_id if resume else None
    )
    return EventSourceResponse(
        frame(turn.message_id, turn.buffer.follow(0), live=True),
        status_code=201,
        headers={MESSAGE_ID_HEADER: turn.message_id},
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
    )


@router.get("/chat/stream/{message_id}", responses=_ERRORS)
async def chat_stream_attach(
    tenant: TenantQuery,
    message_id: MessageIdPath,
    request: Request,
    session_id: OptionalSessionQuery = None,
    start_index: Annotated[int, Query(ge=0, le=10**9)] = 0,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """Attach to a turn: every event from ``start_index`` (or after ``Last-Event-ID``)."""
    resumed_from = parse_last_event_id(last_event_id, message_id)
    if resumed_from is not None:
        start_index = resumed_from
    identity = request_identity(request)
    events, live = await _handler(request).attach(
        tenant, identity.requester_uuid, session_id, message_id, start_index
    )
    return EventSourceResponse(
        frame(message_id, events, live=live), shutdown_grace_period=SHUTDOWN_GRACE_SECONDS
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
