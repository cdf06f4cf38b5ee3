"""A long-writer whose calculator counts its executions in a file.

The file (``TETHER_TEST_TOOL_LOG``) lets a test prove, across processes and
kills, that a completed tool call never ran twice.
"""

from __future__ import annotations

import ast
import operator
import os
import signal
from collections.abc import AsyncGenerator

from tether.adapters.llm import ChatClient
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage
from tether.tools import current_tool_call, tool

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return int(_OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right)))
    raise ValueError("only + - * on integers")


@tool(read_only=True)  # run again when a resume cannot tell if it ran
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    log = os.environ.get("TETHER_TEST_TOOL_LOG")
    if log:
        with open(log, "a") as handle:  # noqa: ASYNC230 - a tiny append, in a test tool
            handle.write(f"{os.getpid()} {expression}\n")
    return str(_evaluate(ast.parse(expression, mode="eval")))


@ChatAgentClassRegistry.register()
class Writer(StreamableChatAgent):
    agent_name = "writer"

    def __init__(self, chat_client: ChatClient) -> None:
        self.chat_client = chat_client

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        async for message in self.chat_client.stream(conversation, tools=[calculator]):
            yield message


async def _dies_in_its_first_call(name: str) -> str:
    """Log this run ("PID NAME KEY#ATTEMPT") to ``TETHER_TEST_TOOL_LOG``; on a
    call's first attempt, SIGKILL this replica before returning: the call
    started and never completed."""
    call = current_tool_call()
    assert call is not None
    log = os.environ.get("TETHER_TEST_TOOL_LOG")
    if log:
        with open(log, "a") as handle:  # noqa: ASYNC230 - a tiny append, in a test tool
            handle.write(f"{os.getpid()} {name} {call.idempotency_key}#{call.attempt}\n")
    if call.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"{name} done"


@tool
async def send_note(text: str) -> str:
    """Send a note (a write: on_unknown defaults to fail)."""
    return await _dies_in_its_first_call("send_note")


@tool(read_only=True)
async def fetch_note(text: str) -> str:
    """Fetch a note (a read: on_unknown defaults to retry)."""
    return await _dies_in_its_first_call("fetch_note")


@ChatAgentClassRegistry.register()
class Caller(StreamableChatAgent):
    """Calls the tool its setup's ``llm.call_tool`` names, which kills its replica
    in the middle of the call's first attempt."""

    agent_name = "caller"

    def __init__(self, chat_client: ChatClient) -> None:
        self.chat_client = chat_client

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        tools = [send_note, fetch_note]
        async for message in self.chat_client.stream(conversation, tools=tools):
            yield message


@ChatAgentClassRegistry.register()
class Broken(StreamableChatAgent):
    """Streams a little, then fails: for the errored-turn paths."""

    agent_name = "broken"

    def __init__(self, chat_client: ChatClient) -> None:
        self.chat_client = chat_client

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        count = 0
        async for message in self.chat_client.stream(conversation):
            yield message
            count += 1
            if count == 3:
                self.break_down()

    def break_down(self) -> None:
        raise RuntimeError("the broken agent broke")


@ChatAgentClassRegistry.register()
class Poison(Broken):
    """Streams a little, then SIGKILLs its own replica: every replica that takes
    the turn over dies too (the poison turn of the takeover limit). Each run
    appends its process id to ``TETHER_TEST_POISON_LOG`` first."""

    agent_name = "poison"

    def break_down(self) -> None:
        log = os.environ.get("TETHER_TEST_POISON_LOG")
        if log:
            with open(log, "a") as handle:
                handle.write(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)
