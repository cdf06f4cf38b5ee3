"""The AI SDK's chat protocol: a front end built on ``useChat`` uses tether as its backend.

``DefaultChatTransport({api: '/ai-sdk/chat?tenant=T'})`` talks to these routes
as it talks to any AI SDK server, with no custom code:

- ``POST /ai-sdk/chat``: the transport's request (``id``: the conversation,
  which is tether's ``session_id``; ``messages``; ``trigger``), plus the body
  fields a front end may add: ``agent_identifier`` (default: the first agent
  set up), ``bot_params``, ``conversation_context``. It starts a stateful turn
  and answers the UI message stream (``x-vercel-ai-ui-message-stream: v1``).
- ``GET /ai-sdk/chat/{id}/stream``: the transport's reconnect (``useChat``
  with ``resume: true``). Replays the conversation's running turn from its
  start, then follows it live, from any replica; 204 when nothing runs.
- ``POST /ai-sdk/chat/{id}/stop`` (a JSON body, ``{}``): cancels the
  conversation's running turn, from any replica (the stop endpoint the AI
  SDK's documentation asks a resumable front end to add; ``stop()`` alone
  only closes the connection).
- ``GET /ai-sdk/chat/{id}/messages``: the stored transcript as ``UIMessage``s,
  a front end's initial ``messages`` after a reload.

Closing the connection never cancels a turn: a reload, a lost network or a
closed tab must not lose the answer, and the reconnect picks it up. Only the
stop route (or ``DELETE /chat/stream/{message_id}``) cancels.

Underneath it is the same turn as ``POST /chat/stream``: the same lease,
fencing, recording, takeover after the producer dies; only the framing differs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.api.ai_sdk_parts import (
    DONE,
    HEADERS,
    Part,
    UIMessageStreamParts,
    error_part,
    ui_message,
)
from tether.api.forms import ErrorBody, RequestBody
from tether.api.identity import request_identity
from tether.api.ids import ID_PATTERN, MAX_ID_LENGTH, SessionPath, TenantQuery
from tether.api.validation_errors import invalid_request
from tether.domain.chat_conversation_store import ConversationNotOwnedError
from tether.domain.chat_message import ChatMessage, ChatMessageSender, ConversationContext
from tether.domain.chat_request import ChatRequest
from tether.domain.store_errors import StoreUnavailableError
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import (
    ConversationBusyError,
    NotImplementedByStoreError,
    NotOwnerError,
    TurnEndedError,
    TurnNotFoundError,
    TurnRequestError,
    UnknownAgentError,
)
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/ai-sdk/chat", tags=["ai-sdk"])

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (400, 403, 404, 409, 413, 429, 501, 503)
}
_RUNNING = ("running", "dead")
"""Verdicts of a turn that is not over: a dead one is being taken over."""
_FOLLOW_AGAIN = 4
"""How often one stream follows its turn to a new producer (a takeover, a
fence) before it gives up and tells the client to reconnect."""
_STOP_TRIES = 3
_DRAINING = "this replica is shutting down and handed the answer on; reconnect to follow it"
SHUTDOWN_GRACE_SECONDS = 1.0
STOPPED_LINGER_SECONDS = 2.0
"""How long a stopped turn's stream stays open after its last part, unless
the client closes it first. The AI SDK's ``Chat`` reports a stop to
``onFinish`` (``isAbort: true``) only when ``stop()`` aborts a response still
being read; its documented stop is the stop endpoint, then ``stop()``, and a
stream that closed as soon as the endpoint cancelled the turn left ``stop()``
nothing to abort. Other readers of the turn (a second screen) have every part
by then, and only wait this long for the close."""


class UIMessageIn(BaseModel):
    """One of the AI SDK's ``UIMessage``s, as far as a turn needs it: its text."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]] = Field(default_factory=list)

    def text(self) -> str:
        return "\n\n".join(
            str(part["text"])
            for part in self.parts
            if part.get("type") == "text" and isinstance(part.get("text"), str)
        )


