"""A deterministic, seedable chat model that needs no LLM service.

It exists so demos, tests, crash tests and benchmarks exercise the real model/tool
loop: it streams readable pseudo-English in paced chunks, asks for tools and uses
their results. Its one hard promise is determinism: the whole turn is a pure function
of the seed, the options, the last user message and the tool results already in the
transcript. That is what makes a resumed turn checkable: a transcript that ends with
partial assistant text gets exactly the rest of the text an uninterrupted run would
have produced, so partial + remainder is the uninterrupted answer, byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether.domain.chat_model import (
    ChatModel,
    ModelEvent,
    ModelMessage,
    ModelToolCall,
    TextDelta,
    ToolSpec,
)

Sleep = Callable[[float], Awaitable[None]]

CALCULATOR = "calculator"
CLOCK = "clock"

# An arithmetic expression inside free text: at least two numbers joined by operators.
_NUMBER = r"\(*\s*\d+(?:\.\d+)?\s*\)*"
_OPERATOR = r"(?:\*\*|//|[-+*/%])"
_EXPRESSION = re.compile(rf"{_NUMBER}(?:\s*{_OPERATOR}\s*-?\s*{_NUMBER})+")
_TIME_WORDS = re.compile(r"\b(?:time|clock|date)s?\b", re.IGNORECASE)


class OfflineToolCall(BaseModel):
    """A tool the offline model asks for in every turn it is offered (``call_tool``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class OfflineChatModelOptions(BaseModel):
    """The options of ``OfflineChatModel``, as they appear under ``llm`` in a setup."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    chunks_per_second: float = Field(default=0.0, ge=0)
    chunk_size: int = Field(default=3, ge=1)
    answer_chunks: int = Field(default=40, ge=1)
    tool_call_after_chunks: int | None = Field(default=None, ge=0)
    call_tool: OfflineToolCall | None = None


@dataclass(frozen=True)
class _Round:
    """What the model says in one response of the turn: text chunks, then tool calls."""

    chunks: tuple[str, ...]
    tool_calls: tuple[ModelToolCall, ...] = ()


@dataclass(frozen=True)
class _Position:
    """Where the transcript says the turn is."""

    prompt: str
    rounds_done: int
    tool_calls: tuple[ModelToolCall, ...]
    tool_results: dict[str, str]
    partial_text: str


class OfflineChatModel(ChatModel):
    """A deterministic model: same transcript, tools and seed give the same output, always.

    - ``seed``: picks the text (and derived tool arguments).
    - ``chunks_per_second``: pacing of the text chunks; 0 streams as fast as possible.
    - ``chunk_size``: words per streamed chunk.
    - ``answer_chunks``: length of the whole answer, in chunks.
    - ``tool_call_after_chunks``: stream that many chunks first, then ask for the tool
      call(s); with ``calculator`` offered it always asks for one (a deterministic
      expression when the user gave none), which makes a long answer with a tool call
      near its start.
    - ``call_tool``: ``{"name": ..., "arguments": {...}}``, a tool to ask for in each
      turn it is offered, with those arguments (say an MCP server's ``files__list``,
      to try MCP locally without a real model).
    - ``sleep``: how pacing waits; tests inject one that records instead of sleeping.

    Tool use: with ``calculator`` offered and an arithmetic expression in the user's
    message, it asks for ``calculator`` with ``{"expression": ...}``; with ``clock``
    offered and the message mentioning time, clock or date, it asks for ``clock``;
    with the ``call_tool`` tool offered, it asks for it (all at once when several
    apply). After the results it writes the answer, opening with a sentence that
    reports them.
    """

    model_name = "offline"
    provider_name = "tether"

    def __init__(
        self,
        *,
        seed: int = 0,
        chunks_per_second: float = 0.0,
        chunk_size: int = 3,
        answer_chunks: int = 40,
        tool_call_after_chunks: int | None = None,
        call_tool: OfflineToolCall | Mapping[str, Any] | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        try:
            self.options = OfflineChatModelOptions.model_validate(
                {
                    "seed": seed,
                    "chunks_per_second": chunks_per_second,
                    "chunk_size": chunk_size,
                    "answer_chunks": answer_chunks,
                    "tool_call_after_chunks": tool_call_after_chunks,
                    "call_tool": call_tool,
                }
            )
        except ValidationError as error:
            raise ValueError(f"invalid offline model options: {error}") from error
        self._sleep = sleep

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], *, sleep: Sleep = asyncio.sleep
    ) -> OfflineChatModel:
        """Build from a mapping such as an agent setup's ``llm`` section."""
        try:
            parsed = OfflineChatModelOptions.model_validate(dict(options))
        except ValidationError as error:
            raise ValueError(f"invalid offline model options: {error}") from error
        return cls(**parsed.model_dump(), sleep=sleep)

    async def stream(
        self, messages: list[ModelMessage], tools: list[ToolSpec]
    ) -> AsyncIterator[ModelEvent]:
        position = _locate(messages)
        planned = self._plan(position, {spec.name for spec in tools})
        interval = 1.0 / self.options.chunks_per_second if self.options.chunks_per_second else 0.0
        for piece in _remainder(planned.chunks, position.partial_text):
            if interval:
                await self._sleep(interval)
            yield TextDelta(piece)
        for call in planned.tool_calls:
            yield call

    def _plan(self, position: _Position, offered: set[str]) -> _Round:
        requests = self._tool_requests(position.prompt, offered)
        lead_chunks = (self.options.tool_call_after_chunks or 0) if requests else 0
        if position.rounds_done == 0 and requests:
            closing = _words(_announce(requests)) if lead_chunks else []
            chunks = self._compose(0, position.prompt, lead_chunks, closing=closing)
            return _Round(chunks, requests)
        # Either no tool was wanted or the tool round is done: write the answer,
        # reporting whatever the tools returned.
        opening: list[str] = []
        for call in position.tool_calls:
            result = position.tool_results.get(call.id, "no result")
            opening += _words(_report(call, result))
        length = max(1, self.options.answer_chunks - lead_chunks)
        round_index = 1 if position.rounds_done else 0
        return _Round(self._compose(round_index, position.prompt, length, opening=opening))

    def _tool_requests(self, prompt: str, offered: set[str]) -> tuple[ModelToolCall, ...]:
        wanted: list[tuple[str, dict[str, Any]]] = []
        expression = _find_expression(prompt)
        if CALCULATOR in offered and expression is not None:
            wanted.append((CALCULATOR, {"expression": expression}))
        if CLOCK in offered and _TIME_WORDS.search(prompt):
            wanted.append((CLOCK, {}))
        if not wanted and CALCULATOR in offered and self.options.tool_call_after_chunks is not None:
            wanted.append((CALCULATOR, {"expression": self._derived_expression(prompt)}))
        named = self.options.call_tool
        if named is not None and named.name in offered and named.name not in dict(wanted):
            wanted.append((named.name, dict(named.arguments)))
        return tuple(
            ModelToolCall(id=self._call_id(prompt, index), name=name, arguments=arguments)
            for index, (name, arguments) in enumerate(wanted)
        )

    def _derived_expression(self, prompt: str) -> str:
        rng = self._rng(prompt, "expression")
        return f"{rng.randint(12, 99)} * {rng.randint(12, 99)} + {rng.randint(1, 999)}"

    def _call_id(self, prompt: str, index: int) -> str:
        return "call_" + _digest(f"{self.options.seed}\x00{prompt}\x00call\x00{index}")[:24]

    def _rng(self, prompt: str, purpose: str) -> random.Random:
        # Python's hash() is salted per process; sha256 keeps the text identical
        # across processes and replicas, which a resumed turn depends on.
        return random.Random(int(_digest(f"{self.options.seed}\x00{prompt}\x00{purpose}"), 16))

    def _compose(
        self,
        round_index: int,
        prompt: str,
        n_chunks: int,
        *,
        opening: Sequence[str] = (),
        closing: Sequence[str] = (),
    ) -> tuple[str, ...]:
        if n_chunks <= 0:
            return ()
        rng = self._rng(prompt, f"round-{round_index}")
        size = self.options.chunk_size
        tokens = [(word, " ") for word in opening]
        # Whole sentences until there are enough words; the answer ends on a full stop.
        sentences_in_paragraph = 0
        paragraph_length = rng.randint(3, 6)
        while len(tokens) + len(closing) < n_chunks * size:
            sentence = _sentence(rng)
            tokens += [(word, " ") for word in sentence]
            sentences_in_paragraph += 1
            if sentences_in_paragraph == paragraph_length:
                tokens[-1] = (tokens[-1][0], "\n\n")
                sentences_in_paragraph = 0
                paragraph_length = rng.randint(3, 6)
        tokens += [(word, " ") for word in closing]
        tokens[-1] = (tokens[-1][0], "")
        # Exactly n_chunks chunks: the last one takes whatever words are left over.
        starts = [index * size for index in range(n_chunks)]
        ends = [*starts[1:], len(tokens)]
        return tuple(_join(tokens[start:end]) for start, end in zip(starts, ends, strict=True))


def _locate(messages: Sequence[ModelMessage]) -> _Position:
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    prompt = messages[last_user].content if last_user >= 0 else ""
    turn = list(messages[last_user + 1 :])
    partial = ""
    if turn and turn[-1].role == "assistant" and not turn[-1].tool_calls:
        partial = turn.pop().content
    requests = [m for m in turn if m.role == "assistant" and m.tool_calls]
    results = {m.tool_call_id: m.content for m in turn if m.role == "tool" and m.tool_call_id}
    calls = tuple(call for m in requests for call in m.tool_calls)
    return _Position(prompt, len(requests), calls, results, partial)


def _remainder(chunks: Sequence[str], partial: str) -> list[str]:
    """The chunks still to stream when ``partial`` text was already produced."""
    full = "".join(chunks)
    if not full.startswith(partial):
        # Not text this model wrote for this turn (another model, another seed):
        # continue from the first chunk boundary past it rather than repeat it.
        offset, pieces = 0, []
        for chunk in chunks:
            if offset >= len(partial):
                pieces.append(chunk)
            offset += len(chunk)
        return pieces
    pieces = []
    offset = 0
    for chunk in chunks:
        end = offset + len(chunk)
        if end > len(partial):
            pieces.append(chunk[max(0, len(partial) - offset) :])
        offset = end
    return pieces


def _find_expression(text: str) -> str | None:
    match = _EXPRESSION.search(text)
    return _balance(match.group().strip()) if match else None


def _balance(expression: str) -> str:
    # The pattern may swallow a bracket that belongs to the surrounding prose.
    while expression.startswith("(") and expression.count("(") > expression.count(")"):
        expression = expression[1:].lstrip()
    while expression.endswith(")") and expression.count(")") > expression.count("("):
        expression = expression[:-1].rstrip()
    return expression


def _announce(calls: Sequence[ModelToolCall]) -> str:
    names = " and the ".join(call.name for call in calls)
    return f"Let me check with the {names}."


def _report(call: ModelToolCall, result: str) -> str:
    result = " ".join(result.split())
    if call.name == CALCULATOR:
        return f"The calculator says {call.arguments.get('expression', '')} = {result}."
    if call.name == CLOCK:
        return f"The clock reads {result}."
    return f"The {call.name} tool returned {result}."


def _join(tokens: Sequence[tuple[str, str]]) -> str:
    return "".join(word + separator for word, separator in tokens)


def _words(text: str) -> list[str]:
    return text.split()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_DETERMINERS = ("the", "every", "each", "one", "that", "this")
_ADJECTIVES = (
    "quiet", "bright", "patient", "steady", "curious", "distant", "gentle", "careful",
    "ancient", "modern", "silver", "narrow", "open", "simple", "golden", "early",
    "quick", "hidden", "local", "honest", "warm", "clever", "humble", "little",
)  # fmt: skip
_NOUNS = (
    "river", "garden", "engine", "library", "window", "harbor", "market", "signal",
    "village", "bridge", "letter", "forest", "station", "teacher", "painter", "lantern",
    "journey", "question", "answer", "machine", "island", "morning", "story", "road",
)  # fmt: skip
_VERBS = (
    "follows", "remembers", "builds", "carries", "finds", "explains", "watches", "shapes",
    "reaches", "keeps", "measures", "crosses", "opens", "gathers", "describes", "guides",
    "welcomes", "repairs", "notices", "answers",
)  # fmt: skip
_ADVERBS = (
    "slowly", "quietly", "again", "carefully", "together", "today", "gladly", "often",
    "easily", "at last", "every day", "with care",
)  # fmt: skip
_PREPOSITIONS = ("across", "beyond", "near", "under", "toward", "behind", "along", "inside")
_LINKS = ("and", "while", "because", "so", "but")


def _noun_phrase(rng: random.Random) -> list[str]:
    words = [rng.choice(_DETERMINERS)]
    if rng.random() < 0.6:
        words.append(rng.choice(_ADJECTIVES))
    words.append(rng.choice(_NOUNS))
    return words


def _clause(rng: random.Random) -> list[str]:
    words = [*_noun_phrase(rng), rng.choice(_VERBS), *_noun_phrase(rng)]
    if rng.random() < 0.4:
        words += [rng.choice(_PREPOSITIONS), *_noun_phrase(rng)]
    if rng.random() < 0.3:
        words += rng.choice(_ADVERBS).split()
    return words


def _sentence(rng: random.Random) -> list[str]:
    words = _clause(rng)
    if rng.random() < 0.35:
        words[-1] += ","
        words += [rng.choice(_LINKS), *_clause(rng)]
    words[0] = words[0].capitalize()
    words[-1] += "."
    return words
