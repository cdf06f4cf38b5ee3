"""An agent that asks its MCP servers who the user is, through the real model/tool loop.

Its model is scripted (the offline model only knows the example tools): in a
turn's first response it asks for every offered tool whose name ends in
``whoami``, then answers with what they returned.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from tether.adapters.llm import ChatClient
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_model import (
    ChatModel,
    ModelEvent,
    ModelMessage,
    ModelToolCall,
    TextDelta,
    ToolSpec,
)
from tether.mcp_tools import MCPTools


class _AsksWhoami(ChatModel):
    async def stream(
        self, messages: list[ModelMessage], tools: list[ToolSpec]
    ) -> AsyncIterator[ModelEvent]:
        last_user = max(i for i, m in enumerate(messages) if m.role == "user")
        this_turn = messages[last_user + 1 :]
        results = [m.content for m in this_turn if m.role == "tool"]
        asked = any(m.role == "assistant" and m.tool_calls for m in this_turn)
        wanted = [spec for spec in tools if spec.name.endswith("whoami")]
        if wanted and not asked:
            yield TextDelta("Let me check.")
            for index, spec in enumerate(wanted):
                yield ModelToolCall(id=f"call-{index}", name=spec.name, arguments={})
            return
        yield TextDelta("Answer: " + (" | ".join(results) if results else "no tools to ask."))


@ChatAgentClassRegistry.register()
class WhoamiAgent(StreamableChatAgent):
    agent_name = "whoami-agent"

    def __init__(self, mcp_tools: MCPTools) -> None:
        self.mcp_tools = mcp_tools
        self.chat_client = ChatClient(_AsksWhoami())

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        tools = await self.mcp_tools.tools()
        async for message in self.chat_client.stream(
            conversation, tools=tools, system_prompt=self.mcp_tools.system_prompt("Be brief.")
        ):
            yield self.mcp_tools.annotate(message)
