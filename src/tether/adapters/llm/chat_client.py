"""The model/tool loop, as a resumable agent dependency.

``ChatClient.stream`` drives a ``ChatModel`` through tool calls and yields cumulative
bot messages. Its working state (what the model said and which tools ran this turn)
is checkpointed by the runtime, so a turn taken over after its producer died resumes
where it was: the restored answer is shown at once, completed tool calls are not run
again, and the model continues its partial text. That state is
``answer_state.AnswerState``; what the model reads of the conversation before
it, ``model_messages``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

from pydantic_core import to_jsonable_python

from tether.adapters.llm.answer_state import AnswerState
from tether.adapters.llm.model_messages import model_prefix
from tether.adapters.llm.offline import OfflineChatModel
from tether.adapters.llm.openai_compatible import OpenAICompatibleChatModel
from tether.domain.agent_dependency import AgentDependencyFactory, ResumableAgentDependency
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_message import (
    ChatMessage,
    ToolCallStatus,
)
from tether.domain.chat_model import ChatModel, ModelToolCall, TextDelta
from tether.domain.turn_context import TurnContext
from tether.observability.genai import model_call, tool_call
from tether.tools import (
    MalformedToolCall,
    Tool,
    ToolCallContext,
    current_turn_id,
    running_tool_call,
)


class ChatClient(ResumableAgentDependency):
    """Runs one answer: model, tools, model again, until the model stops asking for tools.

    Every yield of ``stream`` is the whole answer so far. ``dump`` captures the
    turn's progress; after ``load(state, resuming_turn=True)`` the next ``stream``
    yields the restored answer first and re-drives the model from exactly there.
    """

    state_key: ClassVar[str] = "chat_client"
    restores_conversation: ClassVar[bool] = False

    def __init__(
        self, model: ChatModel, max_tool_rounds: int = 8, *, turn_id: str | None = None
    ) -> None:
        if max_tool_rounds < 0:
            raise ValueError("max_tool_rounds must be >= 0")
        self.model = model
        self.max_tool_rounds = max_tool_rounds
        self.turn_id = turn_id
        """The turn's message id: the first half of each call's idempotency key."""
        self._own_id: str | None = None
        self._turn = AnswerState()
        self._resume_next = False

    async def stream(
        self,
        conversation: list[ChatMessage],
        tools: Sequence[Tool] = (),
        system_prompt: str | None = None,
    ) -> AsyncIterator[ChatMessage]:
        """Answer ``conversation`` (its last message is the user's), yielding cumulative
        bot messages; the last one is the final answer."""
        if self._resume_next:
            self._resume_next = False
            turn = self._turn
            if turn.turn_key is None:  # a checkpoint from before keys were per turn
                turn.turn_key = self._key_prefix()
        else:
            turn = self._turn = self._turn.next_answer(self._key_prefix())
        tools_by_name = _index(tools)
        specs = [tool.spec() for tool in tools]
        prefix = model_prefix(conversation, system_prompt)

        if turn.content_parts:
            yield turn.message()
        yielded = bool(turn.content_parts)
        while not turn.finished:
            # A checkpoint can land between the model asking for tools and the tools
            # finishing: run what is still pending before asking the model again.
            for call in turn.pending_tool_calls():
                yield await self._run_tool(turn, call, tools_by_name)
                yielded = True
                if turn.finished:
                    break  # a call of unknown outcome whose tool says: ask the user
            if turn.finished:
                break
            requested: list[ModelToolCall] = []
            with model_call(self.model.model_name, self.model.provider_name):
                async for event in self.model.stream(prefix + turn.model_messages(), specs):
                    if isinstance(event, TextDelta):
                        if event.text:
                            turn.add_text(event.text)
                            yield turn.message()
                            yielded = True
                    else:
                        requested.append(event)
            if not requested:
                turn.finished = True
            elif turn.tool_rounds() >= self.max_tool_rounds:
                turn.add_note(
                    f"(Stopped: the model asked for more tools after {self.max_tool_rounds} "
                    "tool rounds, the limit for one answer.)"
                )
                turn.finished = True
                yield turn.message()
                yielded = True
            else:
                turn.request_tools(requested)
                yield turn.message()
                yielded = True
        if not yielded:
            # Even an empty answer is an answer: the agent's caller gets a message.
            yield turn.message()

    async def _run_tool(
        self, turn: AnswerState, call: ModelToolCall, tools_by_name: Mapping[str, Tool]
    ) -> ChatMessage:
        """Run one call, recorded as started (checkpointed) before it runs and
        completed (checkpointed) before its result is shown. A call a previous
        producer started and never completed is settled by its tool's
        ``on_unknown`` instead (see ``tether.tools``)."""
        tool = tools_by_name.get(call.name)
        attempts = turn.started.get(call.id, 0)
        if attempts and tool is not None and tool.on_unknown != "retry":
            turn.complete_tool(call.id, ToolCallStatus.ERROR, _unknown_outcome(call.name))
            if tool.on_unknown == "ask":
                turn.close_pending(_NOT_RUN_WHILE_ASKING)
                turn.add_note(_ask_about(call.name))
                turn.finished = True
            await self.request_checkpoint()
            return turn.message()
        runs = tool is not None and not isinstance(call, MalformedToolCall)
        if runs:
            # Durable before the call runs: a resume knows it may have happened.
            # A fenced producer's checkpoint is refused, so it never runs it.
            turn.started[call.id] = attempts + 1
            await self.request_checkpoint()
        index = turn.first_call_index + turn.call_index(call.id)
        context = ToolCallContext(
            idempotency_key=f"{self._key_prefix()}:{index}",
            call_index=index,
            attempt=attempts + 1,
            tool_call_id=call.id,
        )
        with tool_call(call.name, call.id) as span, running_tool_call(context):
            status, response = await _invoke(call, tools_by_name)
            if span is not None and status is ToolCallStatus.ERROR:
                span.fail("tool_error")
        turn.complete_tool(call.id, status, response)
        # Checkpoint before showing the result: once the runtime has this state, a
        # resume on any replica will not execute the call again.
        await self.request_checkpoint()
        return turn.message()

    def _key_prefix(self) -> str:
        """What the turn's idempotency keys start with: the turn's message id
        (given, or the turn whose task runs this client), the same on every
        replica that runs it; a client outside any turn gets an id of its own,
        so its keys never match another's."""
        if self.turn_id is not None:
            return self.turn_id
        running = current_turn_id()
        if running is not None:
            return running  # read each time: one client may serve several turns
        if self._own_id is None:
            self._own_id = f"client-{uuid.uuid4().hex}"
        return self._own_id

    async def catch_up(self, shown: ChatMessage) -> None:
        """Go on from the answer its clients saw when it only adds text to the
        checkpointed one: that text becomes the model's partial response, which
        the model is asked to continue. A shown answer that differs otherwise (a
        tool call shown running, parts the checkpoint lacks) keeps the
        checkpoint, and what the model says again is held back by the runtime."""
        turn = self._turn
        if turn.finished or turn.pending_tool_calls():
            return
        extra = turn.text_beyond(shown.content_parts or [])
        if extra:
            turn.add_text(extra)
            self._resume_next = True

    async def dump(self) -> dict[str, Any]:
        """The current turn's progress, JSON-serializable."""
        return self._turn.model_dump(mode="json")

    async def load(self, state: dict[str, Any], *, resuming_turn: bool) -> None:
        """Restore a checkpoint of the turn being resumed; a checkpoint of an earlier,
        finished turn means nothing to a new turn, which starts fresh."""
        if resuming_turn and state:
            self._turn = AnswerState.model_validate(state)
            self._resume_next = True
        else:
            self._turn = AnswerState()
            self._resume_next = False

    async def aclose(self) -> None:
        """Release the model's connections."""
        await self.model.aclose()


class ChatClientFactory(AgentDependencyFactory):
    """Builds a ``ChatClient`` for an agent from its setup.

    ``llm_configuration_name`` picks the model: ``"offline"`` (also when unset) or
    ``"openai"``. Options come from ``agent_configuration["llm"]``: for offline the
    ``OfflineChatModel`` options; for openai ``model``, ``base_url``, ``api_key`` and
    ``temperature``; for both ``max_tool_rounds``. The API key may also come from
    ``TETHER_LLM_API_KEY`` or ``OPENAI_API_KEY`` in the environment, so it need not
    sit in a setup file (the secrets file is the other place for it).
    """

    @classmethod
    def create(cls, setup: AgentSetup, turn: TurnContext) -> ChatClient:
        options = setup.agent_configuration.get("llm", {})
        if not isinstance(options, Mapping):
            raise ValueError(
                f"agent {setup.agent_identifier!r}: agent_configuration.llm must be an object"
            )
        options = dict(options)
        max_tool_rounds = options.pop("max_tool_rounds", 8)
        name = setup.llm_configuration_name or "offline"
        model: ChatModel
        if name == "offline":
            model = OfflineChatModel.from_options(options)
        elif name == "openai":
            model = _openai_model(setup.agent_identifier, options)
        else:
            raise ValueError(
                f"agent {setup.agent_identifier!r}: unknown llm_configuration_name {name!r}; "
                "expected 'offline' or 'openai'"
            )
        return ChatClient(model, max_tool_rounds=int(max_tool_rounds), turn_id=turn.message_id)


_OPENAI_OPTIONS = frozenset({"model", "base_url", "api_key", "temperature"})


def _openai_model(agent_identifier: str, options: dict[str, Any]) -> OpenAICompatibleChatModel:
    unknown = set(options) - _OPENAI_OPTIONS
    if unknown:
        raise ValueError(
            f"agent {agent_identifier!r}: unknown openai llm options {sorted(unknown)}; "
            f"expected some of {sorted(_OPENAI_OPTIONS)}"
        )
    if not options.get("model"):
        raise ValueError(f"agent {agent_identifier!r}: the openai llm needs a 'model' option")
    api_key = (
        options.get("api_key")
        or os.environ.get("TETHER_LLM_API_KEY")
        or os.environ.get("OPENAI_API_KEY")
    )
    if not api_key:
        raise ValueError(
            f"agent {agent_identifier!r}: no API key for the openai llm; put llm.api_key in "
            "the secrets file (env/agent_setups.json) or set TETHER_LLM_API_KEY"
        )
    temperature = options.get("temperature")
    return OpenAICompatibleChatModel(
        model=str(options["model"]),
        base_url=options.get("base_url"),
        api_key=str(api_key),
        temperature=None if temperature is None else float(temperature),
    )


async def _invoke(
    call: ModelToolCall, tools_by_name: Mapping[str, Tool]
) -> tuple[ToolCallStatus, Any]:
    if isinstance(call, MalformedToolCall):
        return ToolCallStatus.ERROR, f"could not parse the arguments of {call.name!r}: {call.error}"
    tool = tools_by_name.get(call.name)
    if tool is None:
        offered = ", ".join(sorted(tools_by_name)) or "none"
        return ToolCallStatus.ERROR, f"unknown tool {call.name!r} (offered: {offered})"
    try:
        result = await tool.invoke(call.arguments)
    except Exception as error:
        # A failing tool is information for the model, not the end of the turn.
        detail = str(error) or type(error).__name__
        return ToolCallStatus.ERROR, f"{type(error).__name__}: {detail}"
    # The response is checkpointed and recorded, so it must survive JSON.
    return ToolCallStatus.COMPLETED, to_jsonable_python(result, fallback=str)


def _index(tools: Sequence[Tool]) -> dict[str, Tool]:
    by_name: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in by_name:
            raise ValueError(f"two tools are named {tool.name!r}")
        by_name[tool.name] = tool
    return by_name


def _unknown_outcome(name: str) -> str:
    return (
        f"The call to {name} may or may not have happened: the server running it stopped "
        "before it could record the result. Do not assume it succeeded or failed, and do "
        "not call it again without asking the user."
    )


def _ask_about(name: str) -> str:
    return (
        f"I could not tell whether {name} ran: the server running it stopped before it "
        "recorded the result. Should I run it again, or check first?"
    )


_NOT_RUN_WHILE_ASKING = "Not run: the answer stopped to ask the user about an earlier call."
