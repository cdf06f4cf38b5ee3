"""An agent whose answer goes backwards on purpose: the clients' regression guard.

Tether's producer never does this on its own account (what a reader was shown
is durable, so a takeover continues from it), but a client must not take text
back from its screen even if a stream says so. The test stages the agent: the
user's message names a directory holding ``steps.json`` (the texts to answer,
in order); after each but the last the agent waits for a file ``go-N`` there,
which the test writes once it has seen what its client did with text N.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path

from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage, ChatMessageSender

POLL_SECONDS = 0.01


@ChatAgentClassRegistry.register()
class Rewinder(StreamableChatAgent):
    agent_name = "rewinder"

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        gates = Path(conversation[-1].content)
        steps = json.loads((gates / "steps.json").read_text())
        for number, text in enumerate(steps, start=1):
            yield ChatMessage(sender=ChatMessageSender.BOT, content=text)
            if number < len(steps):
                # The gate is a file another process writes: nothing to await.
                while not (gates / f"go-{number}").exists():  # noqa: ASYNC110
                    await asyncio.sleep(POLL_SECONDS)
