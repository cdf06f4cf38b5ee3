"""The crash test's client: the HTTP calls a real client makes, each returning
what it got, a stream as a ``reader.TurnReader`` (every event kept with the
moment it arrived), and what the client has shown its user across them.

The requests are ``tether.client``'s (``routes``), and so is the recovery
(``recovery.py`` here drives ``TetherClient.follow``); this module and
``reader`` only keep the evidence.

With a load balancer in front (``TetherAPI(front=...)``), every request goes
through it; a request the round addresses to one replica (a turn placed on
the replica about to fail, a cancel from another) is pinned to it there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from tether.client import routes
from tether.client.models import TurnStatus
from tether.crashtest.load_balancer import PIN_HEADER, HAProxy
from tether.crashtest.reader import TurnReader

__all__ = [
    "REQUESTER",
    "TENANT",
    "ClientView",
    "TetherAPI",
    "TurnStatus",
]

TENANT = "crash-test"
REQUESTER = "crash-test-client"
# The server pings idle streams every 15 s, so a read this long with nothing at
# all means the connection is gone (or its replica is stopped).
TIMEOUT = httpx2.Timeout(5.0, read=30.0)


class TetherAPI:
    """The routes of design §3 the crash test uses, as one client identity.

    Each call names the replica it is for by its base URL. With ``front`` (a
    load balancer in front of the replicas) it goes through the front instead,
    pinned to that replica while the front finds it up: the round decides
    where its turns start and where a cancel comes from, while everything the
    client does to recover (``recovery.recover``) is balanced.
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        agent: str,
        *,
        conversations: bool = True,
        front: HAProxy | None = None,
        names: Callable[[str], str | None] | None = None,
    ) -> None:
        self.http = http
        self.agent = agent
        self.conversations = conversations
        """Whether the servers run with a conversation store (transcripts to read)."""
        self.front = front
        self._names = names
        """The replica serving at a base URL (to pin requests through the front)."""

    @staticmethod
    def client() -> httpx2.AsyncClient:
        # No cap on connections: every reader holds one open for its whole
        # stream, and httpx's default cap (100) would queue a follower behind
        # the direct readers of a run with 100 turns at once, so it attached
        # only once they were almost done and measured nothing.
        return httpx2.AsyncClient(
            timeout=TIMEOUT,
            headers={"requester-uuid": REQUESTER},
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=20),
        )

    def _target(self, base_url: str, replica: str | None = None) -> tuple[str, dict[str, str]]:
        """Where to send a request meant for the replica at ``base_url``, and the
        headers that pin it there."""
        if self.front is None:
            return base_url, {}
        name = replica or (self._names(base_url) if self._names is not None else None)
        return self.front.url, ({PIN_HEADER: name} if name else {})

    def _open(self, route: routes.Route, base_url: str, replica: str, label: str) -> TurnReader:
        url, pin = self._target(base_url, replica)
        front = self.front
        options = route.options(pin)

        async def pinned_replica_up() -> None:
            # A replica just restarted or continued may not be up behind the
            # front yet; the pin would be ignored and the turn land elsewhere.
            if front is not None and pin:
                await front.wait_up(replica, within=10.0)

        return TurnReader.open(
            self.http,
            route.method,
            route.url(url),
            label=label,
            replica=replica,
            before=pinned_replica_up if pin else None,
            **options,
        )

    def start_turn(self, base_url: str, replica: str, prompt: str, session_id: str) -> TurnReader:
        route = routes.start(
            TENANT,
            agent_identifier=self.agent,
            conversation=[{"sender": "user", "content": prompt}],
            session_id=session_id,
            stateful=True,
        )
        return self._open(route, base_url, replica, "start")

    def resume(self, base_url: str, replica: str, message_id: str, session_id: str) -> TurnReader:
        route = routes.resume(
            TENANT, agent_identifier=self.agent, message_id=message_id, session_id=session_id
        )
        return self._open(route, base_url, replica, "resume")

    def attach(
        self,
        base_url: str,
        replica: str,
        message_id: str,
        session_id: str,
        *,
        last_event_id: str | None = None,
        label: str = "attach",
    ) -> TurnReader:
        route = routes.attach(
            TENANT, message_id=message_id, session_id=session_id, last_event_id=last_event_id
        )
        return self._open(route, base_url, replica, label)

    async def _send(self, route: routes.Route, base_url: str) -> httpx2.Response:
        url, pin = self._target(base_url)
        return await self.http.request(route.method, route.url(url), **route.options(pin))

    async def status(self, base_url: str, session_id: str) -> TurnStatus | None:
        """The conversation's turn and verdict; None when the server knows none (404)."""
        response = await self._send(routes.status(TENANT, session_id), base_url)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return TurnStatus.from_json(response.json())

    async def transcript(self, base_url: str, session_id: str) -> list[dict[str, Any]] | None:
        """The conversation's messages; None when it does not exist (404) or the
        servers keep no transcripts."""
        conversation = await self.conversation(base_url, session_id)
        return conversation[1] if conversation is not None else None

    async def conversation(
        self, base_url: str, session_id: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The conversation's summary (``last_turn_status`` and the rest) and its
        messages; None when it does not exist (404) or the servers keep no transcripts."""
        if not self.conversations:
            return None
        response = await self._send(routes.get_conversation(TENANT, session_id), base_url)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body = response.json()
        return dict(body["conversation"]), list(body["messages"])

    async def cancel(self, base_url: str, message_id: str, session_id: str) -> int:
        """``DELETE /chat/stream/{message_id}``: the HTTP status of the answer
        (204 cancelled, 410 already ended, 409 changed hands meanwhile)."""
        response = await self._send(routes.cancel(TENANT, message_id, session_id), base_url)
        return response.status_code


@dataclass
class ClientView:
    """What the client has shown its user so far, across all its readers."""

    last_event_id: str | None = None
    max_index: int = -1
    longest: int = 0
    consumed: list[tuple[TurnReader, int]] = field(default_factory=list)

    def take(self, reader: TurnReader, upto: int | None = None) -> None:
        """The client has used ``reader``'s first ``upto`` events (all by default)."""
        events = reader.events if upto is None else reader.events[:upto]
        for event in events:
            if event.kind != "new_message":
                continue
            self.last_event_id = event.event_id or self.last_event_id
            if event.index is not None:
                self.max_index = max(self.max_index, event.index)
            if event.message is not None:
                self.longest = max(self.longest, len(str(event.message.get("content", ""))))
        self.consumed.append((reader, len(events)))
