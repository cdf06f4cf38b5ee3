"""The "Making a dependency resumable" example (docs/writing-agents.md), as a user would write it.

``Outline`` remembers which sections of a report are finished. The ``outliner``
agent writes one section at a time (each "researched" for a moment), and asks
for a checkpoint as soon as a section is done, so a resume on another replica
continues with the next section instead of writing the finished ones again.
Each researched section is appended to ``TETHER_TEST_TOOL_LOG`` (when set), so
a test can count how often each section's work ran across processes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from typing import Any

from tether.adapters import AgentDependencyRegistry
from tether.domain.agent_dependency import AgentDependencyFactory, ResumableAgentDependency
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage, ChatMessageSender

SECTIONS = ("Background", "Method", "Findings", "Risks", "Next steps")


class Outline(ResumableAgentDependency):
    """The finished sections of the report being written."""

    state_key = "outline"

    def __init__(self) -> None:
        self.sections: list[str] = []

    async def dump(self) -> dict[str, Any]:
        return {"sections": self.sections}

    async def load(self, state: dict[str, Any], *, resuming_turn: bool) -> None:
        # A resumed turn continues its own report; a new turn of the same
        # conversation (whose checkpoint holds the last report) starts anew.
        self.sections = list(state.get("sections", [])) if resuming_turn else []

    async def finish(self, section: str) -> None:
        """Record a finished section and checkpoint it right away."""
        self.sections.append(section)
        await self.request_checkpoint()


@AgentDependencyRegistry.register
class OutlineFactory(AgentDependencyFactory):
    @classmethod
    def create(cls) -> Outline:
        return Outline()


async def _research(title: str) -> str:
    await asyncio.sleep(0.3)  # the slow part a resume must not redo
    log = os.environ.get("TETHER_TEST_TOOL_LOG")
    if log:
        with open(log, "a") as handle:  # noqa: ASYNC230 - a tiny append, in a test agent
            handle.write(f"{os.getpid()} section {title}\n")
    return f"## {title}\n{title} is covered here in full.\n"


@ChatAgentClassRegistry.register()
class Outliner(StreamableChatAgent):
    agent_name = "outliner"

    def __init__(self, outline: Outline) -> None:
        self.outline = outline

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        for title in SECTIONS[len(self.outline.sections) :]:
            section = await _research(title)
            await self.outline.finish(section)
            yield ChatMessage(sender=ChatMessageSender.BOT, content="".join(self.outline.sections))
