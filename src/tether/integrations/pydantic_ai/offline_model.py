"""``OfflineModel``: tether's offline model as a PydanticAI model.

A PydanticAI agent on it needs no LLM service and answers deterministically:
the same prompt, tool results and options give the same text and the same
tool calls (ids included), on every replica. That is what lets a test or a
crash test compare a turn a replica took over with a crash-free one. It is
``OfflineChatModel`` (``tether.adapters.llm.offline``) behind PydanticAI's
``Model`` interface: the run's messages are translated to the offline model's
transcript and its text deltas and tool calls streamed back as PydanticAI
response events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    ModelResponseStreamEvent,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.profiles import ModelProfileSpec
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext
from pydantic_ai.usage import RequestUsage

from tether.adapters.llm.offline import (
    OfflineChatModel,
    OfflineChatModelOptions,
    OfflineToolCall,
    Sleep,
)
from tether.domain import chat_model as tether_model

_SYSTEM = "tether"


class OfflineModel(Model):
    """tether's deterministic offline model, for any ``pydantic_ai.Agent``.

    It takes ``OfflineChatModel``'s options (``seed``, ``chunks_per_second``,
    ``chunk_size``, ``answer_chunks``, ``tool_call_after_chunks``,
    ``call_tool``): with a ``calculator`` tool offered and arithmetic in the
    prompt it asks for the calculator, with the ``call_tool`` tool offered it
    asks for that tool, and after the results it writes the answer, opening
    with a sentence reporting them. ``sleep`` is how pacing waits.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        chunks_per_second: float = 0.0,
        chunk_size: int = 3,
        answer_chunks: int = 40,
        tool_call_after_chunks: int | None = None,
        call_tool: OfflineToolCall | Mapping[str, Any] | None = None,
        sleep: Sleep = asyncio.sleep,
        settings: ModelSettings | None = None,
        profile: ModelProfileSpec | None = None,
    ) -> None:
        self.offline = OfflineChatModel(
            seed=seed,
            chunks_per_second=chunks_per_second,
            chunk_size=chunk_size,
            answer_chunks=answer_chunks,
            tool_call_after_chunks=tool_call_after_chunks,
            call_tool=call_tool,
            sleep=sleep,
        )
        super().__init__(settings=settings, profile=profile)

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], *, sleep: Sleep = asyncio.sleep
    ) -> OfflineModel:
        """Build from a mapping such as an agent setup's ``llm`` section."""
        try:
            parsed = OfflineChatModelOptions.model_validate(dict(options))
        except ValidationError as error:
            raise ValueError(f"invalid offline model options: {error}") from error
        return cls(**parsed.model_dump(), sleep=sleep)

    @property
    def model_name(self) -> str:
        return OfflineChatModel.model_name

    @property
    def system(self) -> str:
        return _SYSTEM

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        _, parameters = self.prepare_request(model_settings, model_request_parameters)
        text: list[str] = []
        parts: list[ModelResponsePart] = []
        async for event in self._events(messages, parameters):
            if isinstance(event, tether_model.TextDelta):
                text.append(event.text)
            else:
                parts.append(_call_part(event))
        if text:
            parts.insert(0, TextPart("".join(text)))
        return ModelResponse(parts=parts, model_name=self.model_name, provider_name=_SYSTEM)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        _, parameters = self.prepare_request(model_settings, model_request_parameters)
        yield _OfflineStreamedResponse(
            model_request_parameters=parameters,
            _model_name=self.model_name,
            _events=self._events(messages, parameters),
        )

    def _events(
        self, messages: list[ModelMessage], parameters: ModelRequestParameters
    ) -> AsyncIterator[tether_model.ModelEvent]:
        tools = [
            tether_model.ToolSpec(
                name=tool.name,
                description=tool.description or "",
                parameters=dict(tool.parameters_json_schema),
            )
            for tool in parameters.declared_function_tools
        ]
        return self.offline.stream(transcript(messages), tools)


@dataclass
class _OfflineStreamedResponse(StreamedResponse):
    """The offline model's events as PydanticAI response events: its text as
    one text part, each tool call whole, in the order it produced them."""

    _model_name: str
    _events: AsyncIterator[tether_model.ModelEvent]
    _timestamp: datetime = field(default_factory=lambda: datetime.now().astimezone())

    async def _get_event_iterator(self) -> AsyncIterator[ModelResponseStreamEvent]:
        async for event in self._events:
            if isinstance(event, tether_model.TextDelta):
                # A rough count, one token a word: there is no tokenizer to ask.
                self._usage += RequestUsage(output_tokens=len(event.text.split()))
                for text_event in self._parts_manager.handle_text_delta(
                    vendor_part_id="text", content=event.text
                ):
                    yield text_event
            else:
                yield self._parts_manager.handle_tool_call_part(
                    vendor_part_id=event.id,
                    tool_name=event.name,
                    args=dict(event.arguments),
                    tool_call_id=event.id,
                )

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def provider_name(self) -> str:
        return _SYSTEM

    @property
    def provider_url(self) -> None:
        return None

    @property
    def timestamp(self) -> datetime:
        return self._timestamp


def transcript(messages: list[ModelMessage]) -> list[tether_model.ModelMessage]:
    """PydanticAI's message history as the offline model's chat transcript: what
    it reads is the last user prompt, the tool calls asked for after it and
    their results."""
    out: list[tether_model.ModelMessage] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            calls = tuple(
                tether_model.ModelToolCall(
                    id=part.tool_call_id, name=part.tool_name, arguments=_arguments(part)
                )
                for part in message.parts
                if isinstance(part, ToolCallPart)
            )
            out.append(tether_model.ModelMessage("assistant", text, tool_calls=calls))
            continue
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, SystemPromptPart):
                out.append(tether_model.ModelMessage("system", part.content))
            elif isinstance(part, UserPromptPart):
                out.append(tether_model.ModelMessage("user", _prompt_text(part)))
            elif isinstance(part, ToolReturnPart):
                out.append(
                    tether_model.ModelMessage(
                        "tool",
                        part.model_response_str(),
                        tool_call_id=part.tool_call_id,
                        name=part.tool_name,
                    )
                )
    return out


def _prompt_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    # Only the text of a multimodal prompt means anything to the offline model.
    return " ".join(item for item in part.content if isinstance(item, str))


def _arguments(part: ToolCallPart) -> dict[str, Any]:
    try:
        return dict(part.args_as_dict())
    except Exception:
        return {}


def _call_part(call: tether_model.ModelToolCall) -> ToolCallPart:
    return ToolCallPart(call.name, dict(call.arguments), call.id)
