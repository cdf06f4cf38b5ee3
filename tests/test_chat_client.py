"""ChatClient: the model/tool loop, its cumulative messages, and checkpoint/resume."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest

from tether.adapters.llm import (
    ChatClient,
    ChatClientFactory,
    OfflineChatModel,
    OpenAICompatibleChatModel,
)
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPartType,
    ToolCallStatus,
)
from tether.domain.chat_model import (
    ChatModel,
    ModelEvent,
    ModelMessage,
    ModelToolCall,
    TextDelta,
    ToolSpec,
)
from tether.domain.turn_context import TurnContext
from tether.tools import Tool, current_tool_call, set_current_turn, tool

EXAMPLES = Path(__file__).parent.parent / "src" / "tether" / "examples" / "agents"


TURN = TurnContext(
    tenant="t", requester_uuid="u", session_id="s", message_id="m1", agent_identifier="a"
)


def _conversation(text: str) -> list[ChatMessage]:
    return [ChatMessage(sender=ChatMessageSender.USER, content=text)]


def _model(**options: Any) -> OfflineChatModel:
    defaults: dict[str, Any] = {"seed": 5, "chunk_size": 3, "answer_chunks": 16}
    return OfflineChatModel(**{**defaults, **options})


class _Executions:
    """Tools that count how often they really ran."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def calculator(self, result: Any = 42) -> Tool:
        counts = self.counts

        @tool(name="calculator")
        async def calculator(expression: str) -> Any:
            """Arithmetic."""
            counts[f"calculator:{expression}"] += 1
            return result

        return calculator

    def clock(self) -> Tool:
        counts = self.counts

        @tool(name="clock")
        async def clock() -> str:
            """The time."""
            counts["clock"] += 1
            return "2030-01-02T03:04:05+00:00"

        return clock

    def total(self) -> int:
        return sum(self.counts.values())


async def _run(
    client: ChatClient,
    conversation: list[ChatMessage],
    tools: Sequence[Tool] = (),
    system_prompt: str | None = "Be helpful.",
) -> list[ChatMessage]:
    return [m async for m in client.stream(conversation, tools, system_prompt)]


def _closable(stream: AsyncIterator[ChatMessage]) -> AsyncGenerator[ChatMessage, None]:
    # stream() is an async generator; the type says iterator. The tests close it the
    # way a dying producer's task would be torn down.
    return cast(AsyncGenerator[ChatMessage, None], stream)


def _tool_parts(message: ChatMessage) -> list[Any]:
    return [p.tool for p in message.content_parts or [] if p.type == ContentPartType.TOOL]


def _json_round_trip(state: dict[str, Any]) -> dict[str, Any]:
    # What a state store does to a checkpoint.
    loaded: dict[str, Any] = json.loads(json.dumps(state))
    return loaded


# Cumulative messages and the tool loop


async def test_every_yield_is_the_whole_answer_so_far() -> None:
    tools = _Executions()
    messages = await _run(
        ChatClient(_model(tool_call_after_chunks=4)),
        _conversation("Write about lanterns"),
        [tools.calculator()],
    )
    assert len(messages) > 16
    for before, after in pairwise(messages):
        assert after.sender == ChatMessageSender.BOT
        assert after.content.startswith(before.content)
        assert len(after.content_parts or []) >= len(before.content_parts or [])
    final = messages[-1]
    assert [p.type for p in final.content_parts or []] == [
        ContentPartType.TEXT,
        ContentPartType.TOOL,
        ContentPartType.TEXT,
    ]
    texts = [p.text for p in final.content_parts or [] if p.type == ContentPartType.TEXT]
    assert final.content == "\n\n".join(t for t in texts if t)
    assert "The calculator says" in final.content and "= 42." in final.content


