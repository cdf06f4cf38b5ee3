"""``TetherClient``: tether's HTTP API for asyncio code, with turns that
recover by themselves (``SyncTetherClient`` is its twin for blocking code).

    async with TetherClient("http://lb:8000", tenant="acme", requester_uuid="alice") as client:
        async for update in client.stream(agent_identifier="assistant", message="Hi"):
            print(update.content)

``base_url`` is one URL (a load balancer's, or a single replica's) or a list
of replica URLs: any replica serves any request, and a request that one
cannot serve goes to the next.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx2

from tether.client import routes
from tether.client.endpoints import Endpoints, RotatingEndpoints
from tether.client.errors import (
    ConnectionFailedError,
    NotFoundError,
    TetherError,
    TetherHTTPError,
    error_from_response,
)
from tether.client.held_message import STREAM_MODE
from tether.client.models import (
    Conversation,
    ConversationPage,
    ConversationSummary,
    TurnStatus,
)
from tether.client.observer import TurnObserver
from tether.client.recovery import Timeouts, TurnDriver, TurnKnowledge
from tether.client.replica_questions import RETRYABLE_STATUSES
from tether.client.turn import Turn
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_request import MultitaskStrategy

DEFAULT_TIMEOUT = 10.0
DEFAULT_STREAM_READ_TIMEOUT = 30.0
"""The server pings an idle stream every 15 s: twice that with nothing at all
means the connection is gone (or its replica is stopped)."""
DEFAULT_RECOVERY_TIMEOUT = 60.0
"""A lost turn is taken over within the dead threshold (3 s) and the takeover
delay (1 s), then regenerated from its last checkpoint (5 s apart) before it
streams anything new: a minute leaves a wide margin."""
_CONTROL_PAUSE = 0.1


class TetherClient:
    """One identity in one tenant, talking to a tether deployment.

    ``timeout`` bounds each request and how long a new turn may find no
    replica to accept it; ``stream_read_timeout`` how long a stream may stay
    silent; ``recovery_timeout`` how long a lost turn may go without a new
    message while the client recovers it.

    ``requester_uuid`` is sent as the ``requester-uuid`` header (a gateway's
    trusted header, ``tether serve --auth headers``); ``token`` as a bearer
    token (``--auth jwt``). ``http`` lets the caller share its own
    ``httpx2.AsyncClient`` (the client then leaves it open); ``transport``
    goes to the one the client makes.
    """

    def __init__(
        self,
        base_url: str | Sequence[str] | Endpoints,
        *,
        tenant: str,
        requester_uuid: str | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        stream_read_timeout: float = DEFAULT_STREAM_READ_TIMEOUT,
        recovery_timeout: float = DEFAULT_RECOVERY_TIMEOUT,
        http: httpx2.AsyncClient | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        if requester_uuid is not None and token is not None:
            raise TypeError("pass requester_uuid (header identity) or token (JWT), not both")
        self.tenant = tenant
        self.endpoints: Endpoints = (
            RotatingEndpoints(base_url) if isinstance(base_url, str | Sequence) else base_url
        )
        self.headers = dict(headers or {})
        if requester_uuid is not None:
            self.headers["requester-uuid"] = requester_uuid
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeouts = Timeouts(
            stream=httpx2.Timeout(timeout, read=stream_read_timeout),
            control=httpx2.Timeout(timeout),
            recovery=recovery_timeout,
            patience=timeout,
        )
        self._owns_http = http is None
        self.http = http or httpx2.AsyncClient(transport=transport, timeout=self.timeouts.control)

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> TetherClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ---------------------------------------------------------------- turns

    def stream(
        self,
        *,
        agent_identifier: str,
        message: str | ChatMessage,
        session_id: str | None = None,
        stateful: bool = True,
        bot_params: dict[str, Any] | None = None,
        conversation_context: dict[str, Any] | None = None,
        multitask_strategy: MultitaskStrategy = "reject",
        observer: TurnObserver | None = None,
    ) -> Turn:
        """Start a turn with the user's ``message`` and follow it to its end.

        Without ``session_id`` the turn starts a new conversation under an id
        the client makes up (``turn.session_id``). Only a stateful turn (the
        default) can be recovered: the server checkpoints it and any replica
        can resume it. Nothing is sent until the first iteration (or
        ``await turn.start()``; ``start_turn`` is both in one call).

        ``multitask_strategy`` says what happens when another turn occupies
        the conversation: ``reject`` raises ``ConversationBusyError``;
        ``enqueue`` queues this one to run after it (``turn.queued``,
        ``turn.queue_position``; its messages come once it starts);
        ``interrupt`` cancels the running turn (its partial answer kept) and
        starts this one; ``rollback`` also removes the interrupted turn from
        the transcript.
        """
        own_session = session_id is None
        session = session_id or uuid.uuid4().hex
        user = (
            message
            if isinstance(message, ChatMessage)
            else ChatMessage.model_validate({"sender": "user", "content": message})
        )
        start = routes.start(
            self.tenant,
            agent_identifier=agent_identifier,
            conversation=[user.model_dump(mode="json", exclude_none=True)],
            session_id=session,
            stateful=stateful,
            bot_params=bot_params,
            conversation_context=conversation_context,
            multitask_strategy=multitask_strategy,
            stream_mode=STREAM_MODE,
        )
        driver = self._driver(
            TurnKnowledge(session_id=session),
            start=start,
            agent_identifier=agent_identifier,
            user_message=user.content,
            own_session=own_session,
            multitask_strategy=multitask_strategy,
            recoverable=stateful,
            observer=observer,
        )
        return Turn(driver, self.cancel)

    async def start_turn(
        self,
        *,
        agent_identifier: str,
        message: str | ChatMessage,
        session_id: str | None = None,
        stateful: bool = True,
        bot_params: dict[str, Any] | None = None,
        conversation_context: dict[str, Any] | None = None,
        multitask_strategy: MultitaskStrategy = "reject",
        observer: TurnObserver | None = None,
    ) -> Turn:
        """``stream(...)`` sent: returns the ``Turn`` once a replica started it or
        queued it (``message_id`` is then known, and ``queue_position`` for a
        queued turn). Refusals (a busy conversation with ``reject``, an unknown
        agent...) raise here. Read it (``async for``, ``answer()``,
        ``events()``) or ``aclose()`` it: it holds a connection."""
        turn = self.stream(
            agent_identifier=agent_identifier,
            message=message,
            session_id=session_id,
            stateful=stateful,
            bot_params=bot_params,
            conversation_context=conversation_context,
            multitask_strategy=multitask_strategy,
            observer=observer,
        )
        try:
            return await turn.start()
        except BaseException:
            await turn.aclose()
            raise

    def follow(
        self,
        session_id: str,
        message_id: str,
        *,
        last_event_id: str | None = None,
        agent_identifier: str | None = None,
        observer: TurnObserver | None = None,
    ) -> Turn:
        """Follow a turn that is already running (or ended): after
        ``last_event_id`` when given, else from the whole answer so far. It
        is recovered like a turn this client started; a resume learns the
        agent from the conversation unless ``agent_identifier`` is given."""
        driver = self._driver(
            TurnKnowledge(
                session_id=session_id, message_id=message_id, last_event_id=last_event_id
            ),
            agent_identifier=agent_identifier,
            observer=observer,
        )
        return Turn(driver, self.cancel)

    def _driver(self, state: TurnKnowledge, **options: Any) -> TurnDriver:
        return TurnDriver(
            http=self.http,
            endpoints=self.endpoints,
            tenant=self.tenant,
            state=state,
            timeouts=self.timeouts,
            headers=self.headers,
            **options,
        )

    async def status(self, session_id: str) -> TurnStatus | None:
        """Which turn occupies the conversation and its verdict (running, done,
        errored, cancelled, dead), and the turns queued after it (``queue``);
        None when the servers know no turn of it."""
        try:
            body = await self._call(routes.status(self.tenant, session_id))
        except NotFoundError:
            return None
        return TurnStatus.from_json(body)

    async def cancel(self, session_id: str | None, message_id: str) -> bool:
        """Cancel turn ``message_id`` of conversation ``session_id``, from any
        replica (the partial answer is kept), or take a queued one out of its
        queue (it never runs). True when this call cancelled it; False when it
        had already ended. The conversation comes first, as in the TypeScript
        client; None leaves it to the server to find the turn by its id."""
        route = routes.cancel(self.tenant, message_id, session_id)
        deadline = time.monotonic() + self.timeouts.recovery
        while True:
            try:
                await self._call(route)
                return True
            except TetherHTTPError as error:
                if error.status_code == 410:
                    return False
                # 409: the turn changed hands (a takeover) as it was cancelled;
                # the next attempt cancels its new producer.
                if error.status_code != 409 or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(_CONTROL_PAUSE)

    # -------------------------------------------------------- conversations

    async def list_conversations(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> ConversationPage:
        """One page of the requester's own conversations, newest first."""
        body = await self._call(routes.list_conversations(self.tenant, limit, cursor))
        return ConversationPage.model_validate(body)

    async def conversations(self, *, page_size: int = 50) -> AsyncIterator[ConversationSummary]:
        """Every one of the requester's conversations, newest first, page by page."""
        cursor: str | None = None
        while True:
            page = await self.list_conversations(limit=page_size, cursor=cursor)
            for summary in page.items:
                yield summary
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get_conversation(self, session_id: str) -> Conversation:
        """The conversation (own, or shared in the tenant) and its transcript."""
        body = await self._call(routes.get_conversation(self.tenant, session_id))
        return Conversation.from_json(body)

    async def share_conversation(self, session_id: str, shared: bool = True) -> ConversationSummary:
        """Share the conversation with the tenant, or make it private again (owner only)."""
        body = await self._call(routes.share_conversation(self.tenant, session_id, shared))
        return ConversationSummary.model_validate(body)

    async def delete_conversation(self, session_id: str) -> None:
        """Delete the conversation and everything it owns (owner only; 409 while
        a turn runs in it)."""
        await self._call(routes.delete_conversation(self.tenant, session_id), lost_ok=404)

    # -------------------------------------------------------------- requests

    async def _call(self, route: routes.Route, *, lost_ok: int | None = None) -> Any:
        """Send ``route`` to the current base URL, moving on to the next one while
        they cannot answer (within the request timeout's budget); the JSON body,
        or None for an empty one. ``lost_ok``: a status that, after an attempt
        whose answer was lost, means that attempt did it (a repeated delete's 404)."""
        deadline = time.monotonic() + self.timeouts.patience
        maybe_done = False
        while True:
            url = self.endpoints.current()
            last: TetherError | httpx2.TransportError | None = None
            if url is not None:
                try:
                    response = await self.http.request(
                        route.method,
                        route.url(url),
                        timeout=self.timeouts.control,
                        **route.options(self.headers),
                    )
                except httpx2.TransportError as failure:
                    last = failure
                    maybe_done = maybe_done or not isinstance(failure, httpx2.ConnectError)
                    self.endpoints.failed(url)
                else:
                    if response.status_code == lost_ok and maybe_done:
                        return None
                    if response.status_code < 300:
                        return response.json() if response.content else None
                    error = error_from_response(
                        response.status_code, response.text, response.headers
                    )
                    if response.status_code not in RETRYABLE_STATUSES:
                        raise error
                    last = error
                    self.endpoints.failed(url)
            if time.monotonic() > deadline:
                if isinstance(last, TetherError):
                    raise last
                raise ConnectionFailedError(
                    f"no replica answered {route.method} {route.path}"
                ) from last
            await asyncio.sleep(_CONTROL_PAUSE)


AsyncTetherClient = TetherClient
"""The old name of ``TetherClient`` (deprecated): ``TetherClient`` is the asyncio
client now, and ``SyncTetherClient`` the blocking one."""
