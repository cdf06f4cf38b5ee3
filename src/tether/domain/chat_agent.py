"""The two agent shapes: one that answers once, one that streams its answer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import ClassVar

from tether.domain.chat_message import ChatMessage


class ChatAgent(ABC):
    """An agent that answers a conversation with one bot message (or None).

    ``agent_name`` is the key under which ``ChatAgentClassRegistry.register()``
    files the class; agent setups refer to it. ``request_parameters`` names the
    constructor parameters a client may fill through ``bot_params``: nothing
    else in a request can reach the agent's configuration.
    """

    agent_name: ClassVar[str]
    request_parameters: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    async def execute(self, conversation: list[ChatMessage]) -> ChatMessage | None:
        """Answer the conversation; the last message is the user's new turn."""


class StreamableChatAgent(ChatAgent):
    """An agent that streams: every yield is the whole answer so far, never a delta."""

    @abstractmethod
    def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        """Yield cumulative bot messages; the last one is the final answer."""

    async def execute(self, conversation: list[ChatMessage]) -> ChatMessage | None:
        last: ChatMessage | None = None
        async for message in self.execute_streaming(conversation):
            last = message
        return last
