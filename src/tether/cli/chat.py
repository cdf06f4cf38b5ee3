"""``tether chat``: send one message to a running server and watch the answer stream in.

It is a user of the Python client (``tether.client``): the turn is stateful by
default, so a lost connection or a replica that dies mid-answer is recovered
(on the next ``--url`` when several are given) and the answer goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx2
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from tether.client import (
    ConversationBusyError,
    RecoveryError,
    TetherClient,
    TetherError,
    TetherHTTPError,
    Turn,
    TurnFailedError,
    TurnUpdate,
)

DEFAULT_URL = "http://127.0.0.1:8000"
_TOOL_STYLES = {"running": "yellow", "completed": "green", "error": "red"}


def chat_command(
    message: Annotated[str, typer.Argument(help="The user message to send.")],
    url: Annotated[
        list[str] | None,
        typer.Option(
            help="Base URL of the tether server (a load balancer's, or a replica's; "
            "repeat it to list several replicas)."
        ),
    ] = None,
    agent: Annotated[str, typer.Option(help="agent_identifier of the agent to ask.")] = (
        "assistant"
    ),
    tenant: Annotated[str, typer.Option(help="Tenant (the tenant query parameter).")] = "default",
    user: Annotated[
        str | None, typer.Option(help="Requester id, sent as the requester-uuid header.")
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="Bearer token, for a server run with --auth jwt.")
    ] = None,
    session: Annotated[
        str | None, typer.Option(help="session_id of the conversation to continue.")
    ] = None,
    stateful: Annotated[
        bool,
        typer.Option(
            help="Run a stateful turn (checkpointed, resumable): only such a turn is "
            "recovered when its connection or its replica is lost."
        ),
    ] = True,
) -> None:
    """Send MESSAGE to an agent over POST /chat/stream and show the answer as it grows."""
    console = Console()
    try:
        code = asyncio.run(
            run_chat(
                message,
                url=url or DEFAULT_URL,
                agent=agent,
                tenant=tenant,
                user=user,
                token=token,
                session=session,
                stateful=stateful,
                console=console,
            )
        )
    except KeyboardInterrupt:
        # Leaving does not stop the turn: the server keeps producing it.
        console.print("[yellow]interrupted; the turn goes on on the server[/yellow]")
        code = 130
    if code:
        raise typer.Exit(code)


@dataclass
class _Progress:
    started: float
    first_event_at: float | None = None
    events: int = 0
    message_id: str | None = None
    session_id: str | None = None
    latest: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    error: str | None = None
    path: list[str] = field(default_factory=list)


async def run_chat(
    message: str,
    *,
    url: str | list[str] = DEFAULT_URL,
    agent: str = "assistant",
    tenant: str = "default",
    user: str | None = None,
    token: str | None = None,
    session: str | None = None,
    stateful: bool = True,
    console: Console | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> int:
    """One turn, rendered to ``console``; returns the exit code (0 when the answer
    completed). ``transport`` lets tests answer without a server."""
    console = console or Console()
    progress = _Progress(started=time.monotonic())
    try:
        async with (
            TetherClient(
                url, tenant=tenant, requester_uuid=user, token=token, transport=transport
            ) as client,
            client.stream(
                agent_identifier=agent, message=message, session_id=session, stateful=stateful
            ) as turn,
        ):
            progress.session_id = turn.session_id
            try:
                await _follow(turn, progress, console)
            finally:
                progress.path = turn.path
    except TurnFailedError as error:
        progress.error = f"{error.code}: {error.message}"
    except TetherHTTPError as error:
        console.print(Text(_describe(error), style="red"))
        return 1
    except RecoveryError as error:
        progress.error = f"lost the answer: {error}"
    except TetherError as error:
        console.print(Text(f"request to {url} failed: {error}", style="red"))
        return 1
    _print_summary(console, progress)
    if progress.error is not None:
        return 1
    return 0 if progress.status in (None, "done") else 1


async def _follow(turn: Turn, progress: _Progress, console: Console) -> None:
    if not console.is_terminal:
        # Piped or captured: no live redraws, just the final answer once.
        async for update in turn:
            _apply(progress, update)
        progress.status = turn.outcome
        console.print(_render(progress))
        return
    with Live(_render(progress), console=console, refresh_per_second=12) as live:
        async for update in turn:
            _apply(progress, update)
            live.update(_render(progress))
    progress.status = turn.outcome


def _apply(progress: _Progress, update: TurnUpdate) -> None:
    progress.events += 1
    if progress.first_event_at is None:
        progress.first_event_at = time.monotonic()
    progress.latest = update.data
    progress.message_id = update.message_id
    progress.session_id = update.session_id


def _render(progress: _Progress) -> Group:
    message = progress.latest
    parts = message.get("content_parts") or []
    lines: list[Text] = []
    if any(part.get("type") == "text" for part in parts):
        for part in parts:
            lines.extend(_render_part(part))
    else:
        for part in parts:
            lines.extend(_render_part(part))
        if message.get("content"):
            lines.append(Text(str(message["content"])))
    if not lines:
        lines.append(Text("waiting for the answer...", style="dim"))
    return Group(*lines)


def _render_part(part: dict[str, Any]) -> list[Text]:
    kind = part.get("type")
    if kind == "text" and part.get("text"):
        return [Text(str(part["text"]))]
    if kind == "tool" and isinstance(part.get("tool"), dict):
        tool = part["tool"]
        status = str(tool.get("status", "running"))
        line = Text("  tool ", style="dim")
        line.append(str(tool.get("name", "?")), style="bold")
        line.append(f"({json.dumps(tool.get('params') or {}, ensure_ascii=False)}) ")
        line.append(status, style=_TOOL_STYLES.get(status, ""))
        return [line]
    if kind == "table" and isinstance(part.get("table"), dict):
        rows = part["table"].get("rows") or []
        return [Text(f"  [table: {len(rows)} rows]", style="dim")]
    return []


def _print_summary(console: Console, progress: _Progress) -> None:
    if progress.error is not None:
        console.print(Text(f"error: {progress.error}", style="red"))
    if progress.status not in (None, "done"):
        console.print(Text(f"stream ended: {progress.status}", style="yellow"))
    if len(progress.path) > 1:
        # Reconnected on the way: say how (``start > attach``, ``resume:409``...).
        console.print(Text(f"recovered: {' > '.join(progress.path)}", style="yellow"))
    now = time.monotonic()
    first = (
        f"{progress.first_event_at - progress.started:.3f}s"
        if progress.first_event_at is not None
        else "-"
    )
    summary = (
        f"message_id={progress.message_id or '-'} session_id={progress.session_id or '-'} "
        f"first event {first}, total {now - progress.started:.3f}s, {progress.events} events"
    )
    console.print(Text(summary, style="dim"))


def _describe(error: TetherHTTPError) -> str:
    """An HTTP error in words: its status, the server's code and message."""
    described = f"HTTP {error.status_code}: {error.code}: {error.message}"
    if isinstance(error, ConversationBusyError) and error.occupant:
        described += f" (turn in progress: {error.occupant})"
    return described
