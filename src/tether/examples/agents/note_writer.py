"""The ``note-writer`` agent: a long answer with a calculation and a note sent.

It is ``long-writer`` with a tool that has a side effect: near the start the
offline model asks for the calculator (it only reads: a call whose outcome is
unknown after a crash is run again) and for ``send_note`` (it writes: such a
call is never run again; the model is told it may or may not have happened).
The crash test's ``tool`` rounds kill its replica in the middle of one of
those calls; both tools count every execution in the crash test's tool-call
ledger (``tether.crashtest.instruments.tool_ledger``) when it is armed, and do nothing
more otherwise.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from tether.adapters.llm import ChatClient
from tether.crashtest.instruments.tool_ledger import recorded
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage
from tether.tools import tool

from .tools import Number, evaluate

SYSTEM_PROMPT = (
    "You write long, thorough answers. Check any number you use with the calculator, "
    "and send the user a note of what you worked out."
)


@recorded
@tool(read_only=True)  # reading twice is harmless: run again when the outcome is unknown
async def calculator(expression: str) -> Number:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."""
    return evaluate(expression)


@recorded
@tool(on_unknown="fail")  # a note must not be sent twice
async def send_note(text: str) -> str:
    """Send the user a short note (a write: it must never happen twice)."""
    # A real tool would pass current_tool_call().idempotency_key on to the
    # service that sends it; the answer names no key, so that a crash-free
    # run and a resumed one can be compared.
    return f"note of {len(text.split())} words sent"


@ChatAgentClassRegistry.register()
class NoteWriter(StreamableChatAgent):
    """Writes a long answer, using the calculator and sending a note along the way."""

    agent_name = "note-writer"

    def __init__(self, chat_client: ChatClient) -> None:
        self.chat_client = chat_client

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        async for message in self.chat_client.stream(
            conversation, tools=[calculator, send_note], system_prompt=SYSTEM_PROMPT
        ):
            yield message
