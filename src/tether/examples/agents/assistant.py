"""The ``assistant`` agent: a general chat agent with a calculator and a clock."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from tether.adapters.llm import ChatClient
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage

from .tools import calculator, clock

SYSTEM_PROMPT = (
    "You are a helpful assistant. Use the calculator for any arithmetic and the clock "
    "for the current date or time; never guess either."
)


@ChatAgentClassRegistry.register()
class Assistant(StreamableChatAgent):
    """Answers with the help of a calculator and a clock."""

    agent_name = "assistant"

    def __init__(self, chat_client: ChatClient) -> None:
        self.chat_client = chat_client

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        async for message in self.chat_client.stream(
            conversation, tools=[calculator, clock], system_prompt=SYSTEM_PROMPT
        ):
            yield message
