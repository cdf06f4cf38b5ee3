"""The SSE client parser: fields, multi-line data, comments, line endings, chunking."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from tether.cli._sse_client import SSEEvent, SSEParser, iter_sse, iter_sse_text


def _parse(*chunks: str) -> list[SSEEvent]:
    parser = SSEParser()
    return [event for chunk in chunks for event in parser.feed(chunk)]


def test_event_id_and_data_fields() -> None:
    events = _parse('event: new_message\nid: m1:0\ndata: {"content": "Hi"}\n\n')
    assert events == [SSEEvent("new_message", "m1:0", '{"content": "Hi"}')]


def test_event_unpacks_as_a_triple() -> None:
    [(event, event_id, data)] = _parse("event: e\nid: 1\ndata: d\n\n")
    assert (event, event_id, data) == ("e", "1", "d")


def test_default_event_type_is_message() -> None:
    assert _parse("data: x\n\n") == [SSEEvent("message", "", "x")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    events = _parse("data: first\ndata:second\ndata\ndata:  indented\n\n")
    # One leading space is dropped, no more; "data" alone is an empty line of data.
    assert events == [SSEEvent("message", "", "first\nsecond\n\n indented")]


def test_comments_and_pings_are_skipped() -> None:
    events = _parse(": ping - 2024-01-01 00:00:00\n\n:\n\ndata: a\n: inside\ndata: b\n\n")
    assert events == [SSEEvent("message", "", "a\nb")]


def test_an_event_without_data_is_not_dispatched() -> None:
    events = _parse("event: lonely\nid: 7\n\ndata: next\n\n")
    # The event name does not leak into the next event; the id persists (per spec).
    assert events == [SSEEvent("message", "7", "next")]


def test_the_last_id_persists_until_changed() -> None:
    events = _parse("id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\nid\ndata: d\n\n")
    assert [event.id for event in events] == ["1", "1", "2", ""]


def test_unknown_fields_and_retry_are_ignored() -> None:
    events = _parse("retry: 3000\nfoo: bar\ndata: x\n\n")
    assert events == [SSEEvent("message", "", "x")]


@pytest.mark.parametrize("newline", ["\r\n", "\r", "\n"], ids=["crlf", "cr", "lf"])
def test_every_line_ending(newline: str) -> None:
    stream = newline.join(["event: e", "id: 1", "data: a", "data: b", "", "data: c", "", ""])
    assert _parse(stream) == [SSEEvent("e", "1", "a\nb"), SSEEvent("message", "1", "c")]


def test_crlf_split_across_chunks_is_one_line_ending() -> None:
    events = _parse("data: a\r", "\n", "\r", "\ndata: b\r", "", "\n\r\n")
    assert events == [SSEEvent("message", "", "a"), SSEEvent("message", "", "b")]


def test_lines_split_anywhere_across_chunks() -> None:
    stream = 'event: new_message\r\nid: m:3\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
    expected = [SSEEvent("new_message", "m:3", '{"a":\n1}')]
    for size in range(1, 8):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert _parse(*chunks) == expected, size


def test_only_cr_and_lf_end_lines() -> None:
    # JSON may carry U+2028 and friends unescaped; they are not line endings in SSE.
    data = 'data: {"content": "a\u2028b\u2029c\x0bd\x85e"}\n\n'
    assert _parse(data) == [SSEEvent("message", "", '{"content": "a\u2028b\u2029c\x0bd\x85e"}')]


def test_a_leading_bom_is_ignored() -> None:
    assert _parse("\ufeffevent: e\ndata: x\n\n") == [SSEEvent("e", "", "x")]


def test_an_unterminated_event_at_the_end_is_dropped() -> None:
    assert _parse("data: complete\n\ndata: half") == [SSEEvent("message", "", "complete")]
    assert _parse("data: no blank line\n") == []


async def test_iter_sse_text() -> None:
    async def chunks() -> AsyncIterator[str]:
        for chunk in ["data: a\n", "\n", "data: b\n\n"]:
            yield chunk

    assert [event.data async for event in iter_sse_text(chunks())] == ["a", "b"]


async def test_iter_sse_over_a_streaming_response() -> None:
    body = 'event: new_message\r\nid: m:0\r\ndata: {"content": "h\u00e9\u2028llo"}\r\n\r\n'
    encoded = body.encode() + b": ping\r\n\r\nevent: stream_status\r\ndata: {}\r\n\r\n"
    # Split inside the two-byte UTF-8 sequence of the accented letter and inside a CRLF.
    split_at = encoded.index("\u00e9".encode()) + 1
    parts = [encoded[:5], encoded[5:split_at], encoded[split_at:-3], encoded[-3:-1], encoded[-1:]]

    async def stream() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=stream(), headers={"content-type": "text/event-stream"})

    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as client,
        client.stream("GET", "http://test/chat/stream") as response,
    ):
        events = [event async for event in iter_sse(response)]

    assert events == [
        SSEEvent("new_message", "m:0", '{"content": "h\u00e9\u2028llo"}'),
        SSEEvent("stream_status", "m:0", "{}"),
    ]
