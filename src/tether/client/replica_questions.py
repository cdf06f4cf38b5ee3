"""What a recovering client asks a replica: the conversation's status, its
transcript, and the agent it runs.

Each question is one GET with three kinds of answer: the JSON body (or None
for tether's own 404: nothing known), ``Unreachable`` when the answer says
only that this base URL cannot serve right now (no connection, or a 502, 503
or 504: ask again, elsewhere), or the typed error for any other refusal.
"""

from __future__ import annotations

from typing import Any

import httpx2

from tether.client import routes
from tether.client.errors import TetherHTTPError, error_from_response
from tether.client.models import Conversation, TurnStatus
from tether.client.turn_events import RecoveryCause

RETRYABLE_STATUSES = frozenset({502, 503, 504})
"""Answers that say nothing about the turn, only that this replica (or the proxy)
cannot serve right now: ask again, elsewhere."""


class Unreachable(Exception):
    """A request that got no usable answer from this base URL: none at all
    (``unreachable``), or a 502, 503 or 504 (``unavailable``)."""

    def __init__(self, cause: RecoveryCause) -> None:
        super().__init__(cause)
        self.cause: RecoveryCause = cause


class ReplicaQuestions:
    """The GETs of one client's recovery, with its identity headers."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        tenant: str,
        headers: dict[str, str],
        timeout: httpx2.Timeout,
    ) -> None:
        self._http = http
        self._tenant = tenant
        self._headers = headers
        self._timeout = timeout

    async def status(self, url: str, session_id: str) -> TurnStatus | None:
        body = await self._get(url, routes.status(self._tenant, session_id))
        return TurnStatus.from_json(body) if body is not None else None

    async def conversation(self, url: str, session_id: str) -> Conversation | None:
        body = await self._get(url, routes.get_conversation(self._tenant, session_id))
        return Conversation.from_json(body) if body is not None else None

    async def agent(self, url: str, session_id: str) -> str | None:
        """The conversation's agent, for a resume of a turn this client did not start."""
        try:
            conversation = await self.conversation(url, session_id)
        except TetherHTTPError:
            return None
        return conversation.summary.agent_identifier if conversation is not None else None

    async def _get(self, url: str, route: routes.Route) -> Any:
        try:
            response = await self._http.request(
                route.method,
                route.url(url),
                timeout=self._timeout,
                **route.options(self._headers),
            )
        except httpx2.TransportError as failure:
            raise Unreachable("unreachable") from failure
        if response.status_code == 404 and _is_ours(response):
            return None
        if response.status_code in RETRYABLE_STATUSES:
            refusal = error_from_response(response.status_code, response.text, response.headers)
            raise Unreachable("unavailable") from refusal
        if response.status_code >= 300:
            raise error_from_response(response.status_code, response.text, response.headers)
        return response.json()


def _is_ours(response: httpx2.Response) -> bool:
    """A 404 from tether (``TURN_NOT_FOUND``), not a proxy's page for an unknown path."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and "code" in body
