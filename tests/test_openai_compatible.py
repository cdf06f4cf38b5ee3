"""OpenAICompatibleChatModel against a real local OpenAI-compatible HTTP server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import httpx2
import openai
import pytest

from tether.adapters.llm import ChatClient, OpenAICompatibleChatModel
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)
from tether.domain.chat_model import ModelMessage, ModelToolCall, TextDelta, ToolSpec
from tether.metrics import TetherMetrics
from tether.observability.logs import TurnFields
from tether.observability.traces import NO_TRACING
from tether.observability.turns import TurnObservation
from tether.tools import MalformedToolCall, tool

from .support.openai_server import (
    COMPLETION_TOKENS,
    CONTINUATION,
    PROMPT_TOKENS,
    OpenAICompatibleServer,
    unanswered_tool_call,
)
from .support.scripted import ScriptedCluster


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer() as running:
        yield running


def _model(server: OpenAICompatibleServer, **kwargs: Any) -> OpenAICompatibleChatModel:
    return OpenAICompatibleChatModel(
        model="test-model", base_url=server.base_url, api_key="test-key", **kwargs
    )


def _tool_parts(message: ChatMessage) -> list[ContentPartTool]:
    return [p.tool for p in message.content_parts or [] if p.tool is not None]


def _calculator(executed: list[str]) -> Any:
    @tool
    async def calculator(expression: str) -> int:
        """Evaluate a product of two integers."""
        executed.append(expression)
        left, right = (int(side) for side in expression.split("*"))
        return left * right

    return calculator


async def test_streamed_tool_call_and_text_go_through_the_tool_loop(
    server: OpenAICompatibleServer,
) -> None:
    executed: list[str] = []
    client = ChatClient(_model(server))
    conversation = [ChatMessage(sender=ChatMessageSender.USER, content="What is 6 * 7?")]
    messages = [m async for m in client.stream(conversation, [_calculator(executed)], "Be exact.")]
    await client.aclose()

    # The arguments arrived in four pieces and were put back together.
    assert executed == ["6 * 7"]
    final = messages[-1]
    [tool_part] = _tool_parts(final)
    assert tool_part.tool_call_id == "call_abc123"
    assert (tool_part.name, tool_part.params) == ("calculator", {"expression": "6 * 7"})
    assert (tool_part.status, tool_part.response) == (ToolCallStatus.COMPLETED, 42)
    assert final.content == "The calculator result is 42. Done."
    # Text streamed word by word: the answer grew over several yields.
    texts = [m.content for m in messages if m.content]
    assert len(texts) >= 6 and all(b.startswith(a) for a, b in pairwise(texts))

    first, second = server.requests
    assert first["stream"] is True and first["model"] == "test-model"
    assert first["messages"] == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    [offered] = first["tools"]
    assert offered["type"] == "function"
    assert offered["function"]["name"] == "calculator"
    assert offered["function"]["parameters"]["required"] == ["expression"]
    # The second request carries the assistant's tool call and the tool's result.
    assistant, result = second["messages"][2:]
    assert assistant["role"] == "assistant" and assistant["content"] is None
    [sent_call] = assistant["tool_calls"]
    assert sent_call["id"] == "call_abc123"
    assert sent_call["function"]["name"] == "calculator"
    assert json.loads(sent_call["function"]["arguments"]) == {"expression": "6 * 7"}
    assert result == {"role": "tool", "tool_call_id": "call_abc123", "content": "42"}
    assert server.headers[0]["authorization"] == "Bearer test-key"


async def test_invalid_json_arguments_become_a_tool_error_the_model_sees(
    server: OpenAICompatibleServer,
) -> None:
    executed: list[str] = []
    client = ChatClient(_model(server))
    conversation = [ChatMessage(sender=ChatMessageSender.USER, content="a broken call")]
    messages = [m async for m in client.stream(conversation, [_calculator(executed)])]
    await client.aclose()

    assert executed == []
    [tool_part] = _tool_parts(messages[-1])
    assert tool_part.status == ToolCallStatus.ERROR
    assert "not valid JSON" in tool_part.response
    [result] = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert result["content"].startswith("Error: could not parse the arguments of 'calculator'")
    assert messages[-1].content.startswith("The calculator result is Error:")


async def test_model_events_are_text_deltas_then_assembled_tool_calls(
    server: OpenAICompatibleServer,
) -> None:
    model = _model(server, temperature=0.0)
    spec = ToolSpec(name="calculator", description="Arithmetic.", parameters={})
    events = [e async for e in model.stream([ModelMessage(role="user", content="6 * 7?")], [spec])]
    assert events == [
        ModelToolCall(id="call_abc123", name="calculator", arguments={"expression": "6 * 7"})
    ]
    broken = [e async for e in model.stream([ModelMessage(role="user", content="broken")], [spec])]
    [call] = broken
    assert isinstance(call, MalformedToolCall) and call.raw_arguments == '{"expression": "6 * 7"'
    await model.aclose()
    assert server.requests[0]["temperature"] == 0.0
    # A tool without a schema is still offered with a valid one.
    assert server.requests[0]["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }


async def test_partial_assistant_text_is_sent_for_continuation(
    server: OpenAICompatibleServer,
) -> None:
    model = _model(server)
    messages = [
        ModelMessage(role="user", content="Tell me a story."),
        ModelMessage(role="assistant", content="Once upon a time"),
    ]
    events = [e async for e in model.stream(messages, [])]
    await model.aclose()
    assert all(isinstance(e, TextDelta) for e in events)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == CONTINUATION
    [request] = server.requests
    assert request["messages"][-1] == {"role": "assistant", "content": "Once upon a time"}
    assert "tools" not in request


async def test_a_supplied_http_client_is_used_and_left_open(server: OpenAICompatibleServer) -> None:
    async with httpx2.AsyncClient(headers={"x-test": "supplied"}) as http_client:
        model = _model(server, http_client=http_client)
        assert [e async for e in model.stream([ModelMessage(role="user", content="x")], [])]
        await model.aclose()
        assert not http_client.is_closed
    assert server.headers[0]["x-test"] == "supplied"


async def test_aclose_closes_the_client_it_built(server: OpenAICompatibleServer) -> None:
    model = _model(server)
    await model.aclose()
    assert model._client.is_closed()


async def test_an_answer_cut_off_inside_a_tool_call_is_a_valid_conversation_next_turn(
    server: OpenAICompatibleServer,
) -> None:
    """A cancelled turn leaves its tool call without a result. The next turn
    sends that answer to the model with the call answered (as cancelled): the
    server, as strict as OpenAI's API about unanswered calls, takes it."""
    cut_off = ChatMessage(
        sender=ChatMessageSender.BOT,
        content="Let me work that out.",
        content_parts=[
            ContentPart(type=ContentPartType.TEXT, text="Let me work that out."),
            ContentPart(
                type=ContentPartType.TOOL,
                tool=ContentPartTool(
                    tool_call_id="call_1", name="calculator", params={"expression": "6 * 7"}
                ),
            ),
        ],
    )
    conversation = [
        ChatMessage(sender=ChatMessageSender.USER, content="What is 6 * 7?"),
        cut_off,
        ChatMessage(sender=ChatMessageSender.USER, content="Try again: what is 6 * 7?"),
    ]
    executed: list[str] = []
    client = ChatClient(_model(server))
    messages = [m async for m in client.stream(conversation, [_calculator(executed)])]
    await client.aclose()
    assert messages[-1].content.endswith("Done.")
    assert executed == ["6 * 7"]
    sent = server.requests[0]["messages"]
    assert unanswered_tool_call(sent) is None
    [closing] = [m for m in sent if m["role"] == "tool" and m["tool_call_id"] == "call_1"]
    assert "may or may not have happened" in closing["content"]