async def test_tool_parts_go_running_then_completed() -> None:
    tools = _Executions()
    messages = await _run(
        ChatClient(_model()),
        _conversation("What is 6 * 7 and what time is it?"),
        [tools.calculator(), tools.clock()],
    )
    statuses = [[(t.name, t.status) for t in _tool_parts(m)] for m in messages]
    running = ToolCallStatus.RUNNING
    completed = ToolCallStatus.COMPLETED
    assert statuses[:3] == [
        [("calculator", running), ("clock", running)],
        [("calculator", completed), ("clock", running)],
        [("calculator", completed), ("clock", completed)],
    ]
    calculator, clock = _tool_parts(messages[-1])
    assert calculator.params == {"expression": "6 * 7"} and calculator.response == 42
    assert clock.response == "2030-01-02T03:04:05+00:00"
    assert tools.counts == Counter({"calculator:6 * 7": 1, "clock": 1})
    assert "6 * 7 = 42." in messages[-1].content
    assert "The clock reads 2030-01-02T03:04:05+00:00." in messages[-1].content


async def test_a_failing_tool_is_an_error_part_and_the_turn_goes_on() -> None:
    @tool(name="calculator")
    async def calculator(expression: str) -> int:
        raise ZeroDivisionError("division by zero")

    messages = await _run(ChatClient(_model()), _conversation("What is 1 / 0?"), [calculator])
    [part] = _tool_parts(messages[-1])
    assert part.status == ToolCallStatus.ERROR
    assert part.response == "ZeroDivisionError: division by zero"
    # The model got the error as the tool result and wrote its answer after it.
    assert "1 / 0 = Error: ZeroDivisionError: division by zero." in messages[-1].content
    assert len(messages[-1].content.split()) > 16


async def test_invalid_arguments_are_an_error_part_too() -> None:
    @tool(name="calculator")
    async def calculator(expression: int) -> int:
        return expression

    messages = await _run(ChatClient(_model()), _conversation("What is 2 + 2?"), [calculator])
    [part] = _tool_parts(messages[-1])
    assert part.status == ToolCallStatus.ERROR
    assert "invalid arguments for tool 'calculator'" in part.response


