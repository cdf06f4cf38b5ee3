"""The producer's live buffer keeps the newest cumulative message, not every one."""

from __future__ import annotations

import gc
import weakref

from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.runtime.live_buffer import ChatStreamBuffer, EndReason, StreamEnd, StreamEvent


def _answer(text: str) -> ChatMessage:
    return ChatMessage(sender=ChatMessageSender.BOT, content=text)


async def test_only_the_newest_message_is_kept_even_with_a_reader_that_never_reads() -> None:
    buffer = ChatStreamBuffer()
    buffer.publish(_answer("start "))
    stalled = buffer.follow(0)
    first = await anext(stalled)  # a reader that then never reads again
    published: list[weakref.ref[ChatMessage]] = []
    text = "start "
    for _ in range(4_000):
        text += "tok "
        message = _answer(text)
        published.append(weakref.ref(message))
        buffer.publish(message)
        del message
    gc.collect()
    alive = [ref for ref in published if ref() is not None]
    assert alive == [published[-1]]
    assert buffer.next_index == 4_001
    assert isinstance(first, StreamEvent)


async def test_a_late_reader_gets_the_newest_state_in_one_event_then_what_follows() -> None:
    buffer = ChatStreamBuffer(first_index=10)
    for text in ("a", "ab", "abc"):
        buffer.publish(_answer(text))
    late = buffer.follow(0)
    event = await anext(late)
    assert isinstance(event, StreamEvent) and (event.index, event.message.content) == (12, "abc")
    buffer.publish(_answer("abcd"))
    buffer.close(StreamEnd(EndReason.DONE))
    rest = [item async for item in late]
    assert [(e.index, e.message.content) for e in rest if isinstance(e, StreamEvent)] == [
        (13, "abcd")
    ]
    assert rest[-1] == StreamEnd(EndReason.DONE)


async def test_a_reader_that_keeps_up_sees_every_message() -> None:
    buffer = ChatStreamBuffer()
    reader = buffer.follow(0)
    seen = []
    for text in ("a", "ab", "abc"):
        buffer.publish(_answer(text))
        item = await anext(reader)
        assert isinstance(item, StreamEvent)
        seen.append(item.index)
    assert seen == [0, 1, 2]


async def test_a_reader_already_at_the_final_message_gets_only_the_end() -> None:
    buffer = ChatStreamBuffer()
    buffer.publish(_answer("done"))
    buffer.close(StreamEnd(EndReason.DONE))
    assert [item async for item in buffer.follow(1)] == [StreamEnd(EndReason.DONE)]
