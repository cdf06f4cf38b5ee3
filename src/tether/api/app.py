"""``setup_app``: the FastAPI application, wired with whichever stores are given."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.api.auth import AuthenticationError, Authenticator, HeaderAuthenticator
from tether.api.body_limit import BodySizeLimitMiddleware
from tether.api.body_timeout import BodyTimeoutMiddleware
from tether.api.header_limit import HeaderSizeLimitMiddleware
from tether.api.identity import AUTH_RESPONSES, AUTHENTICATED
from tether.api.routers import ai_sdk, chat, conversations, metrics, probes, web
from tether.api.signal_drain import SignalDrain
from tether.api.validation_errors import validation_error
from tether.domain.agent_registries import AgentRegistriesFactory
from tether.domain.chat_agent_state_store import ChatAgentStateStore
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_stream_recording_store import ChatStreamRecordingStore
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore
from tether.domain.message_bus import MessageBus
from tether.domain.store_errors import StoreError, StoreUnavailableError
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import TurnRequestError
from tether.handlers.retention import RetentionOff, retention_runner
from tether.observability.http_metrics import HTTPMetricsMiddleware
from tether.observability.logs import ensure_logging
from tether.observability.request_ids import install_request_ids
from tether.observability.tracing_setup import tracing_from_env
from tether.runtime.clock import ReplicaClock
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings, settings_from_env

logger = logging.getLogger(__name__)

STORE_RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of a 503 STORE_UNAVAILABLE: about one heartbeat."""
_STATUSES = {status.value for status in HTTPStatus}