class _AlwaysWantsTools(ChatModel):
    """A model that never stops asking for the calculator."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(
        self, messages: list[ModelMessage], tools: list[ToolSpec]
    ) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        done = sum(1 for m in messages if m.role == "tool")
        yield TextDelta(f"Round {done}.")
        yield ModelToolCall(id=f"call_{done}", name="calculator", arguments={"expression": "1 + 1"})


async def test_max_tool_rounds_bounds_the_loop_with_a_note() -> None:
    tools = _Executions()
    model = _AlwaysWantsTools()
    messages = await _run(
        ChatClient(model, max_tool_rounds=3), _conversation("Go"), [tools.calculator()]
    )
    assert tools.total() == 3
    assert model.calls == 4
    final = messages[-1]
    assert len(_tool_parts(final)) == 3
    assert final.content.endswith(
        "(Stopped: the model asked for more tools after 3 tool rounds, the limit for one answer.)"
    )


async def test_max_tool_rounds_zero_runs_no_tool() -> None:
    tools = _Executions()
    messages = await _run(
        ChatClient(_model(), max_tool_rounds=0),
        _conversation("What is 6 * 7?"),
        [tools.calculator()],
    )
    assert tools.total() == 0
    assert _tool_parts(messages[-1]) == []
    assert "after 0 tool rounds" in messages[-1].content


class _RecordingModel(ChatModel):
    """Passes through to a real model and keeps every transcript it was sent."""

    def __init__(self, inner: ChatModel) -> None:
        self.inner = inner
        self.transcripts: list[list[ModelMessage]] = []

    async def stream(
        self, messages: list[ModelMessage], tools: list[ToolSpec]
    ) -> AsyncIterator[ModelEvent]:
        self.transcripts.append(list(messages))
        async for event in self.inner.stream(messages, tools):
            yield event


async def test_conversation_becomes_the_model_transcript() -> None:
    model = _RecordingModel(_model())
    conversation = [
        ChatMessage(sender=ChatMessageSender.USER, content="Hello"),
        ChatMessage(sender=ChatMessageSender.BOT, content="Hi there."),
        ChatMessage(sender=ChatMessageSender.USER, content="What is 6 * 7?"),
    ]
    await _run(ChatClient(model), conversation, [_Executions().calculator()], "Be terse.")
    first, second = model.transcripts
    assert [(m.role, m.content) for m in first] == [
        ("system", "Be terse."),
        ("user", "Hello"),
        ("assistant", "Hi there."),
        ("user", "What is 6 * 7?"),
    ]
    assert second[:4] == first
    request, result = second[4:]
    assert request.role == "assistant" and request.tool_calls[0].name == "calculator"
    assert (result.role, result.content, result.tool_call_id) == (
        "tool",
        "42",
        request.tool_calls[0].id,
    )


async def test_an_empty_answer_still_yields_a_message() -> None:
    class _Silent(ChatModel):
        async def stream(
            self, messages: list[ModelMessage], tools: list[ToolSpec]
        ) -> AsyncIterator[ModelEvent]:
            for _ in ():
                yield TextDelta("")

    messages = await _run(ChatClient(_Silent()), _conversation("Hello"))
    assert [m.content for m in messages] == [""]


# Checkpoint and resume


async def _crash_free(
    make_model: Callable[[], ChatModel], prompt: str, tools: Sequence[Tool]
) -> ChatMessage:
    return (await _run(ChatClient(make_model()), _conversation(prompt), tools))[-1]


async def _killed_after(
    make_model: Callable[[], ChatModel], prompt: str, tools: Sequence[Tool], yields: int
) -> dict[str, Any]:
    """Run a turn, stop it after ``yields`` messages as a dying producer would, and
    return its last checkpoint."""
    client = ChatClient(make_model())
    stream = _closable(client.stream(_conversation(prompt), tools, "Be helpful."))
    for _ in range(yields):
        await anext(stream)
    state = _json_round_trip(await client.dump())
    await stream.aclose()
    return state


async def _resumed(
    make_model: Callable[[], ChatModel], prompt: str, tools: Sequence[Tool], state: dict[str, Any]
) -> list[ChatMessage]:
    # A new client and model, as on the replica that takes over.
    client = ChatClient(make_model())
    await client.load(state, resuming_turn=True)
    return await _run(client, _conversation(prompt), tools)


async def test_resume_from_every_yield_gives_the_crash_free_answer() -> None:
    def make_model() -> ChatModel:
        return _model(tool_call_after_chunks=5)

    prompt = "Write about harbors"
    reference = await _run(
        ChatClient(make_model()), _conversation(prompt), [_Executions().calculator()]
    )
    for yields in range(1, len(reference) + 1):
        tools = _Executions()
        state = await _killed_after(make_model, prompt, [tools.calculator()], yields)
        resumed = await _resumed(make_model, prompt, [tools.calculator()], state)
        # The restored answer comes first, then it grows to the crash-free one.
        assert resumed[0] == reference[yields - 1], yields
        assert resumed[-1] == reference[-1], yields
        assert tools.total() == 1, yields


async def test_a_resume_goes_on_from_the_answer_its_clients_saw() -> None:
    """What clients saw (the recording, flushed every half second) is often
    newer than the checkpoint (every few seconds). Where it only adds text,
    the resumed turn starts from it and the model is asked to continue it:
    nothing shown is produced again. Otherwise the checkpoint stands."""

    def make_model() -> ChatModel:
        return _model(tool_call_after_chunks=5)

    prompt = "Write about harbors"
    reference = await _run(
        ChatClient(make_model()), _conversation(prompt), [_Executions().calculator()]
    )
    caught_up = 0
    for checkpointed in range(1, len(reference) + 1):
        state = await _killed_after(make_model, prompt, [_Executions().calculator()], checkpointed)
        for shown_at in range(checkpointed, len(reference) + 1):
            shown = reference[shown_at - 1]
            client = ChatClient(make_model())
            await client.load(state, resuming_turn=True)
            await client.catch_up(shown)
            resumed = await _run(client, _conversation(prompt), [_Executions().calculator()])
            assert resumed[-1] == reference[-1], (checkpointed, shown_at)
            if _tool_parts(shown) == _tool_parts(reference[checkpointed - 1]):
                # The same tool calls, so only text was added: go on from it.
                assert resumed == reference[shown_at - 1 :], (checkpointed, shown_at)
                caught_up += shown_at > checkpointed
            else:
                assert resumed[0] == reference[checkpointed - 1], (checkpointed, shown_at)
    assert caught_up > 0


async def test_a_tool_completed_before_the_checkpoint_is_not_run_again() -> None:
    tools = _Executions()
    client = ChatClient(_model())
    checkpoints: list[dict[str, Any]] = []

    async def checkpoint() -> None:
        checkpoints.append(_json_round_trip(await client.dump()))

    client.bind_checkpoint_hook(checkpoint)
    prompt = "What is 6 * 7 and what time is it?"
    stream = _closable(client.stream(_conversation(prompt), [tools.calculator(), tools.clock()]))
    async for _ in stream:
        if any(_completed_tools(state) for state in checkpoints):
            break  # the producer dies right after the first tool completed
    await stream.aclose()
    assert tools.counts == Counter({"calculator:6 * 7": 1})

    resumed = await _resumed(_model, prompt, [tools.calculator(), tools.clock()], checkpoints[-1])
    # The calculator is not executed again; the clock, never completed, runs now.
    assert tools.counts == Counter({"calculator:6 * 7": 1, "clock": 1})
    reference = await _crash_free(
        _model, prompt, [_Executions().calculator(), _Executions().clock()]
    )
    assert resumed[-1] == reference


def _completed_tools(state: dict[str, Any]) -> list[str]:
    return [
        p["tool"]["name"]
        for p in state["content_parts"]
        if p["type"] == "tool" and p["tool"]["status"] == "completed"
    ]


async def test_a_read_only_tool_running_at_checkpoint_time_runs_again() -> None:
    """Its outcome is unknown on resume; reading twice is harmless: ``retry``."""
    client = ChatClient(_model())
    states: list[dict[str, Any]] = []

    @tool(name="calculator", read_only=True)
    async def calculator(expression: str) -> int:
        # The checkpoint the periodic worker takes while the tool is running.
        states.append(_json_round_trip(await client.dump()))
        return 42

    reference = await _run(client, _conversation("What is 6 * 7?"), [calculator])
    [during] = states
    [part] = during["content_parts"][-1:]
    assert part["tool"]["status"] == "running"
    resumed = await _resumed(_model, "What is 6 * 7?", [calculator], during)
    assert len(states) == 2  # it ran once more
    assert resumed[-1] == reference[-1]


async def _state_inside_the_call(
    on_unknown: str | None, prompt: str = "What is 6 * 7?"
) -> tuple[dict[str, Any], list[str]]:
    """A turn whose producer dies inside its tool call: the checkpoint it leaves
    (the call started, not completed), and the log of the tool's runs."""
    client = ChatClient(_model(), turn_id="turn-1")
    states: list[dict[str, Any]] = []
    runs: list[str] = []

    @tool(name="calculator", on_unknown=on_unknown)  # type: ignore[arg-type]
    async def calculator(expression: str) -> int:
        call = current_tool_call()
        assert call is not None
        runs.append(f"{call.idempotency_key}#{call.attempt}")
        if len(runs) == 1:
            states.append(_json_round_trip(await client.dump()))
            raise asyncio.CancelledError  # the replica dies here
        return 42

    stream = _closable(client.stream(_conversation(prompt), [calculator]))
    with pytest.raises(asyncio.CancelledError):
        async for _ in stream:
            pass
    return states[0], runs


