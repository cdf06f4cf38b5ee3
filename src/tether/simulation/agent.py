"""The simulation's agent: deterministic, a few chunks, sometimes one tool call.

Its answer depends only on its turn's id (``tether.tools.current_turn_id``),
so every producer of one turn (the first, and each takeover's) says the same
words, and an answer only grows across a takeover. It tells the world what
it does (it started, it said a chunk, its tool ran), which the invariants
read. Its tool follows the tool loop's rule (``tether.tools``): the call is
checkpointed as started before it runs and as completed after, and a resumed
turn that finds it started but not completed does not run it again (the
``on_unknown="fail"`` policy of a tool that must not run twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from tether.domain.agent_dependency import ResumableAgentDependency
from tether.domain.agent_registries import AgentRegistriesFactory, CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest
from tether.domain.turn_context import TurnContext
from tether.tools import current_turn_id

AGENT = "sim"
CHUNKS = 3
CHUNK_SECONDS = 0.3
"""Virtual seconds the agent takes per chunk: turns overlap with time."""

Tell = Callable[[str, str, str], None]
"""What the agent reports to the world: (turn id, event, detail)."""


def answer_text(turn_id: str, chunks: int) -> str:
    """The agent's answer to turn ``turn_id`` after ``chunks`` chunks."""
    return "".join(f"{turn_id[:4]}.{k} " for k in range(chunks))


def uses_tool(turn_id: str) -> bool:
    """Whether turn ``turn_id`` calls the tool (about half of them, by id)."""
    return int(turn_id[-1], 16) % 2 == 0


class Notebook(ResumableAgentDependency):
    """The agent's checkpointed progress: chunks said, and the tool call's state."""

    state_key = "sim-notebook"

    def __init__(self) -> None:
        self.turn = ""
        self.chunks = 0
        self.tool = "none"  # none | started | completed

    async def dump(self) -> dict[str, Any]:
        return {"turn": self.turn, "chunks": self.chunks, "tool": self.tool}

    async def load(self, state: dict[str, Any], *, resuming_turn: bool) -> None:
        if resuming_turn:
            self.turn = str(state.get("turn", ""))
            self.chunks = int(state.get("chunks", 0))
            self.tool = str(state.get("tool", "none"))


class SimAgent(StreamableChatAgent):
    agent_name = AGENT

    def __init__(self, notebook: Notebook, tell: Tell) -> None:
        self.notebook = notebook
        self.tell = tell

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        turn = current_turn_id() or "?"
        asked = [m for m in conversation if m.sender is ChatMessageSender.USER]
        self.tell(turn, "start", asked[-1].message_id or "" if asked else "")
        book = self.notebook
        if book.turn != turn:
            book.turn, book.chunks, book.tool = turn, 0, "none"
        while book.chunks < CHUNKS:
            await asyncio.sleep(CHUNK_SECONDS)
            if book.chunks == 1 and uses_tool(turn) and book.tool == "none":
                book.tool = "started"
                await book.request_checkpoint()
                self.tell(turn, "tool", "")
                book.tool = "completed"
                await book.request_checkpoint()
            book.chunks += 1
            self.tell(turn, "chunk", str(book.chunks))
            yield ChatMessage(sender=ChatMessageSender.BOT, content=answer_text(turn, book.chunks))


class SimRegistries(AgentRegistriesFactory):
    """One agent, ``sim``, built for every turn."""

    def __init__(self, tell: Tell) -> None:
        self.tell = tell
        self.setup = AgentSetup(agent_identifier=AGENT, agent_name=AGENT)

    async def get_setup(self, agent_identifier: str) -> AgentSetup | None:
        return self.setup if agent_identifier == AGENT else None

    async def list_setups(self) -> list[AgentSetup]:
        return [self.setup]

    def check_bot_params(self, setup: AgentSetup, bot_params: dict[str, Any] | None) -> None:
        return None

    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        notebook = Notebook()
        return CreatedAgent(
            agent=SimAgent(notebook, self.tell), setup=setup, dependencies=[notebook]
        )