class AISDKChatBody(RequestBody):
    """``DefaultChatTransport``'s request body, and the fields a front end adds."""

    # The AI SDK merges the front end's own body fields in: ignore what we
    # do not read rather than refuse the request.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    id: str = Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)
    messages: list[UIMessageIn] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    message_id: str | None = Field(default=None, alias="messageId")
    agent_identifier: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    bot_params: dict[str, Any] | None = None
    conversation_context: ConversationContext | None = None


def _handler(request: Request) -> ChatHandler:
    handler: ChatHandler = request.app.state.chat_handler
    return handler


def _conversation(messages: list[UIMessageIn]) -> list[ChatMessage]:
    """The AI SDK's messages as tether's. System messages are left out: an
    agent's instructions are its own, never the browser's. With a conversation
    store the agent reads the stored transcript and only the last message (the
    user's new one) is taken from here."""
    return [
        ChatMessage(
            sender=ChatMessageSender.USER if m.role == "user" else ChatMessageSender.BOT,
            content=m.text(),
        )
        for m in messages
        if m.role != "system"
    ]


async def _agent(handler: ChatHandler, body: AISDKChatBody) -> str:
    if body.agent_identifier:
        return body.agent_identifier
    setups = await handler.registries.list_setups()
    if not setups:
        raise UnknownAgentError("no agent is set up on this server")
    return setups[0].agent_identifier


def _event(part: Part | str) -> ServerSentEvent:
    data = part if isinstance(part, str) else json.dumps(part, separators=(",", ":"))
    return ServerSentEvent(data=data)


def _response(parts: AsyncIterator[ServerSentEvent]) -> EventSourceResponse:
    return EventSourceResponse(parts, headers=HEADERS, shutdown_grace_period=SHUTDOWN_GRACE_SECONDS)


async def _ui_stream(
    handler: ChatHandler,
    tenant: str,
    requester: str | None,
    session_id: str,
    message_id: str,
    source: AsyncIterator[StreamEvent | StreamEnd],
) -> AsyncIterator[ServerSentEvent]:
    """The turn's snapshots as UI message stream parts, ending with ``[DONE]``.

    When the source ends because the turn moved to another producer (this
    replica was fenced, or the producer died and a replica is taking it over),
    the stream follows it there instead of ending: the client sees one answer.
    """
    parts = UIMessageStreamParts(message_id)
    for part in parts.start():
        yield _event(part)
    next_index = 0
    follows = 0
    end = StreamEnd(EndReason.DEAD)
    try:
        while True:
            end = StreamEnd(EndReason.DEAD)
            async for item in source:
                if isinstance(item, StreamEnd):
                    end = item
                    break
                next_index = item.index + 1
                for part in parts.update(item.message):
                    yield _event(part)
            moved = end.reason is EndReason.GONE or (
                end.reason is EndReason.DEAD and handler.takeovers.running
            )
            if moved and follows < _FOLLOW_AGAIN:
                follows += 1
                try:
                    source, _ = await handler.attach(
                        tenant, requester, session_id, message_id, next_index
                    )
                    continue
                except TurnRequestError as error:
                    logger.info("turn %s: cannot follow it further: %s", message_id, error)
            if end.reason is EndReason.DEAD and handler.draining:
                # A rolling deploy: another replica takes the turn over, but
                # this one is shutting down and cannot follow it there.
                end = StreamEnd(EndReason.DEAD, "REPLICA_DRAINING", _DRAINING)
            for part in parts.finish(end):
                yield _event(part)
            break
    except StoreUnavailableError:
        # After the 200 a failure is a part, not a status; the turn lives on.
        logger.warning("turn %s: stores unavailable while streaming", message_id)
        yield _event(error_part("STORE_UNAVAILABLE", "a store is unavailable; reconnect shortly"))
    yield _event(DONE)
    if end.reason is EndReason.CANCELLED:
        # Every part is sent; the client's own stop() closes the stream now
        # (its disconnect cancels this wait), or the linger runs out.
        await asyncio.sleep(STOPPED_LINGER_SECONDS)