def _calculator_logging(runs: list[str], **options: Any) -> Tool:
    @tool(name="calculator", **options)
    async def calculator(expression: str) -> int:
        call = current_tool_call()
        assert call is not None
        runs.append(f"{call.idempotency_key}#{call.attempt}")
        return 42

    return calculator


async def test_a_writing_tool_whose_call_was_cut_off_is_not_run_again() -> None:
    """The default for a tool that is not read-only (``fail``): at most once, and
    the model is told the call may or may not have happened."""
    state, runs = await _state_inside_the_call(on_unknown=None)
    model = _RecordingModel(_model())
    client = ChatClient(model, turn_id="turn-1")
    await client.load(state, resuming_turn=True)
    resumed = await _run(client, _conversation("What is 6 * 7?"), [_calculator_logging(runs)])
    assert runs == ["turn-1:0#1"]  # never again
    [part] = _tool_parts(resumed[-1])
    assert part.status == ToolCallStatus.ERROR
    assert "may or may not have happened" in str(part.response)
    told = [m for m in model.transcripts[0] if m.role == "tool"]
    assert len(told) == 1 and "may or may not have happened" in told[0].content


async def test_a_retry_tool_runs_again_with_the_same_idempotency_key() -> None:
    state, runs = await _state_inside_the_call(on_unknown="retry")
    client = ChatClient(_model(), turn_id="turn-1")
    await client.load(state, resuming_turn=True)
    resumed = await _run(
        client, _conversation("What is 6 * 7?"), [_calculator_logging(runs, on_unknown="retry")]
    )
    assert runs == ["turn-1:0#1", "turn-1:0#2"]
    [part] = _tool_parts(resumed[-1])
    assert (part.status, part.response) == (ToolCallStatus.COMPLETED, 42)


