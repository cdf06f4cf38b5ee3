"""tether's Python client: turns that recover by themselves, across replicas.

``TetherClient`` (blocking) and ``AsyncTetherClient`` (asyncio) start a turn
and yield its cumulative messages; a broken connection, a dead replica or a
turn taken over elsewhere is recovered inside the iteration (status, attach
with ``Last-Event-ID``, resume when the producer is dead), through one
load-balanced URL or a list of replica URLs. Every HTTP error is a typed
exception carrying the server's code (``tether.client.errors``).
"""

from tether.client.async_client import AsyncTetherClient
from tether.client.endpoints import Endpoints, RotatingEndpoints
from tether.client.errors import (
    AuthenticationError,
    BadGatewayError,
    BadRequestError,
    ConflictError,
    ConnectionFailedError,
    ConversationBusyError,
    GatewayTimeoutError,
    GoneError,
    InternalServerError,
    NotFoundError,
    NotImplementedByServerError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RecoveryError,
    ServiceUnavailableError,
    StreamError,
    TetherError,
    TetherHTTPError,
    TurnFailedError,
    TurnOutcomeUnknownError,
    UnprocessableEntityError,
)
from tether.client.models import (
    Conversation,
    ConversationPage,
    ConversationSummary,
    QueuedMessage,
    StreamStatus,
    TurnUpdate,
)
from tether.client.observer import Connection, TurnObserver
from tether.client.sync_client import SyncTurnStream, TetherClient
from tether.client.turn import TurnStream

__all__ = [
    "AsyncTetherClient",
    "AuthenticationError",
    "BadGatewayError",
    "BadRequestError",
    "ConflictError",
    "Connection",
    "ConnectionFailedError",
    "Conversation",
    "ConversationBusyError",
    "ConversationPage",
    "ConversationSummary",
    "Endpoints",
    "GatewayTimeoutError",
    "GoneError",
    "InternalServerError",
    "NotFoundError",
    "NotImplementedByServerError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueuedMessage",
    "RecoveryError",
    "RotatingEndpoints",
    "ServiceUnavailableError",
    "StreamError",
    "StreamStatus",
    "SyncTurnStream",
    "TetherClient",
    "TetherError",
    "TetherHTTPError",
    "TurnFailedError",
    "TurnObserver",
    "TurnOutcomeUnknownError",
    "TurnStream",
    "TurnUpdate",
    "UnprocessableEntityError",
]
