"""How a turn's answer in the transcript says the way its turn ended.

A turn that ends ``done`` appends its answer as it is. One that ends
otherwise keeps what it had written (its partial answer: the producer's, or
the newest recorded one when another hand ended it: a cancel, an interrupt,
the reaper) with a context part saying why it stops there:

- ``{"turn_error": {"code", "message"}}``: errored, with the code and message
  a live reader got in the stream's ``error`` event;
- ``{"turn_cancelled": true}``: cancelled (a cancel, an interrupt).

And a tool call the answer stopped inside is closed with a result saying it
may or may not have happened, so the transcript is valid for every model
API. The transcript is then where a reader learns how a turn ended once its
supervision row names another turn (the next queued one, an interrupt's):
``ending_of``.
"""

from __future__ import annotations

from tether.domain.chat_conversation_store import LastTurnStatus
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartType,
    ToolCallStatus,
)
from tether.runtime.live_buffer import EndReason, StreamEnd

_CUT_OFF_CALL: dict[LastTurnStatus, str] = {
    "cancelled": "Cancelled before it completed: it may or may not have happened.",
    "errored": "The answer ended before it completed: it may or may not have happened.",
}


def kept_answer(
    partial: ChatMessage | None,
    status: LastTurnStatus,
    *,
    session_id: str | None,
    message_id: str,
    error: tuple[str, str] | None = None,
) -> ChatMessage | None:
    """What the transcript keeps of turn ``message_id``, which ended ``status``
    with ``partial`` written (None: nothing). An ``error`` (code, message) or a
    cancel is kept even with nothing written, as an empty answer: the
    transcript then says why the turn has none."""
    if partial is not None:
        partial = _closed_tool_calls(partial, _CUT_OFF_CALL.get(status, _CUT_OFF_CALL["errored"]))
    if error is not None:
        return _with_part(
            partial, session_id, message_id, {"turn_error": {"code": error[0], "message": error[1]}}
        )
    if status == "cancelled":
        # Kept even with nothing written, as an empty answer: every question
        # in the transcript has one verdict, so the next turn's model reads
        # user and assistant messages alternating.
        return _with_part(partial, session_id, message_id, {"turn_cancelled": True})
    return partial


def ending_of(answer: ChatMessage) -> StreamEnd:
    """How the turn whose answer this is ended (see the module)."""
    for part in answer.content_parts or []:
        context = part.context or {}
        error = context.get("turn_error")
        if isinstance(error, dict):
            return StreamEnd(EndReason.ERRORED, error.get("code"), error.get("message"))
        if context.get("turn_cancelled") is True:
            return StreamEnd(EndReason.CANCELLED)
    return StreamEnd(EndReason.DONE)


def _with_part(
    answer: ChatMessage | None, session_id: str | None, message_id: str, context: dict[str, object]
) -> ChatMessage:
    if answer is None:
        answer = ChatMessage(
            sender=ChatMessageSender.BOT, message_id=message_id, session_id=session_id
        )
    part = ContentPart(type=ContentPartType.CONTEXT, context=context)
    return answer.model_copy(update={"content_parts": [*(answer.content_parts or []), part]})


def _closed_tool_calls(answer: ChatMessage, why: str) -> ChatMessage:
    """``answer`` with every tool call still shown running marked failed, ``why``."""
    parts = answer.content_parts or []
    if not any(p.tool is not None and p.tool.status is ToolCallStatus.RUNNING for p in parts):
        return answer
    closed = [
        part.model_copy(
            update={
                "tool": part.tool.model_copy(
                    update={"status": ToolCallStatus.ERROR, "response": why}
                )
            }
        )
        if part.tool is not None and part.tool.status is ToolCallStatus.RUNNING
        else part
        for part in parts
    ]
    return answer.model_copy(update={"content_parts": closed})