async def test_an_ask_tool_whose_call_was_cut_off_ends_the_turn_with_a_question() -> None:
    state, runs = await _state_inside_the_call(on_unknown="ask")
    model = _RecordingModel(_model())
    client = ChatClient(model, turn_id="turn-1")
    await client.load(state, resuming_turn=True)
    resumed = await _run(
        client, _conversation("What is 6 * 7?"), [_calculator_logging(runs, on_unknown="ask")]
    )
    assert runs == ["turn-1:0#1"]
    assert model.transcripts == []  # the model is not asked to go on
    assert "Should I run it again" in resumed[-1].content
    assert all(p.status == ToolCallStatus.ERROR for p in _tool_parts(resumed[-1]))
    assert (await client.dump())["finished"] is True


async def test_a_fenced_producer_never_runs_the_tool() -> None:
    """The call's *started* checkpoint is a fenced write: refused, nothing runs."""

    class Fenced(Exception):
        pass

    runs: list[str] = []
    client = ChatClient(_model(), turn_id="turn-1")

    async def refused() -> None:
        raise Fenced

    client.bind_checkpoint_hook(refused)
    with pytest.raises(Fenced):
        await _run(client, _conversation("What is 6 * 7?"), [_calculator_logging(runs)])
    assert runs == []


async def test_request_checkpoint_brackets_each_tool_call() -> None:
    tools = _Executions()
    client = ChatClient(_model())
    statuses_at_checkpoint: list[list[str]] = []

    async def checkpoint() -> None:
        state = await client.dump()
        statuses_at_checkpoint.append(
            [p["tool"]["status"] for p in state["content_parts"] if p["type"] == "tool"]
        )

    client.bind_checkpoint_hook(checkpoint)
    await _run(
        client,
        _conversation("What is 6 * 7 and what time is it?"),
        [tools.calculator(), tools.clock()],
    )
    # Each call is checkpointed as started before it runs, and with its result after.
    assert statuses_at_checkpoint == [
        ["running", "running"],
        ["completed", "running"],
        ["completed", "running"],
        ["completed", "completed"],
    ]


async def test_dump_is_json_serializable_at_every_yield() -> None:
    client = ChatClient(_model(tool_call_after_chunks=3))

    @tool(name="calculator")
    async def calculator(expression: str) -> object:
        return {"value": 42, "as_set": {1}}  # not JSON as such: made JSON-able

    async for _ in client.stream(_conversation("Essay"), [calculator]):
        state = await client.dump()
        assert _json_round_trip(state) == state
    [part] = [p for p in state["content_parts"] if p["type"] == "tool"]
    assert part["tool"]["response"] == {"value": 42, "as_set": [1]}


async def test_state_of_an_earlier_finished_turn_starts_the_new_turn_fresh() -> None:
    first = ChatClient(_model())
    await _run(first, _conversation("Hello"))
    finished_state = _json_round_trip(await first.dump())
    assert finished_state["finished"] is True

    client = ChatClient(_model())
    await client.load(finished_state, resuming_turn=False)
    messages = await _run(client, _conversation("Tell me about bridges"))
    assert messages[0].content_parts and len(messages[0].content.split()) == 3
    assert messages[-1] == await _crash_free(_model, "Tell me about bridges", [])


async def test_resuming_a_finished_turn_only_repeats_the_answer() -> None:
    model = _RecordingModel(_model())
    first = ChatClient(_model())
    final = (await _run(first, _conversation("Hello")))[-1]
    client = ChatClient(model)
    await client.load(_json_round_trip(await first.dump()), resuming_turn=True)
    assert await _run(client, _conversation("Hello")) == [final]
    assert model.transcripts == []


