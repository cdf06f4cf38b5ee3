"""The model interface: what the model/tool loop needs from an LLM.

Two implementations ship: an OpenAI-compatible chat-completions client and an
offline, deterministic model (for demos, tests, crash tests and benchmarks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

ModelRole = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ModelToolCall:
    """A tool call the model asked for, fully assembled (arguments parsed)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ModelMessage:
    """One message of the model's transcript, in chat-completions terms."""

    role: ModelRole
    content: str = ""
    tool_calls: tuple[ModelToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, a description, a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TextDelta:
    """New text from the model, to append to the answer."""

    text: str


ModelEvent = TextDelta | ModelToolCall


class ChatModel(ABC):
    """A streaming LLM.

    ``stream`` yields text deltas as they arrive and each requested tool call
    once complete. When the transcript ends with an assistant message holding
    partial text (a resumed turn), the model continues that text rather than
    starting over; the deltas it yields are only the continuation.
    """

    model_name: str | None = None
    """The model asked for, as a trace names it (``gen_ai.request.model``)."""
    provider_name: str | None = None
    """Who serves it, as a trace names it (``gen_ai.provider.name``: ``openai``)."""

    @abstractmethod
    def stream(
        self, messages: list[ModelMessage], tools: list[ToolSpec]
    ) -> AsyncIterator[ModelEvent]:
        """Stream one model response to ``messages``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most models hold nothing
        """Release connections; called when the model is no longer used."""
