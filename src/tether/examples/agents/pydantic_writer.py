"""The ``pydantic-writer`` agent: ``long-writer`` written with PydanticAI.

A ``pydantic_ai.Agent`` with one read-only tool, the calculator, run by
``PydanticAIChatAgent`` with durable turns. Its model is tether's offline
model as a PydanticAI model (``OfflineModel``), built from the setup's
``llm`` options: like ``long-writer`` it streams about 200 chunks over about
20 seconds with a calculation near the start, deterministically, so a killed
and resumed turn can be compared with a crash-free one
(``tether crash-test --agent pydantic-writer``).

It needs the ``pydantic-ai`` extra. Without it a stand-in is registered under
its name instead: the setups name it, and a setup whose agent is missing
stops the server at start-up, so the other agents still serve and a turn of
this one says what to install. (The project loader imports every module of
the package, so the choice is made here, not by importing another module.)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from importlib.util import find_spec
from typing import Any

from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage

from . import tools
from .tools import Number

AGENT_NAME = "pydantic-writer"
INSTRUCTIONS = "You write long, thorough answers. Check any number you use with the calculator."

if find_spec("pydantic_ai") is not None:
    from pydantic_ai import Agent
    from pydantic_ai.models import Model

    from tether.integrations.pydantic_ai import OfflineModel, PydanticAIChatAgent, PydanticAIRun

    # No model here: each turn gets the one its setup describes (agent_model).
    writer: Agent[None, str] = Agent(instructions=INSTRUCTIONS)

    # on_unknown "retry": it only reads, so a call cut off by a crash is run again.
    @writer.tool_plain(metadata={"on_unknown": "retry"})
    async def calculator(expression: str) -> Number:
        """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."""
        # The example's calculator itself, so TETHER_TOOL_LOG counts its runs too.
        result: Number = await tools.calculator.function(expression=expression)
        return result

    @ChatAgentClassRegistry.register()
    class PydanticWriter(PydanticAIChatAgent):
        """Writes a long answer with PydanticAI, using the calculator along the way."""

        agent_name = AGENT_NAME
        agent = writer

        def __init__(self, pydantic_ai_run: PydanticAIRun, llm: dict[str, Any]) -> None:
            super().__init__(pydantic_ai_run)
            self.model = OfflineModel.from_options(llm)

        def agent_model(self) -> Model:
            return self.model

else:

    @ChatAgentClassRegistry.register()
    class PydanticWriterUnavailable(StreamableChatAgent):
        """Fails every turn: PydanticAI is not installed."""

        agent_name = AGENT_NAME

        async def execute_streaming(
            self, conversation: list[ChatMessage]
        ) -> AsyncGenerator[ChatMessage, None]:
            raise RuntimeError(
                f"the {AGENT_NAME} agent needs PydanticAI: install the pydantic-ai extra "
                "(pip install 'tether[pydantic-ai]')"
            )
            yield  # an async generator, as the interface wants
