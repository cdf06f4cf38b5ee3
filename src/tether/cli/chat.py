"""``tether chat``: send one message to a running server and watch the answer stream in."""

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

from tether.cli._sse_client import iter_sse

# Generous read timeout: the server pings idle streams, and a slow tool may keep
# an answer quiet for a while; a dead connection still ends in a minute.
_TIMEOUT = httpx2.Timeout(10.0, read=60.0)
_TOOL_STYLES = {"running": "yellow", "completed": "green", "error": "red"}


def chat_command(
    message: Annotated[str, typer.Argument(help="The user message to send.")],
    url: Annotated[str, typer.Option(help="Base URL of the tether server.")] = (
        "http://127.0.0.1:8000"
    ),
    agent: Annotated[str, typer.Option(help="agent_identifier of the agent to ask.")] = (
        "assistant"
    ),
    tenant: Annotated[str, typer.Option(help="Tenant (the tenant query parameter).")] = "default",
    user: Annotated[
        str | None, typer.Option(help="Requester id, sent as the requester-uuid header.")
    ] = None,
    session: Annotated[
        str | None, typer.Option(help="session_id of the conversation to continue.")
    ] = None,
    stateful: Annotated[
        bool, typer.Option(help="Run a stateful turn (checkpointed, resumable).")
    ] = False,
) -> None:
    """Send MESSAGE to an agent over POST /chat/stream and show the answer as it grows."""
    console = Console()
    try:
        code = asyncio.run(
            run_chat(
                message,
                url=url,
                agent=agent,
                tenant=tenant,
                user=user,
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


async def run_chat(
    message: str,
    *,
    url: str = "http://127.0.0.1:8000",
    agent: str = "assistant",
    tenant: str = "default",
    user: str | None = None,
    session: str | None = None,
    stateful: bool = False,
    console: Console | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> int:
    """One turn, rendered to ``console``; returns the exit code (0 when the answer
    completed). ``transport`` lets tests answer without a server."""
    console = console or Console()
    body = {
        "agent_identifier": agent,
        "conversation": [{"sender": "user", "content": message}],
        "stateful": stateful,
        "session_id": session,
    }
    headers = {"requester-uuid": user} if user else {}
    progress = _Progress(started=time.monotonic())
    try:
        async with (
            httpx2.AsyncClient(base_url=url, timeout=_TIMEOUT, transport=transport) as client,
            client.stream(
                "POST", "/chat/stream", params={"tenant": tenant}, json=body, headers=headers
            ) as response,
        ):
            if response.status_code >= 400:
                await response.aread()
                console.print(Text(_describe_http_error(response), style="red"))
                return 1
            await _follow(response, progress, console)
    except httpx2.HTTPError as exc:
        console.print(Text(f"request to {url} failed: {type(exc).__name__}: {exc}", style="red"))
        return 1
    _print_summary(console, progress)
    if progress.error is not None:
        return 1
    return 0 if progress.status in (None, "done") else 1


async def _follow(response: httpx2.Response, progress: _Progress, console: Console) -> None:
    if not console.is_terminal:
        # Piped or captured: no live redraws, just the final answer once.
        async for event in iter_sse(response):
            _apply(progress, event.event, event.id, event.data)
        console.print(_render(progress))
        return
    with Live(_render(progress), console=console, refresh_per_second=12) as live:
        async for event in iter_sse(response):
            _apply(progress, event.event, event.id, event.data)
            live.update(_render(progress))


def _apply(progress: _Progress, event: str, event_id: str, data: str) -> None:
    progress.events += 1
    if progress.first_event_at is None:
        progress.first_event_at = time.monotonic()
    payload = _json(data)
    if event == "new_message" and isinstance(payload, dict):
        progress.latest = payload
        # The id is "<message_id>:<index>"; message ids may hold colons, indexes don't.
        progress.message_id = event_id.rpartition(":")[0] or payload.get("message_id")
        progress.session_id = payload.get("session_id") or progress.session_id
    elif event == "stream_status" and isinstance(payload, dict):
        progress.status = str(payload.get("reason"))
    elif event == "error":
        if isinstance(payload, dict):
            progress.error = f"{payload.get('code', 'ERROR')}: {payload.get('message', '')}"
        else:
            progress.error = data


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


def _describe_http_error(response: httpx2.Response) -> str:
    """An HTTP error in words, from either body shape the server uses."""
    prefix = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    payload = _json(response.text)
    if not isinstance(payload, dict):
        text = response.text.strip()
        return f"{prefix}: {text}" if text else prefix
    detail = payload.get("detail")
    if "code" in payload and "message" in payload:
        described = f"{payload['code']}: {payload['message']}"
        # A 409 names the occupant in ``detail`` (the SDK's shape).
        occupant = detail.get("message_id") if isinstance(detail, dict) else None
        occupant = occupant or payload.get("message_id")
        if occupant:
            described += f" (turn in progress: {occupant})"
        return f"{prefix}: {described}"
    if isinstance(detail, list):
        # FastAPI's 422: one entry per invalid field.
        problems = [
            f"{'.'.join(str(p) for p in item.get('loc', []))}: {item.get('msg', item)}"
            if isinstance(item, dict)
            else str(item)
            for item in detail
        ]
        return f"{prefix}: {'; '.join(problems)}"
    if isinstance(detail, dict) and "message" in detail:
        return f"{prefix}: {detail.get('code', 'ERROR')}: {detail['message']}"
    if detail is not None:
        return f"{prefix}: {detail}"
    return f"{prefix}: {response.text.strip()}"


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
