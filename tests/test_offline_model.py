"""OfflineChatModel: deterministic text, tool requests, exact continuation, injected pacing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tether.adapters.llm import OfflineChatModel
from tether.adapters.llm.offline import OfflineChatModelOptions
from tether.domain.chat_model import ModelEvent, ModelMessage, ModelToolCall, TextDelta, ToolSpec

CALCULATOR = ToolSpec(name="calculator", description="Arithmetic.")
CLOCK = ToolSpec(name="clock", description="Current time.")
OTHER = ToolSpec(name="weather", description="Weather.")


def _user(text: str) -> list[ModelMessage]:
    return [
        ModelMessage(role="system", content="Be brief."),
        ModelMessage(role="user", content=text),
    ]


async def _events(
    model: OfflineChatModel, messages: list[ModelMessage], tools: Sequence[ToolSpec] = ()
) -> list[ModelEvent]:
    return [event async for event in model.stream(messages, list(tools))]


def _text(events: Sequence[ModelEvent]) -> str:
    return "".join(event.text for event in events if isinstance(event, TextDelta))


def _calls(events: Sequence[ModelEvent]) -> list[ModelToolCall]:
    return [event for event in events if isinstance(event, ModelToolCall)]


def _after_tools(
    messages: list[ModelMessage], events: Sequence[ModelEvent], results: dict[str, str]
) -> list[ModelMessage]:
    """The transcript a tool loop sends back after running the requested tools."""
    calls = _calls(events)
    return [
        *messages,
        ModelMessage(role="assistant", content=_text(events), tool_calls=tuple(calls)),
        *(
            ModelMessage(role="tool", content=results[c.name], tool_call_id=c.id, name=c.name)
            for c in calls
        ),
    ]


class _Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


# Determinism


async def test_same_transcript_and_seed_give_the_same_output_across_instances() -> None:
    messages = _user("Tell me about rivers.")
    first = await _events(OfflineChatModel(seed=3, answer_chunks=30), messages)
    again = await _events(OfflineChatModel(seed=3, answer_chunks=30), messages)
    same_instance = OfflineChatModel(seed=3, answer_chunks=30)
    assert first == again
    assert await _events(same_instance, messages) == await _events(same_instance, messages)
    assert len(_text(first).split()) >= 30 * 3


async def test_different_seed_or_prompt_gives_different_text() -> None:
    base = _text(await _events(OfflineChatModel(seed=1), _user("Tell me about rivers.")))
    other_seed = _text(await _events(OfflineChatModel(seed=2), _user("Tell me about rivers.")))
    other_prompt = _text(await _events(OfflineChatModel(seed=1), _user("Tell me about bridges.")))
    assert base != other_seed
    assert base != other_prompt


def test_output_does_not_depend_on_the_process_hash_seed() -> None:
    # Python salts hash() per process; a resumed turn runs in another process, so
    # the text must come out the same under any PYTHONHASHSEED.
    program = (
        "import asyncio\n"
        "from tether.adapters.llm import OfflineChatModel\n"
        "from tether.domain.chat_model import ModelMessage, ToolSpec\n"
        "async def main():\n"
        "    model = OfflineChatModel(seed=5, answer_chunks=20, tool_call_after_chunks=4)\n"
        "    msgs = [ModelMessage(role='user', content='Write about harbors')]\n"
        "    tools = [ToolSpec(name='calculator', description='')]\n"
        "    print([e async for e in model.stream(msgs, tools)])\n"
        "asyncio.run(main())\n"
    )
    outputs = set()
    for hash_seed in ("1", "2", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1


async def test_answer_has_answer_chunks_chunks_of_chunk_size_words() -> None:
    events = await _events(OfflineChatModel(seed=9, chunk_size=4, answer_chunks=25), _user("Hi"))
    assert _calls(events) == []
    assert len(events) == 25
    texts = [event.text for event in events if isinstance(event, TextDelta)]
    assert all(len(text.split()) == 4 for text in texts[:-1])
    # The last chunk finishes the sentence.
    assert len(texts[-1].split()) >= 4 and texts[-1].endswith(".")


# Tool requests


async def test_asks_for_the_calculator_with_the_users_expression() -> None:
    events = await _events(
        OfflineChatModel(seed=1), _user("What is (12 + 30) * 2 please?"), [CALCULATOR, CLOCK]
    )
    [call] = _calls(events)
    assert (call.name, call.arguments) == ("calculator", {"expression": "(12 + 30) * 2"})
    assert call.id.startswith("call_")
    assert isinstance(events[-1], ModelToolCall)


async def test_asks_for_the_clock_when_the_user_mentions_time() -> None:
    for prompt in ("What time is it?", "Show me the clock", "what's the date"):
        [call] = _calls(await _events(OfflineChatModel(), _user(prompt), [CALCULATOR, CLOCK]))
        assert (call.name, call.arguments) == ("clock", {})


async def test_asks_for_both_tools_in_one_response_when_both_apply() -> None:
    events = await _events(
        OfflineChatModel(), _user("What is 6 * 7, and the time?"), [CLOCK, CALCULATOR]
    )
    assert [c.name for c in _calls(events)] == ["calculator", "clock"]
    assert len({c.id for c in _calls(events)}) == 2


async def test_no_tool_is_asked_for_unless_it_is_offered_and_wanted() -> None:
    model = OfflineChatModel()
    assert _calls(await _events(model, _user("What is 6 * 7?"), [])) == []
    assert _calls(await _events(model, _user("What is 6 * 7?"), [CLOCK, OTHER])) == []
    assert _calls(await _events(model, _user("What time is it?"), [CALCULATOR])) == []
    assert _calls(await _events(model, _user("Tell me a story."), [CALCULATOR, CLOCK])) == []


async def test_tool_call_after_chunks_streams_then_asks_for_a_derived_calculation() -> None:
    model = OfflineChatModel(seed=4, chunk_size=3, answer_chunks=30, tool_call_after_chunks=6)
    events = await _events(model, _user("Write an essay on lanterns."), [CALCULATOR])
    assert all(isinstance(event, TextDelta) for event in events[:6])
    [call] = events[6:]
    assert isinstance(call, ModelToolCall) and call.name == "calculator"
    assert "*" in call.arguments["expression"]
    again = await _events(
        OfflineChatModel(seed=4, tool_call_after_chunks=6),
        _user("Write an essay on lanterns."),
        [CALCULATOR],
    )
    assert _calls(again)[0].arguments == call.arguments
    other_seed = OfflineChatModel(seed=5, tool_call_after_chunks=6)
    other = _calls(await _events(other_seed, _user("Write an essay on lanterns."), [CALCULATOR]))
    assert other[0].arguments != call.arguments


async def test_after_the_tool_results_it_answers_and_mentions_them() -> None:
    model = OfflineChatModel(seed=2, chunk_size=3, answer_chunks=30, tool_call_after_chunks=6)
    messages = _user("What is 6 * 7 and what time is it?")
    first = await _events(model, messages, [CALCULATOR, CLOCK])
    followup = _after_tools(messages, first, {"calculator": "42", "clock": "2030-01-02T03:04:05Z"})
    second = await _events(model, followup, [CALCULATOR, CLOCK])
    assert _calls(second) == []
    text = _text(second)
    assert text.startswith("The calculator says 6 * 7 = 42. The clock reads 2030-01-02T03:04:05Z.")
    # The whole answer is answer_chunks long: 6 chunks before the tools, 24 after.
    assert len(second) == 24


async def test_a_tool_error_is_reported_in_the_answer() -> None:
    model = OfflineChatModel(seed=2)
    messages = _user("What is 1 / 0?")
    first = await _events(model, messages, [CALCULATOR])
    second = await _events(
        model,
        _after_tools(messages, first, {"calculator": "Error: division by zero"}),
        [CALCULATOR],
    )
    assert "1 / 0 = Error: division by zero." in _text(second)


# Continuation


async def _uninterrupted(
    model: OfflineChatModel, messages: list[ModelMessage], tools: Sequence[ToolSpec]
) -> list[tuple[list[ModelMessage], list[ModelEvent]]]:
    """Every response of a crash-free turn, with the transcript it answered."""
    rounds = []
    while True:
        events = await _events(model, messages, tools)
        rounds.append((messages, events))
        if not _calls(events):
            return rounds
        messages = _after_tools(messages, events, {"calculator": "1234", "clock": "noon"})


@pytest.mark.parametrize(
    ("prompt", "options"),
    [
        ("Tell me about gardens.", {"chunk_size": 2, "answer_chunks": 15}),
        ("What is 3 * (4 + 5)?", {"chunk_size": 3, "answer_chunks": 12}),
        ("Write at length.", {"chunk_size": 3, "answer_chunks": 14, "tool_call_after_chunks": 5}),
    ],
)
async def test_continuation_from_every_cut_point_gives_the_uninterrupted_answer(
    prompt: str, options: dict[str, Any]
) -> None:
    model = OfflineChatModel(seed=8, **options)
    tools = [CALCULATOR, CLOCK]
    rounds = await _uninterrupted(model, _user(prompt), tools)
    for messages, events in rounds:
        full = _text(events)
        for cut in range(len(full) + 1):
            resumed = [*messages, ModelMessage(role="assistant", content=full[:cut])]
            # A resumed model is a fresh instance, as on another replica.
            continuation = await _events(OfflineChatModel(seed=8, **options), resumed, tools)
            assert full[:cut] + _text(continuation) == full, (prompt, cut)
            assert _calls(continuation) == _calls(events)


async def test_continuation_streams_only_the_remaining_chunks() -> None:
    model = OfflineChatModel(seed=8, chunk_size=3, answer_chunks=10)
    events = await _events(model, _user("Hello"))
    chunks = [event.text for event in events if isinstance(event, TextDelta)]
    partial = "".join(chunks[:4]) + chunks[4][:2]
    resumed = [*_user("Hello"), ModelMessage(role="assistant", content=partial)]
    continued = [e.text for e in await _events(model, resumed) if isinstance(e, TextDelta)]
    assert continued == [chunks[4][2:], *chunks[5:]]


async def test_a_finished_response_continues_with_nothing_but_its_tool_calls() -> None:
    model = OfflineChatModel(seed=8, tool_call_after_chunks=3)
    messages = _user("Essay please")
    events = await _events(model, messages, [CALCULATOR])
    resumed = [*messages, ModelMessage(role="assistant", content=_text(events))]
    assert await _events(model, resumed, [CALCULATOR]) == _calls(events)


# Pacing


async def test_pacing_sleeps_one_interval_before_each_chunk() -> None:
    sleeps = _Sleeps()
    model = OfflineChatModel(seed=1, chunks_per_second=8, answer_chunks=12, sleep=sleeps)
    events = await _events(model, _user("Hello"))
    assert sleeps.calls == [0.125] * 12
    assert len(events) == 12


async def test_pacing_of_a_continuation_covers_only_the_rest() -> None:
    sleeps = _Sleeps()
    model = OfflineChatModel(seed=1, chunks_per_second=10, answer_chunks=12, sleep=sleeps)
    full = _text(await _events(model, _user("Hello")))
    sleeps.calls.clear()
    chunks_left = len(
        await _events(model, [*_user("Hello"), ModelMessage(role="assistant", content=full[:20])])
    )
    assert sleeps.calls == [pytest.approx(0.1)] * chunks_left
    assert 0 < chunks_left < 12


async def test_zero_chunks_per_second_does_not_sleep() -> None:
    sleeps = _Sleeps()
    await _events(OfflineChatModel(chunks_per_second=0, sleep=sleeps), _user("Hello"))
    assert sleeps.calls == []


# Options


def test_from_options_accepts_a_setup_dict_and_rejects_unknown_or_bad_values() -> None:
    model = OfflineChatModel.from_options(
        {
            "seed": 11,
            "chunks_per_second": 10,
            "chunk_size": 3,
            "answer_chunks": 200,
            "tool_call_after_chunks": 10,
        }
    )
    assert model.options.answer_chunks == 200 and model.options.tool_call_after_chunks == 10
    with pytest.raises(ValueError, match="colour"):
        OfflineChatModel.from_options({"colour": "red"})
    with pytest.raises(ValueError, match="chunk_size"):
        OfflineChatModel.from_options({"chunk_size": 0})
    with pytest.raises(ValueError, match="chunks_per_second"):
        OfflineChatModel(chunks_per_second=-1)


def test_the_agent_guide_lists_every_option_of_the_offline_model() -> None:
    """docs/writing-agents.md ("Models") names every option the model takes."""
    guide = Path(__file__).resolve().parent.parent / "docs" / "writing-agents.md"
    listed = re.search(r"- `offline` \(default\):(.*?)\n- `", guide.read_text(), re.DOTALL)
    assert listed is not None
    sentence = listed.group(1).split("Options in", 1)[1]
    named = set(re.findall(r"`(\w+)`", " ".join(sentence.split())))
    assert set(OfflineChatModelOptions.model_fields) <= named