async def test_a_resumed_turn_sends_the_partial_text_for_continuation() -> None:
    state = await _killed_after(_model, "Tell me about rivers", [], 4)
    model = _RecordingModel(_model())
    client = ChatClient(model)
    await client.load(state, resuming_turn=True)
    await _run(client, _conversation("Tell me about rivers"))
    [transcript] = model.transcripts
    assert transcript[-1] == ModelMessage(role="assistant", content=state["partial_text"])
    assert len(state["partial_text"].split()) == 4 * 3


async def test_load_of_an_empty_state_is_a_fresh_turn() -> None:
    client = ChatClient(_model())
    await client.load({}, resuming_turn=True)
    messages = await _run(client, _conversation("Hello"))
    assert messages[-1] == await _crash_free(_model, "Hello", [])


# The factory


def test_factory_builds_the_offline_model_by_default() -> None:
    for name in (None, "offline"):
        setup = AgentSetup(
            agent_identifier="a",
            agent_name="assistant",
            llm_configuration_name=name,
            agent_configuration={"llm": {"seed": 3, "answer_chunks": 7, "max_tool_rounds": 2}},
        )
        client = ChatClientFactory.create(setup, TURN)
        assert isinstance(client.model, OfflineChatModel)
        assert (client.model.options.seed, client.model.options.answer_chunks) == (3, 7)
        assert client.max_tool_rounds == 2


async def test_factory_builds_the_openai_model_with_a_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TETHER_LLM_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "from-openai-env")
    setup = AgentSetup(
        agent_identifier="a",
        agent_name="assistant",
        llm_configuration_name="openai",
        agent_configuration={
            "llm": {"model": "gpt-test", "base_url": "http://127.0.0.1:9/v1", "temperature": 0.2}
        },
    )
    client = ChatClientFactory.create(setup, TURN)
    model = client.model
    assert isinstance(model, OpenAICompatibleChatModel)
    assert (model.model, model.temperature) == ("gpt-test", 0.2)
    assert model._client.api_key == "from-openai-env"
    monkeypatch.setenv("TETHER_LLM_API_KEY", "from-tether-env")
    assert ChatClientFactory.create(setup, TURN).model._client.api_key == "from-tether-env"  # type: ignore[attr-defined]
    secret = setup.model_copy(
        update={"agent_configuration": {"llm": {"model": "gpt-test", "api_key": "from-secrets"}}}
    )
    assert ChatClientFactory.create(secret, TURN).model._client.api_key == "from-secrets"  # type: ignore[attr-defined]
    await client.aclose()


def test_factory_errors_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_LLM_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def setup(name: str | None, llm: Any) -> AgentSetup:
        return AgentSetup(
            agent_identifier="a",
            agent_name="x",
            llm_configuration_name=name,
            agent_configuration={"llm": llm},
        )

    with pytest.raises(ValueError, match="unknown llm_configuration_name 'claude'"):
        ChatClientFactory.create(setup("claude", {}), TURN)
    with pytest.raises(ValueError, match="no API key"):
        ChatClientFactory.create(setup("openai", {"model": "m"}), TURN)
    with pytest.raises(ValueError, match="needs a 'model'"):
        ChatClientFactory.create(setup("openai", {"api_key": "k"}), TURN)
    with pytest.raises(ValueError, match="unknown openai llm options"):
        ChatClientFactory.create(setup("openai", {"model": "m", "api_key": "k", "seed": 1}), TURN)
    with pytest.raises(ValueError, match="invalid offline model options"):
        ChatClientFactory.create(setup("offline", {"chunk_size": -1}), TURN)
    with pytest.raises(ValueError, match="must be an object"):
        ChatClientFactory.create(setup("offline", "fast"), TURN)


# The example long-writer: the reference turn of the crash tests