async def test_the_test_server_refuses_an_unanswered_tool_call(
    server: OpenAICompatibleServer,
) -> None:
    """So the test above proves something: the server is as strict as OpenAI's."""
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="test-key")
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        await sdk.chat.completions.create(
            model="test-model",
            messages=[
                {"role": "user", "content": "What is 6 * 7?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "user", "content": "Again?"},
            ],
        )
    await sdk.close()


@pytest.mark.parametrize("how", ["cancel", "interrupt", "error"])
async def test_a_turn_stopped_in_a_tool_call_leaves_a_transcript_the_next_turn_can_send(
    server: OpenAICompatibleServer, how: str
) -> None:
    """End to end: a real turn is stopped inside its tool call, from another
    replica, by a cancel or by a new message that interrupts it, or by its
    agent failing; the transcript it leaves, plus the next question, goes to
    the server (as strict as OpenAI's API about unanswered calls) through the
    OpenAI-compatible client, and is taken."""
    cluster = ScriptedCluster()
    try:
        a, b = cluster.replica(), cluster.replica()
        turn = await cluster.start(a, "s1", "Send the email, then tell me.")
        script = cluster.scripts.of(turn.message_id)
        script.say("Sending it now.")
        script.call_tool("send_email")
        await script.spoken(2)
        assert a.flusher is not None
        await a.flusher.flush()  # the answer as its readers saw it, call in flight
        if how == "cancel":
            await b.cancel("t", "u", "s1", turn.message_id)
        elif how == "interrupt":
            interrupting = await cluster.start(b, "s1", "Stop.", strategy="interrupt")
            cluster.scripts.of(interrupting.message_id).finish()
            assert await cluster.ended(interrupting) == "done"
        else:
            script.fail("the mail server went away")
        assert await cluster.ended(turn) == ("errored" if how == "error" else "cancelled")
        transcript = await cluster.transcript("s1")
    finally:
        await cluster.aclose()
    assert any(p.tool is not None for m in transcript for p in m.content_parts or [])

    executed: list[str] = []
    client = ChatClient(_model(server))
    follow_up = ChatMessage(sender=ChatMessageSender.USER, content="What is 6 * 7?")
    messages = [m async for m in client.stream([*transcript, follow_up], [_calculator(executed)])]
    await client.aclose()
    assert messages[-1].content.endswith("Done.")
    sent = server.requests[0]["messages"]
    assert unanswered_tool_call(sent) is None
    [closing] = [m for m in sent if m["role"] == "tool" and m["tool_call_id"] == "call-send_email"]
    assert "may or may not have happened" in closing["content"]


async def test_each_calls_usage_is_counted_for_the_turns_agent(
    server: OpenAICompatibleServer,
) -> None:
    """The model asks for usage in the stream and reports it for the call it
    serves: the turn's agent's token counters move by what the server said."""
    metrics = TetherMetrics()
    turn = TurnObservation(
        TurnFields("s", "m", 1, "assistant"), tracing=NO_TRACING, metrics=metrics, resumed=False
    )
    client = ChatClient(_model(server))
    try:
        with turn.running():
            async for _ in client.stream(
                [ChatMessage(sender=ChatMessageSender.USER, content="6 * 7")], [_calculator([])]
            ):
                pass
    finally:
        await client.aclose()
    assert server.requests[0]["stream_options"] == {"include_usage": True}
    calls = len(server.requests)  # the tool call, then the answer
    assert calls == 2
    tokens = metrics.model_tokens
    assert tokens.labels("assistant", "input")._value.get() == calls * PROMPT_TOKENS
    assert tokens.labels("assistant", "output")._value.get() == calls * COMPLETION_TOKENS
