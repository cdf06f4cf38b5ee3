"""The ``pydantic-writer`` and ``pydantic-note-writer`` agents: ``long-writer``
and ``note-writer`` written with PydanticAI.

``pydantic-writer`` is a ``pydantic_ai.Agent`` with one read-only tool, the
calculator, run by ``PydanticAIChatAgent`` with durable turns. Its model is
tether's offline model as a PydanticAI model (``OfflineModel``), built from
the setup's ``llm`` options: like ``long-writer`` it streams about 200 chunks
over about 20 seconds with a calculation near the start, deterministically,
so a killed and resumed turn can be compared with a crash-free one
(``tether crash-test --agent pydantic-writer``).

``pydantic-note-writer`` also sends a note, a write that must never happen
twice (``on_unknown="fail"``): its tools are ``note-writer``'s, which count
every execution in the crash test's tool-call ledger, so the crash test's
``tool`` rounds can kill its replica in the middle of a call and count the
runs (``tether crash-test --fault tool --agent pydantic-note-writer``). Its
calls run one at a time (``sequential=True``), as tether's own loop runs
them: a kill inside one leaves the calls before it settled and none after it
started, which is what a tool round compares with the crash-free run.

They need the ``pydantic-ai`` extra. Without it stand-ins are registered
under their names instead: the setups name them, and a setup whose agent is
missing stops the server at start-up, so the other agents still serve and a
turn of these says what to install. (The project loader imports every module
of the package, so the choice is made here, not by importing another module.)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from importlib.util import find_spec
from typing import Any

from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage

from . import note_writer, tools
from .tools import Number

AGENT_NAME = "pydantic-writer"
NOTE_WRITER_NAME = "pydantic-note-writer"
INSTRUCTIONS = "You write long, thorough answers. Check any number you use with the calculator."

if find_spec("pydantic_ai") is not None:
    from pydantic_ai import Agent
    from pydantic_ai.models import Model

    from tether.integrations.pydantic_ai import (
        ON_UNKNOWN_KEY,
        OfflineModel,
        PydanticAIChatAgent,
        PydanticAIRun,
    )

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

    note_writer_agent: Agent[None, str] = Agent(instructions=note_writer.SYSTEM_PROMPT)

    # note-writer's own tools, which record their runs in the tool-call ledger;
    # each declares the policy its tether tool has (the ledger records that one).
    @note_writer_agent.tool_plain(
        name="calculator",
        metadata={ON_UNKNOWN_KEY: note_writer.calculator.on_unknown},  # retry: it reads
        sequential=True,
    )
    async def recorded_calculator(expression: str) -> Number:
        """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."""
        result: Number = await note_writer.calculator.function(expression=expression)
        return result

    @note_writer_agent.tool_plain(
        name="send_note",
        metadata={ON_UNKNOWN_KEY: note_writer.send_note.on_unknown},  # fail: never twice
        sequential=True,
    )
    async def recorded_send_note(text: str) -> str:
        """Send the user a short note (a write: it must never happen twice)."""
        # A real tool would pass current_tool_call().idempotency_key on to the
        # service that sends it.
        sent: str = await note_writer.send_note.function(text=text)
        return sent

    @ChatAgentClassRegistry.register()
    class PydanticNoteWriter(PydanticWriter):
        """Writes a long answer with PydanticAI, using the calculator and sending a note."""

        agent_name = NOTE_WRITER_NAME
        agent = note_writer_agent

else:

    @ChatAgentClassRegistry.register()
    class PydanticWriterUnavailable(StreamableChatAgent):
        """Fails every turn: PydanticAI is not installed."""

        agent_name = AGENT_NAME

        async def execute_streaming(
            self, conversation: list[ChatMessage]
        ) -> AsyncGenerator[ChatMessage, None]:
            raise RuntimeError(
                f"the {self.agent_name} agent needs PydanticAI: install the pydantic-ai "
                "extra (pip install 'tether[pydantic-ai]')"
            )
            yield  # an async generator, as the interface wants

    @ChatAgentClassRegistry.register()
    class PydanticNoteWriterUnavailable(PydanticWriterUnavailable):
        """Fails every turn: PydanticAI is not installed."""

        agent_name = NOTE_WRITER_NAME
