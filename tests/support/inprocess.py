"""A whole API app in the test's process, over stores the test holds, driven through ASGI.

Besides the step-by-step ``scripted`` agent of ``tests.support.scripted``, the
registries serve three small agents that finish by themselves: ``echo``
(answers ``echo: <the user's last message>``), ``broken`` (raises an error
whose message must never reach a client) and ``seed-dependency`` (an agent
with a resumable dependency written against the seed SDK's ``load(self,
state)``, without ``resuming_turn``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, ClassVar

import httpx2
from fastapi import FastAPI

from tests.support.scripted import SETTINGS, ScriptedRegistries, Scripts
from tether.api.app import setup_app
from tether.api.auth import Authenticator
from tether.domain.agent_dependency import ResumableAgentDependency
from tether.domain.agent_registries import CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest
from tether.domain.turn_context import TurnContext
from tether.handlers.chat_handler import ChatHandler
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings
from tether.testing.contracts import ManualClock

SECRET_DETAIL = "connection to db.internal:5432 refused for user admin:hunter2"
"""What the broken agent's error says: internal detail no client may see."""


class EchoAgent(StreamableChatAgent):
    agent_name = "echo"

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        asked = conversation[-1].content if conversation else ""
        yield ChatMessage(sender=ChatMessageSender.BOT, content="echo:")
        yield ChatMessage(sender=ChatMessageSender.BOT, content=f"echo: {asked}")


class BrokenAgent(StreamableChatAgent):
    agent_name = "broken"

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        yield ChatMessage(sender=ChatMessageSender.BOT, content="about to fail")
        raise RuntimeError(SECRET_DETAIL)


class SeedNotebook(ResumableAgentDependency):
    """Written against the seed's SDK: ``load`` takes the state and nothing else."""

    state_key: ClassVar[str] = "seed-notebook"
    loaded: ClassVar[list[dict[str, Any]]] = []

    def __init__(self) -> None:
        self.turns = 0

    async def dump(self) -> dict[str, Any]:
        return {"turns": self.turns}

    async def load(self, state):  # type: ignore[no-untyped-def, override]  # the SDK's signature
        SeedNotebook.loaded.append(dict(state))
        self.turns = int(state.get("turns", 0))


class SeedAgent(StreamableChatAgent):
    agent_name = "seed-dependency"

    def __init__(self, notebook: SeedNotebook) -> None:
        self.notebook = notebook

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        self.notebook.turns += 1
        yield ChatMessage(sender=ChatMessageSender.BOT, content=f"turn {self.notebook.turns}")


class InProcessRegistries(ScriptedRegistries):
    """``scripted`` (driven by the test), ``echo``, ``broken`` and ``seed-dependency``."""

    OWN: ClassVar[tuple[str, ...]] = ("echo", "broken", "seed-dependency")

    def __init__(self, scripts: Scripts | None = None) -> None:
        super().__init__(scripts or Scripts())
        self.setups = {
            name: AgentSetup(agent_identifier=name, agent_name=name) for name in self.OWN
        }

    async def get_setup(self, agent_identifier: str) -> AgentSetup | None:
        return self.setups.get(agent_identifier) or await super().get_setup(agent_identifier)

    async def list_setups(self) -> list[AgentSetup]:
        return [*await super().list_setups(), *self.setups.values()]

    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        if setup.agent_name == "echo":
            return CreatedAgent(agent=EchoAgent(), setup=setup)
        if setup.agent_name == "broken":
            return CreatedAgent(agent=BrokenAgent(), setup=setup)
        if setup.agent_name == "seed-dependency":
            notebook = SeedNotebook()
            return CreatedAgent(agent=SeedAgent(notebook), setup=setup, dependencies=[notebook])
        return await super().create_agent(setup, request, turn)


def build(
    stores: TurnStores,
    *,
    clock: ManualClock | None = None,
    scripts: Scripts | None = None,
    authenticator: Authenticator | None = None,
    **settings: Any,
) -> FastAPI:
    """An app over ``stores``; timers far out (see ``SETTINGS``) unless overridden."""
    tuned: TetherSettings = replace(SETTINGS, **settings)
    return setup_app(
        InProcessRegistries(scripts),
        agent_state_store=stores.agent_state,
        chat_stream_recording_store=stores.recording,
        chat_stream_supervision_store=stores.supervision,
        chat_conversation_store=stores.conversation,
        settings=tuned,
        clock=clock or ManualClock(),
        authenticator=authenticator,
    )


def handler_of(app: FastAPI) -> ChatHandler:
    handler: ChatHandler = app.state.chat_handler
    return handler


@asynccontextmanager
async def client_of(app: FastAPI) -> AsyncIterator[httpx2.AsyncClient]:
    """A client of ``app`` through ASGI; the app's turns are shut down on exit."""
    transport = httpx2.ASGITransport(app=app)
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://tether.test") as client:
            yield client
    finally:
        await handler_of(app).shutdown()


def turn(content: str, agent: str = "echo", **extra: Any) -> dict[str, Any]:
    """A turn's body."""
    return {"agent_identifier": agent, "conversation": [{"sender": "user", "content": content}]} | (
        extra
    )