def _example_tools() -> ModuleType:
    # By path: importing tether.examples.agents would register the example agents
    # under a module name the project loader does not use (see test_tools.py).
    spec = importlib.util.spec_from_file_location("_tether_example_tools", EXAMPLES / "tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_long_writer_setup_streams_about_200_chunks_over_about_20_seconds() -> None:
    setups = {
        s["agent_identifier"]: s for s in json.loads((EXAMPLES / "agent_setups.json").read_text())
    }
    setup = AgentSetup.model_validate(setups["long-writer"])
    assert ChatClientFactory.create(setup, TURN).model.options.answer_chunks == 200  # type: ignore[attr-defined]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    def make_model() -> ChatModel:
        return OfflineChatModel.from_options(setup.agent_configuration["llm"], sleep=sleep)

    calculator = _example_tools().calculator
    messages = await _run(
        ChatClient(make_model()), _conversation("Write me a long essay."), [calculator]
    )
    assert 180 <= len(slept) <= 220 and 18 <= sum(slept) <= 22
    final = messages[-1]
    [part] = _tool_parts(final)
    assert part.name == "calculator" and part.status == ToolCallStatus.COMPLETED
    # The call comes after 10 chunks: the 11th yield shows it running.
    assert (
        _tool_parts(messages[9]) == []
        and _tool_parts(messages[10])[0].status == ToolCallStatus.RUNNING
    )
    again = await _run(
        ChatClient(make_model()), _conversation("Write me a long essay."), [calculator]
    )
    assert again[-1] == final


async def test_a_client_the_agent_built_itself_keys_its_calls_by_the_running_turn() -> None:
    """A ChatClient made without ``turn_id`` (an agent building its own) names
    the turn its task runs (the turn sets it) in its idempotency keys; outside
    any turn, each client keys its calls apart. Before, both were
    ``turn:{index}``: every turn's first call had the same key, so a service
    deduplicating on it would drop a later turn's call as a repeat."""
    runs: list[str] = []
    question = _conversation("What is 6 * 7?")

    async def in_turn(message_id: str) -> None:
        set_current_turn(message_id)
        await _run(ChatClient(_model()), question, [_calculator_logging(runs)])

    await asyncio.create_task(in_turn("turn-7"))
    await asyncio.create_task(in_turn("turn-8"))
    assert runs == ["turn-7:0#1", "turn-8:0#1"]

    runs.clear()
    await _run(ChatClient(_model()), question, [_calculator_logging(runs)])
    await _run(ChatClient(_model()), question, [_calculator_logging(runs)])
    first, second = (run.rsplit(":", 1)[0] for run in runs)
    assert first != second and "turn" not in first


async def test_two_answers_of_one_turn_number_their_calls_on_across_both() -> None:
    """An agent that asks for two answers in one turn (``stream`` twice):
    the second answer's calls go on from the first's, across a resume in
    the middle of the second one's call too. Before, each answer counted
    from 0, so both first calls were ``turn-1:0`` and a service
    deduplicating on the key would drop the second as a repeat."""
    runs: list[str] = []
    client = ChatClient(_model(), turn_id="turn-1")
    states: list[dict[str, Any]] = []

    @tool(name="calculator", on_unknown="retry")
    async def calculator(expression: str) -> int:
        call = current_tool_call()
        assert call is not None
        runs.append(f"{call.idempotency_key}#{call.attempt}")
        if len(runs) == 2:
            states.append(_json_round_trip(await client.dump()))
            raise asyncio.CancelledError  # the replica dies here
        return 42

    await _run(client, _conversation("What is 6 * 7?"), [calculator])
    stream = _closable(client.stream(_conversation("And 7 * 6?"), [calculator]))
    with pytest.raises(asyncio.CancelledError):
        async for _ in stream:
            pass
    assert runs == ["turn-1:0#1", "turn-1:1#1"]

    resumed = ChatClient(_model(), turn_id="turn-1")
    await resumed.load(states[0], resuming_turn=True)
    await _run(
        resumed, _conversation("And 7 * 6?"), [_calculator_logging(runs, on_unknown="retry")]
    )
    await _run(resumed, _conversation("And 6 * 6?"), [_calculator_logging(runs)])
    assert runs == ["turn-1:0#1", "turn-1:1#1", "turn-1:1#2", "turn-1:2#1"]

    # A new turn counts from 0 again.
    runs.clear()
    await resumed.load(await resumed.dump(), resuming_turn=False)
    resumed.turn_id = "turn-2"
    await _run(resumed, _conversation("What is 6 * 7?"), [_calculator_logging(runs)])
    assert runs == ["turn-2:0#1"]
