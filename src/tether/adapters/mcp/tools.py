"""``MCPTools``: a turn's tools from its agent's MCP servers, and what to tell about the rest.

An agent asks for ``MCPTools`` in its constructor and, per turn::

    tools = await self.mcp_tools.tools()
    async for message in self.chat_client.stream(
        conversation, tools=[*tools, calculator],
        system_prompt=self.mcp_tools.system_prompt(SYSTEM_PROMPT),
    ):
        yield self.mcp_tools.annotate(message)

``tools()`` lists every configured server (concurrently). A server that cannot
be used this turn (unreachable, waiting for the user's authorization, skipped
for want of a store) contributes no tools and a notice instead; the turn goes
on. ``annotate`` puts the notices at the head of the answer: a text line per
server for people, and a ``context`` content part per server for clients
(``{"mcp_authorization": {"server", "url"}}`` for a link to show as a button,
``{"mcp_unavailable": {"server", "reason"}}`` otherwise). ``system_prompt``
tells the model the same.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mcp import Client

from tether.adapters.mcp.config import MCPServerConfig
from tether.adapters.mcp.connection import MCPCallError, MCPServerUnavailableError, result_value
from tether.adapters.mcp.session import (
    MCPAuthorizationRequiredError,
    MCPServerSkippedError,
    ServerSession,
)
from tether.adapters.mcp.store import MCPOAuthRefreshUnavailableError
from tether.domain.chat_message import ChatMessage, ContentPart, ContentPartType
from tether.domain.store_errors import StoreError
from tether.tools import Tool, ToolArgumentsError, ToolCallContext, current_tool_call

logger = logging.getLogger(__name__)

NoticeKind = Literal["authorization_required", "unavailable", "skipped"]
_MAX_PAGES = 20
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class MCPNotice:
    """Why a server's tools are missing from this turn (or a call of one failed)."""

    server: str
    kind: NoticeKind
    reason: str
    url: str | None = None

    def text(self) -> str:
        """The line the user reads."""
        if self.kind == "authorization_required":
            return f"To use the tools of {self.server}, connect your account: {self.url}"
        if self.kind == "skipped":
            return f"The tools of {self.server} are not available: {self.reason}."
        return (
            f"The MCP server {self.server} is unavailable right now ({self.reason}); "
            "answering without its tools."
        )

    def for_model(self) -> str:
        if self.kind == "authorization_required":
            return "needs the user's authorization; the user has been shown a link to grant it"
        return f"is unavailable ({self.reason})"

    def context(self) -> dict[str, Any]:
        if self.kind == "authorization_required":
            return {"mcp_authorization": {"server": self.server, "url": self.url}}
        return {"mcp_unavailable": {"server": self.server, "reason": self.reason}}


class MCPTool(Tool):
    """A tool of an MCP server, offered to the model under a prefixed name.

    ``Tool.__init__`` derives the schema from a Python signature; an MCP tool
    brings its own JSON schema, and the server validates the arguments.
    """

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        *,
        remote_name: str,
        owner: MCPTools,
        session: ServerSession,
        read_only: bool = False,
    ) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters
        self.function = self.invoke
        # The server's hints: a read-only or idempotent tool is run again when a
        # resume cannot tell whether its call happened; any other is not.
        self.set_outcome_policy(read_only=read_only, on_unknown=None)
        self.remote_name = remote_name
        self._owner = owner
        self._session = session

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        if not isinstance(arguments, Mapping):
            raise ToolArgumentsError(f"tool {self.name!r} takes an object of named arguments")

        meta = _call_meta(current_tool_call())

        async def call(client: Client) -> Any:
            return result_value(
                await client.call_tool(self.remote_name, dict(arguments), meta=meta)
            )

        try:
            return await self._session.run(call)
        except MCPCallError:
            raise
        except Exception as error:
            notice = self._owner._notice_for(self._session.server.name, error)
            if notice is None:
                raise
            raise MCPCallError(f"{self._session.server.name} {notice.for_model()}") from error


