"""tether's offline model as a PydanticAI model (``OfflineModel``).

A real ``pydantic_ai.Agent`` runs on it with no network: it streams the
offline model's deterministic text chunk by chunk, asks for the calculator
(and its ``call_tool`` tool) with the ids and arguments the offline model
gives, reports the tools' results, and says the same on every run and in
every instance, which is what a resumed turn is compared with.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.services import import_or_skip

import_or_skip("pydantic_ai", "install the pydantic-ai extra: make install-dev")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
)

from tether.adapters.llm.offline import OfflineChatModel  # noqa: E402
from tether.domain.chat_model import ModelMessage, TextDelta  # noqa: E402
from tether.integrations.pydantic_ai import OfflineModel  # noqa: E402

PROMPT = "Tell me about rivers. Start by working out 2 * 1001."
OPTIONS: dict[str, Any] = {"seed": 11, "chunk_size": 3, "answer_chunks": 12}


def _agent(model: OfflineModel, calls: list[dict[str, Any]] | None = None) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(model)
    if calls is None:
        return agent

    @agent.tool_plain
    async def calculator(expression: str) -> int:
        """Evaluate an arithmetic expression."""
        calls.append({"calculator": expression})
        return 2002

    @agent.tool_plain
    async def send_note(text: str) -> str:
        """Send the user a note."""
        calls.append({"send_note": text})
        return "sent"

    return agent


async def _streamed_text(agent: Agent[None, str], prompt: str) -> list[list[str]]:
    """The text chunks each model response streamed, response by response."""
    responses: list[list[str]] = []
    async with agent.iter(prompt) as run:
        async for node in run:
            if not Agent.is_model_request_node(node):
                continue
            chunks: list[str] = []
            async with node.stream(run.ctx) as events:
                async for event in events:
                    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                        chunks.append(event.part.content)
                    elif isinstance(event, PartDeltaEvent) and isinstance(
                        event.delta, TextPartDelta
                    ):
                        chunks.append(event.delta.content_delta)
            responses.append([c for c in chunks if c])
    return responses


async def _offline_text(prompt: str, **options: Any) -> list[str]:
    """What tether's own offline model streams for ``prompt`` with no tools."""
    model = OfflineChatModel(**options)
    deltas = model.stream([ModelMessage("user", prompt)], [])
    return [event.text async for event in deltas if isinstance(event, TextDelta)]


async def test_it_streams_the_offline_model_s_text_chunk_by_chunk() -> None:
    prompt = "Tell me about rivers."
    (chunks,) = await _streamed_text(_agent(OfflineModel(**OPTIONS)), prompt)
    assert chunks == await _offline_text(prompt, **OPTIONS)
    assert len(chunks) == OPTIONS["answer_chunks"]
    result = await _agent(OfflineModel(**OPTIONS)).run(prompt)
    assert result.output == "".join(chunks)


async def test_it_asks_for_the_calculator_then_reports_its_result() -> None:
    calls: list[dict[str, Any]] = []
    agent = _agent(OfflineModel(**OPTIONS, tool_call_after_chunks=2), calls)
    result = await agent.run(PROMPT)

    assert calls == [{"calculator": "2 * 1001"}]
    messages = result.all_messages()
    call = next(p for m in messages for p in m.parts if isinstance(p, ToolCallPart))
    assert call.args_as_dict() == {"expression": "2 * 1001"}
    assert call.tool_call_id.startswith("call_")
    returned = next(p for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
    assert returned.tool_call_id == call.tool_call_id
    first_text = next(p for p in messages[1].parts if isinstance(p, TextPart))
    assert first_text.content.endswith("Let me check with the calculator.")
    assert result.output.startswith("The calculator says 2 * 1001 = 2002. ")


async def test_a_second_run_and_a_second_instance_say_the_same() -> None:
    options = {**OPTIONS, "tool_call_after_chunks": 2}
    runs = []
    for model in (OfflineModel(**options), OfflineModel(**options)):
        for _ in range(2):
            result = await _agent(model, []).run(PROMPT)
            runs.append(result.all_messages())
    first = runs[0]
    for other in runs[1:]:
        assert [m.parts for m in other if m.kind == "response"] == [
            m.parts for m in first if m.kind == "response"
        ]
    other_seed = await _agent(OfflineModel(**{**options, "seed": 12}), []).run(PROMPT)
    assert other_seed.output != (await _agent(OfflineModel(**options), []).run(PROMPT)).output


async def test_call_tool_asks_for_the_named_tool_with_its_arguments() -> None:
    calls: list[dict[str, Any]] = []
    model = OfflineModel.from_options(
        {**OPTIONS, "call_tool": {"name": "send_note", "arguments": {"text": "done"}}}
    )
    result = await _agent(model, calls).run("Tell me about rivers.")
    assert calls == [{"send_note": "done"}]
    assert result.output.startswith("The send_note tool returned sent. ")


async def test_it_paces_its_chunks_with_the_sleep_it_is_given() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    model = OfflineModel(**OPTIONS, chunks_per_second=4, sleep=sleep)
    await _agent(model).run("Tell me about rivers.")
    assert slept == [0.25] * OPTIONS["answer_chunks"]


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="invalid offline model options"):
        OfflineModel.from_options({"seed": 1, "answer_chunks": 0})
    with pytest.raises(ValueError, match="invalid offline model options"):
        OfflineModel.from_options({"temperature": 0.5})
