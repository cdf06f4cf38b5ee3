"""The checkpoint of a PydanticAI turn: its message history and its tool ledger.

``PydanticAIRun`` is the resumable dependency every ``PydanticAIChatAgent``
gets. What it checkpoints is consistent at any moment the runtime asks (every
few seconds, and whenever the agent asks):

- ``history``: the run's PydanticAI message history (``ModelMessagesTypeAdapter``),
  up to its last finished model response. A response being streamed is never
  in it: a resume asks the model for that response again.
- ``new_from``: where this turn's messages start in ``history``.
- ``tools``: the ledger of the turn's tool calls, by call id: how often each
  was started, and its outcome once settled. The results of a response's
  calls reach the history only with the next request, so the ledger is what
  tells a resume which calls of that response already ran.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from tether.domain.agent_dependency import AgentDependencyFactory, ResumableAgentDependency
from tether.domain.turn_context import TurnContext
from tether.tools import OnUnknown


class ToolCallRecord(BaseModel):
    """One tool call of the turn, as the ledger knows it."""

    name: str
    started: int = 0
    """Attempts started; a call started and not settled has an unknown outcome."""
    on_unknown: OnUnknown | None = None
    """Its tool's policy, recorded as it starts: a resume reads it for every
    call cut off, before it meets the call itself (None in a checkpoint of
    before it was recorded)."""
    outcome: Literal["returned", "retry", "failed"] | None = None
    """How it settled: the tool returned ``value``, asked the model to retry
    (``value`` is the message) or failed (``value`` is the reason)."""
    value: Any = None


class _State(BaseModel):
    version: Literal[1] = 1
    turn_key: str | None = None
    history: list[Any] = Field(default_factory=list)
    new_from: int = 0
    tools: dict[str, ToolCallRecord] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    finished: bool = False


class PydanticAIRun(ResumableAgentDependency):
    """The durable state of one PydanticAI run: what a resume continues from."""

    state_key: ClassVar[str] = "pydantic_ai"

    def __init__(self, turn_key: str | None = None) -> None:
        self.turn_key = turn_key
        """The turn's message id: the first half of each call's idempotency key."""
        self.history: list[ModelMessage] = []
        self.new_from = 0
        self.tools: dict[str, ToolCallRecord] = {}
        self.notes: list[str] = []
        self.finished = False
        self.resumed = False
        """Loaded from a checkpoint of this very turn that has a model response."""

    def begin(self, history: list[ModelMessage]) -> None:
        """Start the turn's run on ``history`` (the conversation before its prompt)."""
        self.history = list(history)
        self.new_from = len(history)
        self.tools, self.notes, self.finished, self.resumed = {}, [], False, False

    def turn_messages(self) -> list[ModelMessage]:
        return self.history[self.new_from :]

    def call_index(self, call_id: str) -> int:
        """The call's place among every tool call of the turn (0 for the first)."""
        ids = [
            part.tool_call_id
            for message in self.turn_messages()
            if message.kind == "response"
            for part in message.tool_calls
        ]
        return ids.index(call_id) if call_id in ids else len(ids)

    async def dump(self) -> dict[str, Any]:
        history = ModelMessagesTypeAdapter.dump_python(self.history, mode="json")
        state = _State(
            turn_key=self.turn_key,
            history=history,
            new_from=self.new_from,
            tools=self.tools,
            notes=self.notes,
            finished=self.finished,
        )
        return state.model_dump(mode="json")

    async def load(self, state: dict[str, Any], *, resuming_turn: bool) -> None:
        """Restore a checkpoint of the turn being resumed. A checkpoint of an
        earlier turn is not this turn's run: the conversation, which says what
        became of it, is the history a new turn starts from."""
        if not (resuming_turn and state):
            return
        saved = _State.model_validate(state)
        if saved.turn_key is not None and self.turn_key is not None:
            if saved.turn_key != self.turn_key:
                return
        history = ModelMessagesTypeAdapter.validate_python(saved.history)
        if not any(m.kind == "response" for m in history[saved.new_from :]):
            return  # nothing was answered yet: the turn starts over from its conversation
        self.history, self.new_from = history, saved.new_from
        self.tools, self.notes, self.finished = dict(saved.tools), list(saved.notes), saved.finished
        self.resumed = True


class PydanticAIRunFactory(AgentDependencyFactory):
    """One ``PydanticAIRun`` per turn, keyed by the turn's message id."""

    @classmethod
    def create(cls, turn: TurnContext) -> PydanticAIRun:
        return PydanticAIRun(turn.message_id)
