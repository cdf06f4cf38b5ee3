"""A chat model served over an OpenAI-compatible chat-completions API.

Works against OpenAI itself and the many servers that speak its wire format (vLLM,
llama.cpp, Ollama, LiteLLM, ...). Responses are streamed: text is passed on as it
arrives, and tool calls, which arrive as fragments keyed by index, are put together
and handed on once the response ends.

Resumed turns: a transcript ending with partial assistant text is sent as it is,
as a trailing assistant message. Real models then continue that text, but only
approximately (they may rephrase, repeat a few words or start a new sentence);
exact continuation is something only the offline model guarantees.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import httpx2
from openai import AsyncOpenAI, omit

from tether.domain.chat_model import (
    ChatModel,
    ModelEvent,
    ModelMessage,
    ModelToolCall,
    TextDelta,
    ToolSpec,
)
from tether.observability.genai import report_usage
from tether.tools import MalformedToolCall


@dataclass
class _ToolCallFragments:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAICompatibleChatModel(ChatModel):
    """Streams chat completions, with tools, from an OpenAI-compatible server.

    ``http_client`` lets the caller supply (and own) the connection pool; without
    one the OpenAI client builds its own, which ``aclose`` closes.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        self.model = self.model_name = model
        self.provider_name = "openai"
        self.temperature = temperature
        self._owns_http_client = http_client is None
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client)

    async def stream(
        self, messages: list[ModelMessage], tools: list[ToolSpec]
    ) -> AsyncIterator[ModelEvent]:
        response = await self._client.chat.completions.create(
            model=self.model,
            messages=cast(Any, [_to_wire(message) for message in messages]),
            tools=cast(Any, [_tool_to_wire(spec) for spec in tools]) if tools else omit,
            temperature=self.temperature if self.temperature is not None else omit,
            stream=True,
            # The last chunk then carries the call's token counts (traces, metrics).
            stream_options={"include_usage": True},
        )
        fragments: dict[int, _ToolCallFragments] = {}
        async with response:
            async for chunk in response:
                if chunk.usage is not None:
                    report_usage(
                        input_tokens=chunk.usage.prompt_tokens,
                        output_tokens=chunk.usage.completion_tokens,
                        response_model=chunk.model or None,
                    )
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                if delta.content:
                    yield TextDelta(delta.content)
                for piece in delta.tool_calls or ():
                    collected = fragments.setdefault(piece.index, _ToolCallFragments())
                    if piece.id:
                        collected.id = piece.id
                    if piece.function is not None:
                        # Names and arguments are deltas like content: concatenate.
                        collected.name += piece.function.name or ""
                        if piece.function.arguments:
                            collected.arguments.append(piece.function.arguments)
        for index in sorted(fragments):
            yield _assemble(index, fragments[index])

    async def aclose(self) -> None:
        """Close the OpenAI client (and its HTTP pool, unless the caller supplied it)."""
        if self._owns_http_client:
            await self._client.close()


def _assemble(index: int, fragments: _ToolCallFragments) -> ModelToolCall:
    call_id = fragments.id or f"call_{index}"
    raw = "".join(fragments.arguments)
    if not raw.strip():
        return ModelToolCall(id=call_id, name=fragments.name, arguments={})
    try:
        arguments = json.loads(raw)
    except json.JSONDecodeError as error:
        # Models do emit broken JSON; the loop reports it back instead of failing.
        return MalformedToolCall(
            id=call_id,
            name=fragments.name,
            arguments={},
            raw_arguments=raw,
            error=f"arguments are not valid JSON ({error.msg} at position {error.pos}): {raw!r}",
        )
    if not isinstance(arguments, dict):
        return MalformedToolCall(
            id=call_id,
            name=fragments.name,
            arguments={},
            raw_arguments=raw,
            error=f"arguments must be a JSON object, got {raw!r}",
        )
    return ModelToolCall(id=call_id, name=fragments.name, arguments=arguments)


def _to_wire(message: ModelMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            # Servers differ on empty strings beside tool calls; null is always accepted.
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def _tool_to_wire(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters or {"type": "object", "properties": {}},
        },
    }
