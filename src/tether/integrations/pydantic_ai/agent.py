"""``PydanticAIChatAgent``: a PydanticAI agent as a tether agent with durable turns.

A turn runs the PydanticAI agent node by node (``Agent.iter``) on the
conversation as message history, streaming its text, tool calls and tool
results as one cumulative tether message. ``PydanticAIRun`` (its resumable
dependency) checkpoints the history after every model response and the tool
ledger around every tool call (``DurableTools``); a resume, on any replica,
shows the checkpointed answer at once and continues the run from that
history: no finished response is asked for again and no settled tool call
runs again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

from pydantic_ai import Agent, AgentRun
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import (
    FunctionToolResultEvent,
    ModelMessage,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models import Model

from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_message import ChatMessage, ToolCallStatus
from tether.integrations.pydantic_ai._answer import ToolOutcome, answer, outcome_of
from tether.integrations.pydantic_ai._conversation import history_and_prompt
from tether.integrations.pydantic_ai._durable_tools import (
    NOT_RUN_WHILE_ASKING,
    AskTheUser,
    DurableTools,
    unknown_outcome,
)
from tether.integrations.pydantic_ai.run_state import PydanticAIRun, ToolCallRecord
from tether.tools import current_turn_id


class PydanticAIChatAgent(StreamableChatAgent):
    """Subclass it, set ``agent`` to any PydanticAI agent and ``agent_name``,
    and register it with ``@ChatAgentClassRegistry.register()``.

    A subclass that needs more constructor dependencies takes them after
    ``pydantic_ai_run`` and calls ``super().__init__(pydantic_ai_run)``; one
    whose agent has ``deps`` returns them from ``agent_deps``, and one that
    picks its model per turn (from its setup, say) returns it from ``agent_model``.
    """

    agent: ClassVar[AbstractAgent[Any, Any]]

    def __init__(self, pydantic_ai_run: PydanticAIRun) -> None:
        self.pydantic_ai_run = pydantic_ai_run

    def agent_deps(self) -> Any:
        """The ``deps`` of the turn's PydanticAI run (none by default)."""
        return None

    def agent_model(self) -> Model | None:
        """The model of the turn's PydanticAI run (None: the one ``agent`` was given)."""
        return None

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        state = self.pydantic_ai_run
        prompt: str | None = None
        if state.resumed:
            # The run goes on from its checkpoint; what it showed is shown at once.
            yield self._answer({})
        else:
            history, prompt = history_and_prompt(conversation)
            state.begin(history)
        if state.finished:
            return
        async for message in self._run(prompt):
            yield message

    async def _run(self, prompt: str | None) -> AsyncGenerator[ChatMessage, None]:
        state = self.pydantic_ai_run
        shown: dict[str, ToolOutcome] = {}
        asked: str | None = None
        tools = DurableTools(state, state.turn_key or current_turn_id() or _own_key())
        try:
            async with self.agent.iter(
                prompt,
                message_history=list(state.history),
                model=self.agent_model(),
                deps=self.agent_deps(),
                capabilities=[tools],
            ) as run:
                node = run.next_node
                while not Agent.is_end_node(node):
                    if Agent.is_model_request_node(node):
                        live: dict[int, str] = {}
                        async with node.stream(run.ctx) as events:
                            async for event in events:
                                if _add_text(live, event):
                                    yield self._answer(shown, live.values())
                        node = await run.next(node)
                        # The response is finished: it is in the history from here on.
                        state.history = _snapshot(run)
                        await state.request_checkpoint()
                        yield self._answer(shown)
                    elif Agent.is_call_tools_node(node):
                        async with node.stream(run.ctx) as events:
                            async for event in events:
                                if isinstance(event, FunctionToolResultEvent):
                                    settled = outcome_of(event.part)
                                    if settled is not None:
                                        shown[event.part.tool_call_id] = settled
                                        yield self._answer(shown)
                        node = await run.next(node)
                    else:
                        node = await run.next(node)
                state.history = _snapshot(run)
        except* AskTheUser as group:
            asked = group.exceptions[0].args[0]
        if asked is not None:
            # The response's other calls still open: not run, and shown so (or,
            # had one started, as of unknown outcome).
            for part in self._answer(shown).content_parts or []:
                tool = part.tool
                if tool and tool.status is ToolCallStatus.RUNNING:
                    record = state.tools.get(tool.tool_call_id)
                    started = record is not None and record.started > 0
                    why = unknown_outcome(tool.name) if started else NOT_RUN_WHILE_ASKING
                    shown[tool.tool_call_id] = (ToolCallStatus.ERROR, why)
            state.notes.append(_ask_about(asked))
        state.finished = True
        await state.request_checkpoint()
        yield self._answer(shown)

    def _answer(self, shown: dict[str, ToolOutcome], live: Any = ()) -> ChatMessage:
        state = self.pydantic_ai_run
        outcomes = {**_ledger_outcomes(state.tools), **shown}
        return answer(state.turn_messages(), outcomes=outcomes, live_text=live, notes=state.notes)


def _snapshot(run: AgentRun[Any, Any]) -> list[ModelMessage]:
    """The run's history as it is now, a copy. ``all_messages()`` is the run's
    own list, which goes on growing: with the next request, and with the
    response being streamed when the stream is cut off (a drain cancels it).
    Kept as is, a checkpoint taken then would hold that unfinished response
    as a finished one, and a resume would answer after it."""
    return list(run.all_messages())


def _add_text(live: dict[int, str], event: object) -> bool:
    """Fold a streamed event into the response's text parts; whether it added text."""
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        live[event.index] = event.part.content
        return bool(event.part.content)
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        live[event.index] = live.get(event.index, "") + event.delta.content_delta
        return bool(event.delta.content_delta)
    return False


def _ledger_outcomes(tools: dict[str, ToolCallRecord]) -> dict[str, ToolOutcome]:
    outcomes: dict[str, ToolOutcome] = {}
    for call_id, record in tools.items():
        if record.outcome == "returned":
            outcomes[call_id] = (ToolCallStatus.COMPLETED, record.value)
        elif record.outcome is not None:
            outcomes[call_id] = (ToolCallStatus.ERROR, record.value)
    return outcomes


def _ask_about(name: str) -> str:
    return (
        f"I could not tell whether {name} ran: the server running it stopped before it "
        "recorded the result. Should I run it again, or check first?"
    )


def _own_key() -> str:
    # A run outside any turn (a test driving the agent directly): keys of its own.
    return f"pydantic-ai-{uuid.uuid4().hex}"