class MCPTools:
    """The MCP tools of one turn, for the turn's user (see the module docstring)."""

    def __init__(self, sessions: Sequence[ServerSession]) -> None:
        self.sessions = list(sessions)
        self.notices: list[MCPNotice] = []
        self._tools: list[Tool] | None = None

    @property
    def servers(self) -> list[MCPServerConfig]:
        return [session.server for session in self.sessions]

    async def tools(self) -> list[Tool]:
        """Every usable tool of every configured server; listed once per turn."""
        if self._tools is None:
            listed = await asyncio.gather(*(self._list(s) for s in self.sessions))
            by_name: dict[str, Tool] = {}
            for tool in (tool for tools in listed for tool in tools):
                if tool.name in by_name:
                    logger.warning("two MCP tools are offered as %r; keeping the first", tool.name)
                    continue
                by_name[tool.name] = tool
            self._tools = list(by_name.values())
        return list(self._tools)

    def annotate(self, message: ChatMessage) -> ChatMessage:
        """``message`` with this turn's notices at its head (text and context parts)."""
        if not self.notices:
            return message
        note = "\n".join(notice.text() for notice in self.notices)
        parts = [ContentPart(type=ContentPartType.TEXT, text=note)]
        parts += [
            ContentPart(type=ContentPartType.CONTEXT, context=n.context()) for n in self.notices
        ]
        content = f"{note}\n\n{message.content}" if message.content else note
        return message.model_copy(
            update={"content": content, "content_parts": parts + list(message.content_parts or [])}
        )

    def content_parts(self) -> list[ContentPart]:
        """Just the context parts of the notices."""
        return [
            ContentPart(type=ContentPartType.CONTEXT, context=n.context()) for n in self.notices
        ]

    def system_prompt(self, base: str | None = None) -> str | None:
        """``base`` plus a note to the model about servers missing from this turn."""
        if not self.notices:
            return base
        lines = [f"- {n.server} {n.for_model()}" for n in self.notices]
        note = "Some tool servers cannot be used in this turn; say so briefly:\n" + "\n".join(lines)
        return f"{base}\n\n{note}" if base else note

    async def aclose(self) -> None:
        """Nothing stays open between operations; kept for the runtime's close hook."""

    async def _list(self, session: ServerSession) -> list[Tool]:
        server = session.server

        async def list_all(client: Client) -> list[Any]:
            found: list[Any] = []
            cursor: str | None = None
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                found.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            return found

        try:
            remote = await session.run(list_all)
        except Exception as error:
            if self._notice_for(server.name, error) is None:
                raise
            return []
        wanted = None if server.tools is None else set(server.tools)
        return [
            MCPTool(
                _model_name(server.prefix + tool.name),
                tool.description or tool.title or tool.name,
                dict(tool.input_schema or {"type": "object", "properties": {}}),
                remote_name=tool.name,
                owner=self,
                session=session,
                read_only=_safe_to_repeat(tool),
            )
            for tool in remote
            if wanted is None or tool.name in wanted
        ]

    def _notice_for(self, server: str, error: BaseException) -> MCPNotice | None:
        """Record (once) and return the notice ``error`` means, or None for a bug."""
        notice: MCPNotice
        if isinstance(error, MCPAuthorizationRequiredError):
            notice = MCPNotice(
                server, "authorization_required", "authorization required", error.url
            )
        elif isinstance(error, MCPServerSkippedError):
            notice = MCPNotice(server, "skipped", error.reason)
        elif isinstance(error, MCPServerUnavailableError):
            notice = MCPNotice(server, "unavailable", error.reason)
        elif isinstance(error, MCPOAuthRefreshUnavailableError | MCPCallError):
            notice = MCPNotice(server, "unavailable", str(error))
        elif isinstance(error, StoreError):
            notice = MCPNotice(
                server, "unavailable", f"its stored credentials are unusable: {error}"
            )
        else:
            return None
        if notice not in self.notices:
            self.notices.append(notice)
        # Not ``notice.text()``: an authorization link carries the pending ``state``.
        logger.info("MCP server %r: %s (%s)", server, notice.kind, notice.reason)
        return notice


def _model_name(name: str) -> str:
    # What chat-completions APIs accept as a function name.
    return _UNSAFE.sub("_", name)[:64]


IDEMPOTENCY_KEY_META = "tether/idempotency_key"
ATTEMPT_META = "tether/attempt"


def _call_meta(call: ToolCallContext | None) -> Any:
    """The ``_meta`` of a tool call: the model/tool loop's idempotency key and
    attempt (``tether.tools``), for a server that deduplicates on them. Keys
    with a prefix of ours, as MCP asks of keys it does not define."""
    if call is None:
        return None
    return {IDEMPOTENCY_KEY_META: call.idempotency_key, ATTEMPT_META: call.attempt}


def _safe_to_repeat(tool: Any) -> bool:
    """Whether the MCP server says calling ``tool`` twice is harmless: it only
    reads, or it is idempotent (its hints; absent hints say neither)."""
    hints = getattr(tool, "annotations", None)
    return bool(hints is not None and (hints.read_only_hint or hints.idempotent_hint))
