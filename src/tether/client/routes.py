"""The HTTP API's routes as request descriptions (design §3), sent by whoever holds
the connection: the client, or the crash test's instrumented readers.

Keeping paths, parameters and bodies here, apart from any I/O, means every
caller of a route sends the same request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MESSAGE_ID_HEADER = "x-tether-message-id"
"""The response header of ``POST /chat/stream`` naming the turn the server started."""


@dataclass(frozen=True)
class Route:
    """One request, relative to a replica's (or the load balancer's) base URL."""

    kind: str
    """start, resume or attach for a turn's stream; the route's name otherwise."""
    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def url(self, base_url: str) -> str:
        return base_url.rstrip("/") + self.path

    def options(self, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Keyword arguments for ``httpx2.AsyncClient.request``/``.stream``, with
        ``headers`` (the caller's identity) added."""
        merged = {**(headers or {}), **self.headers}
        options: dict[str, Any] = {"params": self.params, "headers": merged}
        if self.json is not None:
            options["json"] = self.json
        return options


def start(
    tenant: str,
    *,
    agent_identifier: str,
    conversation: list[dict[str, Any]],
    session_id: str | None,
    stateful: bool = True,
    bot_params: dict[str, Any] | None = None,
    conversation_context: dict[str, Any] | None = None,
    multitask_strategy: str = "reject",
    stream_mode: str | None = None,
) -> Route:
    """``POST /chat/stream``: a new turn; its last message is the user's new one.
    ``multitask_strategy`` says what to do when another turn occupies the
    conversation (reject: 409, enqueue: 202 and run after it, interrupt,
    rollback); left out of the body when it is the default. ``stream_mode``:
    ``delta`` for events that carry only the text appended (None: the
    server's default, cumulative)."""
    body: dict[str, Any] = {
        "agent_identifier": agent_identifier,
        "stateful": stateful,
        "session_id": session_id,
        "conversation": conversation,
    }
    if bot_params is not None:
        body["bot_params"] = bot_params
    if conversation_context is not None:
        body["conversation_context"] = conversation_context
    if multitask_strategy != "reject":
        body["multitask_strategy"] = multitask_strategy
    return Route("start", "POST", "/chat/stream", _mode({"tenant": tenant}, stream_mode), body)


def resume(
    tenant: str,
    *,
    agent_identifier: str,
    message_id: str,
    session_id: str,
    stream_mode: str | None = None,
) -> Route:
    """``POST /chat/stream?resume=true``: take over turn ``message_id`` once its
    producer is dead (409 while it lives, 410 once it has ended)."""
    body = {
        "agent_identifier": agent_identifier,
        "stateful": True,
        "session_id": session_id,
        "conversation": [],
    }
    params = {"tenant": tenant, "resume": "true", "message_id": message_id}
    return Route("resume", "POST", "/chat/stream", _mode(params, stream_mode), body)


def attach(
    tenant: str,
    *,
    message_id: str,
    session_id: str | None,
    last_event_id: str | None = None,
    stream_mode: str | None = None,
) -> Route:
    """``GET /chat/stream/{message_id}``: the turn's events after ``last_event_id``
    (all of them, the first holding the whole answer so far, without one)."""
    params = {"tenant": tenant}
    if session_id:
        params["session_id"] = session_id
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    path = f"/chat/stream/{message_id}"
    return Route("attach", "GET", path, _mode(params, stream_mode), headers=headers)


def _mode(params: dict[str, str], stream_mode: str | None) -> dict[str, str]:
    """``params`` with ``stream_mode`` when one is asked for."""
    return {**params, "stream_mode": stream_mode} if stream_mode else params


def status(tenant: str, session_id: str) -> Route:
    return Route(
        "status", "GET", "/chat/stream/status", {"tenant": tenant, "session_id": session_id}
    )


def cancel(tenant: str, message_id: str, session_id: str | None) -> Route:
    params = {"tenant": tenant}
    if session_id:
        params["session_id"] = session_id
    return Route("cancel", "DELETE", f"/chat/stream/{message_id}", params)


def list_conversations(tenant: str, limit: int, cursor: str | None) -> Route:
    params = {"tenant": tenant, "limit": str(limit)}
    if cursor is not None:
        params["cursor"] = cursor
    return Route("list", "GET", "/conversations", params)


def get_conversation(tenant: str, session_id: str) -> Route:
    return Route("read", "GET", f"/conversations/{session_id}", {"tenant": tenant})


def share_conversation(tenant: str, session_id: str, shared: bool) -> Route:
    return Route(
        "share", "PATCH", f"/conversations/{session_id}", {"tenant": tenant}, {"shared": shared}
    )


def delete_conversation(tenant: str, session_id: str) -> Route:
    return Route("delete", "DELETE", f"/conversations/{session_id}", {"tenant": tenant})