def setup_app(
    agent_registries_factory: AgentRegistriesFactory,
    agent_state_store: ChatAgentStateStore | None = None,
    chat_stream_recording_store: ChatStreamRecordingStore | None = None,
    chat_stream_supervision_store: ChatStreamSupervisionStore | None = None,
    chat_conversation_store: ChatConversationStore | None = None,
    mcp_oauth_store: Any | None = None,
    mcp_oauth_token_client: Any | None = None,
    *,
    settings: TetherSettings | None = None,
    message_bus: MessageBus | None = None,
    clock: Callable[[], datetime] | None = None,
    title: str = "tether",
    authenticator: Authenticator | None = None,
) -> FastAPI:
    """Build the API server. Every store is optional and unlocks its own layer:

    - ``agent_state_store``: stateful turns and resume after a producer dies;
    - ``chat_stream_recording_store``: attach from any replica, second screens;
    - ``chat_stream_supervision_store``: status, the 409 mutex, dead-producer
      verdicts, fencing;
    - ``chat_conversation_store``: durable, listable transcripts;
    - ``mcp_oauth_store`` with ``mcp_oauth_token_client``: MCP servers that need
      the user's OAuth authorization.

    ``authenticator`` says who is asking (default: ``HeaderAuthenticator``, the
    identity headers a trusted gateway sets; ``JWTAuthenticator`` verifies a
    bearer token instead). Every chat and conversation route goes through it;
    the probes and the API docs do not.

    With ``settings.retention`` the app also prunes old conversations while it
    runs, one replica at a time (``tether.handlers.retention``); it says at
    start-up why not when its stores cannot.

    ``clock`` is the replica's "now" for heartbeats and liveness. By default it
    is the supervision store's clock where the store has one
    (``tether.runtime.clock.ReplicaClock``); a clock given here is used as it
    is (tests move time by hand), and ``settings.clock_skew`` does not apply.
    """
    # Without settings, the TETHER_* environment applies, as under `tether serve`:
    # `uvicorn app:app` on the seed's wiring is configured the same way.
    settings = settings or settings_from_env()
    # Under `tether serve` logging is configured already; under `uvicorn app:app`
    # nothing configured tether's loggers, and its lines would be dropped.
    ensure_logging()
    # OpenTelemetry only with an OTLP endpoint in the environment (and the extra).
    tracing = tracing_from_env()
    bus = message_bus or MessageBus()
    stores = TurnStores(
        agent_state=agent_state_store,
        recording=chat_stream_recording_store,
        supervision=chat_stream_supervision_store,
        conversation=chat_conversation_store,
    )
    replica_clock: ReplicaClock | None = None
    if clock is None:
        clock = replica_clock = ReplicaClock.of_store(stores.supervision, skew=settings.clock_skew)
    handler = ChatHandler(agent_registries_factory, stores, settings, bus, clock)
    handler.tracing = tracing
    retention = retention_runner(
        stores, settings, clock=clock, end_dead=handler.endings.end_erased_turn
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opened = await _open_stores(stores, mcp_oauth_store)
        if replica_clock is not None:
            await replica_clock.start()
        await handler.start()
        if isinstance(retention, RetentionOff):
            # Unset is the default and says nothing new; set but impossible is
            # a misconfiguration the operator should see.
            level = logging.INFO if settings.retention is None else logging.WARNING
            logger.log(level, "retention is off: %s", retention.reason)
        else:
            logger.info(
                "retention is on: conversations not updated for %s are erased, "
                "every %s s, by one replica at a time (a lease in the supervision store)",
                retention.older_than,
                retention.interval.total_seconds(),
            )
            retention.start()
        # SIGTERM drains from here, under whichever server took the signal.
        signals = SignalDrain(handler.drain, settings.drain_timeout)
        signals.install()
        try:
            yield
        finally:
            signals.uninstall()
            if not isinstance(retention, RetentionOff):
                await retention.aclose()
            await handler.shutdown()
            # After the turns' ends: their last spans are exported too.
            tracing.shutdown()
            if replica_clock is not None:
                await replica_clock.aclose()
            for store in reversed(opened):
                try:
                    await store.aclose()
                except Exception:
                    logger.warning("closing %r failed", store, exc_info=True)
            signals.closed()

    telemetry = tracing.fastapi_telemetry()
    if telemetry is None:
        app = FastAPI(title=title, lifespan=lifespan)
    else:
        # FastAPI's own instrumentation: a server span per request, continuing
        # an incoming traceparent, on this app's tracer provider.
        app = FastAPI(title=title, lifespan=lifespan, telemetry=telemetry)  # type: ignore[arg-type]
    app.state.chat_handler = handler
    app.state.clock = clock
    app.state.settings = settings
    app.state.message_bus = bus
    app.state.stores = stores
    app.state.retention = retention
    app.state.mcp_oauth_store = mcp_oauth_store
    app.state.mcp_oauth_token_client = mcp_oauth_token_client
    app.state.authenticator = authenticator or HeaderAuthenticator()
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(HTTPMetricsMiddleware, histogram=handler.metrics.http_request_seconds)
    app.add_middleware(BodyTimeoutMiddleware, timeout=settings.body_timeout)
    app.add_middleware(HeaderSizeLimitMiddleware, max_bytes=settings.max_header_bytes)

    app.add_exception_handler(RequestValidationError, validation_error)
    # Last, so outermost: every line of the request's handling carries its id.
    install_request_ids(app)

    @app.exception_handler(TurnRequestError)
    async def turn_request_error(request: Request, error: TurnRequestError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers())

    @app.exception_handler(StoreError)
    async def store_error(request: Request, error: StoreError) -> JSONResponse:
        # A store that fails before a stream exists is an HTTP status with a
        # code, never a traceback: unreachable (an outage, a lock held by a
        # paused peer) is worth retrying; anything else is for an operator.
        if isinstance(error, StoreUnavailableError):
            logger.warning("store unavailable: %s", error)
            message = "a store is unavailable right now; retry shortly"
            return JSONResponse(
                {"code": "STORE_UNAVAILABLE", "message": message, "detail": message},
                status_code=503,
                headers={"Retry-After": str(STORE_RETRY_AFTER_SECONDS)},
            )
        logger.error("store error: %s", error, exc_info=error)
        message = "a store failed; the operator's logs say which"
        return JSONResponse(
            {"code": "STORE_ERROR", "message": message, "detail": message}, status_code=500
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body that is not UTF-8 is "error parsing the
        # body", 400) get the same {"code", "message"} shape as ours, which is
        # what the schema promises for every 4xx; ``detail`` stays for old clients.
        code = HTTPStatus(error.status_code).name if error.status_code in _STATUSES else "ERROR"
        message = str(error.detail)
        return JSONResponse(
            {"code": code, "message": message, "detail": message},
            status_code=error.status_code,
            headers=error.headers,
        )

    @app.exception_handler(AuthenticationError)
    async def authentication_error(request: Request, error: AuthenticationError) -> JSONResponse:
        # RFC 7235: a 401 names the scheme that would be accepted.
        return JSONResponse(
            error.body(),
            status_code=error.status_code,
            headers={"WWW-Authenticate": error.challenge},
        )

    app.include_router(chat.router, dependencies=AUTHENTICATED, responses=AUTH_RESPONSES)
    app.include_router(conversations.router, dependencies=AUTHENTICATED, responses=AUTH_RESPONSES)
    app.include_router(ai_sdk.router, dependencies=AUTHENTICATED, responses=AUTH_RESPONSES)
    app.include_router(probes.router)
    app.include_router(metrics.router)
    app.include_router(web.router)
    return app


async def _open_stores(stores: TurnStores, *extra: Any) -> list[Any]:
    """Connect every store that needs it (pools, listeners) once, at start-up.

    One backend object may serve several stores; it is opened once. A store
    that cannot be reached fails start-up here, with its own message naming
    the URL, instead of failing the first request.
    """
    distinct: dict[int, Any] = {}
    for store in (stores.agent_state, stores.recording, stores.supervision, stores.conversation):
        if store is not None:
            distinct.setdefault(id(store), store)
    for store in extra:
        if store is not None:
            distinct.setdefault(id(store), store)
    opened: list[Any] = []
    for store in distinct.values():
        open_ = getattr(store, "open", None)
        if open_ is not None:
            await open_()
        if getattr(store, "aclose", None) is not None:
            opened.append(store)
    return opened
