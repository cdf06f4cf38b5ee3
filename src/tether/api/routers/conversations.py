"""Conversation routes: list your own, read (own or shared), share, delete.

Writes are owner-only; reads are the owner's or, for a shared conversation,
anyone's in the tenant. An adapter that implements only the seed's three
methods still serves chat turns; these routes then answer 501.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

from tether.api.forms import ErrorBody, RequestBody
from tether.api.identity import request_identity
from tether.api.ids import SessionPath, TenantQuery
from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationNotOwnedError,
    ConversationPage,
    ConversationSummary,
)
from tether.domain.chat_message import ChatMessage
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.erase import ERASE_NEEDS
from tether.handlers.errors import (
    NotImplementedByStoreError,
    NotOwnerError,
    TurnNotFoundError,
    TurnRequestError,
)

router = APIRouter(tags=["conversations"])

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (400, 403, 404, 501)
}
T = TypeVar("T")


class ConversationBody(BaseModel):
    conversation: ConversationSummary
    messages: list[ChatMessage]


class SharePatch(RequestBody):
    shared: bool


def _store(request: Request) -> ChatConversationStore:
    store: ChatConversationStore | None = request.app.state.stores.conversation
    if store is None:
        raise NotImplementedByStoreError("this server runs without a conversation store")
    return store


def _require(store: ChatConversationStore, what: str, *needs: Capability) -> None:
    """501 unless the store implements each of ``needs`` (optional methods)."""
    if not all(supports(store, need) for need in needs):
        raise NotImplementedByStoreError(f"the conversation store does not support {what}")


async def _call(operation: Awaitable[T], what: str) -> T:
    """Map the store's refusal to HTTP: not the owner is 403."""
    try:
        return await operation
    except ConversationNotOwnedError as error:
        raise NotOwnerError(f"you may not {what} this conversation") from error


@router.get("/conversations", response_model=ConversationPage, responses=_ERRORS)
async def list_conversations(
    tenant: TenantQuery,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None,
        # Every store's cursor is base64url: anything else is refused here,
        # before a store parses it.
        Query(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9_=-]+$"),
    ] = None,
) -> ConversationPage:
    """Your own conversations, most recently updated first."""
    requester = request_identity(request).requester_uuid
    store = _store(request)
    _require(store, "list", Capability.CONVERSATION_LIST)
    try:
        return await _call(store.list_conversations(tenant, requester, limit, cursor), "list")
    except ValueError as error:
        if cursor is None:
            raise
        # Stores refuse a cursor they did not hand out with ValueError; that is
        # the client's mistake, not the server's.
        raise TurnRequestError("the cursor is not one this server handed out") from error


@router.get("/conversations/{session_id}", response_model=ConversationBody, responses=_ERRORS)
async def get_conversation(
    tenant: TenantQuery, session_id: SessionPath, request: Request
) -> ConversationBody:
    """The conversation and its transcript, if it is yours or shared."""
    requester = request_identity(request).requester_uuid
    store = _store(request)
    _require(store, "read", Capability.CONVERSATION_GET)
    summary = await _call(store.get_conversation(tenant, requester, session_id), "read")
    if summary is None:
        raise TurnNotFoundError(f"no conversation {session_id!r}")
    messages = await _call(store.get_transcript(tenant, requester, session_id), "read")
    return ConversationBody(conversation=summary, messages=messages)


@router.patch("/conversations/{session_id}", response_model=ConversationSummary, responses=_ERRORS)
async def share_conversation(
    tenant: TenantQuery, session_id: SessionPath, patch: SharePatch, request: Request
) -> ConversationSummary:
    """Share the conversation with the tenant, or make it private again (owner only)."""
    requester = request_identity(request).requester_uuid
    store = _store(request)
    _require(store, "read", Capability.CONVERSATION_GET)
    if await _call(store.get_conversation(tenant, requester, session_id), "read") is None:
        raise TurnNotFoundError(f"no conversation {session_id!r}")
    _require(store, "share", Capability.CONVERSATION_SET_SHARED)
    await _call(store.set_shared(tenant, requester, session_id, patch.shared), "share")
    summary = await _call(store.get_conversation(tenant, requester, session_id), "read")
    assert summary is not None
    return summary


@router.delete(
    "/conversations/{session_id}",
    status_code=204,
    responses={**_ERRORS, 409: {"model": ErrorBody}},
)
async def delete_conversation(
    tenant: TenantQuery, session_id: SessionPath, request: Request
) -> Response:
    """Delete the conversation and everything it owns: transcript, checkpoint,
    recording and supervision row (owner only). While a turn runs in it: 409."""
    requester = request_identity(request).requester_uuid
    _require(_store(request), "delete", *ERASE_NEEDS)
    handler: ChatHandler = request.app.state.chat_handler
    erased = handler.erase(tenant, requester, session_id)
    if not await _call(erased, "delete"):
        raise TurnNotFoundError(f"no conversation {session_id!r}")
    return Response(status_code=204)