@router.post("", responses=_ERRORS)
async def ai_sdk_chat(tenant: TenantQuery, body: AISDKChatBody, request: Request) -> Response:
    """Start a turn in conversation ``id`` and stream it as the UI message stream."""
    if body.trigger == "regenerate-message":
        raise TurnRequestError(
            "regenerate is not supported: the transcript keeps every answer; "
            "send the question again as a new message"
        )
    handler = _handler(request)
    identity = request_identity(request)
    turn = await handler.start_turn(
        ChatRequest(
            tenant=tenant,
            request_headers=identity,
            agent_identifier=await _agent(handler, body),
            conversation=_conversation(body.messages),
            conversation_context=body.conversation_context,
            bot_params=body.bot_params,
            stateful=True,
            session_id=body.id,
        )
    )
    return _response(
        _ui_stream(
            handler,
            tenant,
            identity.requester_uuid,
            body.id,
            turn.message_id,
            turn.buffer.follow(0),
        )
    )


@router.get(
    "/{session_id}/stream",
    responses={**_ERRORS, 204: {"description": "No turn is running in the conversation"}},
)
async def ai_sdk_reconnect(
    tenant: TenantQuery, session_id: SessionPath, request: Request
) -> Response:
    """The conversation's running turn, replayed from its start and then live,
    from any replica; 204 when no turn runs (the AI SDK then does not resume)."""
    handler = _handler(request)
    requester = request_identity(request).requester_uuid
    try:
        status = await handler.status(tenant, requester, session_id)
        if status.status not in _RUNNING:
            return Response(status_code=204)
        source, _ = await handler.attach(tenant, requester, session_id, status.message_id, 0)
    except (TurnNotFoundError, TurnEndedError):
        return Response(status_code=204)
    return _response(_ui_stream(handler, tenant, requester, session_id, status.message_id, source))


async def _json_only(request: Request) -> None:
    """Refuse any body but JSON (415), and JSON that is not an object (422).

    A cross-site HTML form can POST form-encoded or plain text with the
    user's cookies, but not ``application/json`` (that needs a CORS preflight
    the server never grants), so where a gateway identifies users by cookie a
    foreign page cannot stop their turns."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise StarletteHTTPException(
            415, "this route takes only a JSON body (Content-Type: application/json)"
        )
    body = await request.body()
    if not body.strip():
        return
    try:
        document = json.loads(body)
    except ValueError:
        raise invalid_request("body", "is not valid JSON") from None
    if not isinstance(document, dict):
        raise invalid_request("body", "must be a JSON object, such as {}")


@router.post(
    "/{session_id}/stop",
    status_code=204,
    responses={**_ERRORS, 415: {"model": ErrorBody}},
    dependencies=[Depends(_json_only)],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
async def ai_sdk_stop(tenant: TenantQuery, session_id: SessionPath, request: Request) -> Response:
    """Cancel the conversation's running turn, from any replica; the partial
    answer is kept. 204 also when nothing runs: a stop is idempotent. The body
    is JSON (``{}``): anything else is refused, so a cross-site form cannot
    stop a user's turn."""
    handler = _handler(request)
    requester = request_identity(request).requester_uuid
    for _ in range(_STOP_TRIES):
        try:
            status = await handler.status(tenant, requester, session_id)
            if status.status not in _RUNNING:
                break
            await handler.cancel(tenant, requester, session_id, status.message_id)
            break
        except (TurnNotFoundError, TurnEndedError):
            break  # over already, or replaced by a newer turn: nothing to stop
        except ConversationBusyError:
            continue  # the turn changed hands while cancelling (a takeover): again
    return Response(status_code=204)


@router.get("/{session_id}/messages", responses=_ERRORS)
async def ai_sdk_messages(
    tenant: TenantQuery, session_id: SessionPath, request: Request
) -> list[dict[str, Any]]:
    """The conversation's transcript as the AI SDK's ``UIMessage``s (``[]`` for
    a conversation that does not exist yet). A running turn's answer is not in
    it until it ends: the reconnect replays it."""
    store = _handler(request).stores.conversation
    if store is None:
        raise NotImplementedByStoreError("this server runs without a conversation store")
    requester = request_identity(request).requester_uuid
    try:
        transcript = await store.get_transcript(tenant, requester, session_id)
    except ConversationNotOwnedError as error:
        raise NotOwnerError("this conversation is private to its owner") from error
    return [ui_message(message) for message in transcript]
