"""How every stream ends (``tether.api.sse.frame``): a ``stream_status``, in
either mode, whatever ended it (issue 25)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from tether.api.sse import frame
from tether.api.stream_mode import StreamMode
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.store_errors import StoreUnavailableError
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

_MESSAGE = ChatMessage(sender=ChatMessageSender.BOT, content="Hi", message_id="m")


async def _source(end: StreamEnd | Exception) -> AsyncIterator[StreamEvent | StreamEnd]:
    yield StreamEvent(0, _MESSAGE)
    if isinstance(end, Exception):
        raise end
    yield end


async def _said(end: StreamEnd | Exception, mode: StreamMode) -> list[tuple[str, object]]:
    return [
        (str(event.event), json.loads(str(event.data)))
        async for event in frame("m", _source(end), mode)
    ]


@pytest.mark.parametrize("mode", list(StreamMode), ids=str)
@pytest.mark.parametrize("reason", ["done", "cancelled", "dead", "gone"])
async def test_a_stream_ends_with_its_verdict(mode: StreamMode, reason: str) -> None:
    said = await _said(StreamEnd(reason), mode)
    assert [name for name, _ in said] == ["new_message", "stream_status"]
    assert said[-1][1] == {"reason": reason}


@pytest.mark.parametrize("mode", list(StreamMode), ids=str)
async def test_an_errored_turn_says_its_error_then_its_verdict(mode: StreamMode) -> None:
    said = await _said(StreamEnd(EndReason.ERRORED, "TURN_TIMEOUT", "too long"), mode)
    assert said[1:] == [
        ("error", {"code": "TURN_TIMEOUT", "message": "too long"}),
        ("stream_status", {"reason": "errored"}),
    ]


@pytest.mark.parametrize("mode", list(StreamMode), ids=str)
async def test_stores_going_away_interrupt_the_stream_not_the_turn(mode: StreamMode) -> None:
    said = await _said(StoreUnavailableError("down"), mode)
    assert said[0] == ("new_message", _MESSAGE.model_dump(mode="json", exclude_none=True))
    assert [name for name, _ in said[1:]] == ["error", "stream_status"]
    assert said[1][1]["code"] == "STORE_UNAVAILABLE"  # type: ignore[index]
    assert said[-1][1] == {"reason": "interrupted"}
