"""The ``long-writer`` agent: writes long answers, with one calculation near the start.

Its setup makes the offline model stream about 200 chunks over about 20 seconds, so
there is time to kill its replica mid-answer; the answer is deterministic, so a killed
and resumed turn can be compared with a crash-free one. It is the reference turn of
the crash tests: keep its identifier and shape.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from tether.adapters.llm import ChatClient
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage

from .tools import calculator

SYSTEM_PROMPT = "You write long, thorough answers. Check any number you use with the calculator."


@ChatAgentClassRegistry.register()
class LongWriter(StreamableChatAgent):
    """Writes a long answer, using the calculator along the way."""

    agent_name = "long-writer"

    def __init__(self, chat_client: ChatClient) -> None:
        self.chat_client = chat_client

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        async for message in self.chat_client.stream(
            conversation, tools=[calculator], system_prompt=SYSTEM_PROMPT
        ):
            yield message
