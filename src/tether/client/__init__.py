"""tether's Python client: turns that recover by themselves, across replicas.

``TetherClient`` (asyncio) and ``SyncTetherClient`` (blocking) start a turn
and yield its cumulative messages; a broken connection, a dead replica or a
turn taken over elsewhere is recovered inside the iteration (status, attach
with ``Last-Event-ID``, resume when the producer is dead), through one
load-balanced URL or a list of replica URLs. Every HTTP error is a typed
exception carrying the server's code (``tether.client.errors``).

The names are the TypeScript client's (``clients/typescript``), in snake_case:
``TetherClient``, ``Turn``, ``TurnStatus``, ``start_turn``, ``cancel(session_id,
message_id)``... (docs/clients/python.md#one-vocabulary). ``AsyncTetherClient``,
``TurnStream``, ``SyncTurnStream`` and ``StreamStatus`` are the old names, kept
as aliases (deprecated). Up to 0.1.0, ``TetherClient`` was the blocking client:
that one is ``SyncTetherClient`` now.
"""

from tether.client.async_client import AsyncTetherClient, TetherClient
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
    TurnStatus,
    TurnUpdate,
)
from tether.client.observer import Connection, TurnObserver
from tether.client.sync_client import SyncTetherClient, SyncTurn, SyncTurnStream
from tether.client.turn import Turn, TurnStream
from tether.client.turn_events import (
    EndReason,
    MessageDropped,
    MessageShown,
    Recovering,
    RecoveryCause,
    StreamFailure,
    StreamOpened,
    TurnEnded,
    TurnEvent,
    TurnKnown,
    TurnQueued,
)
from tether.domain.chat_message import ChatMessage, ContentPart
from tether.domain.chat_message import ContentPartTool as ToolCall
from tether.domain.chat_message import QueuedTurn as QueuedMark
from tether.domain.chat_request import MultitaskStrategy

__all__ = [
    "AsyncTetherClient",
    "AuthenticationError",
    "BadGatewayError",
    "BadRequestError",
    "ChatMessage",
    "ConflictError",
    "Connection",
    "ConnectionFailedError",
    "ContentPart",
    "Conversation",
    "ConversationBusyError",
    "ConversationPage",
    "ConversationSummary",
    "EndReason",
    "Endpoints",
    "GatewayTimeoutError",
    "GoneError",
    "InternalServerError",
    "MessageDropped",
    "MessageShown",
    "MultitaskStrategy",
    "NotFoundError",
    "NotImplementedByServerError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueuedMark",
    "QueuedMessage",
    "Recovering",
    "RecoveryCause",
    "RecoveryError",
    "RotatingEndpoints",
    "ServiceUnavailableError",
    "StreamError",
    "StreamFailure",
    "StreamOpened",
    "StreamStatus",
    "SyncTetherClient",
    "SyncTurn",
    "SyncTurnStream",
    "TetherClient",
    "TetherError",
    "TetherHTTPError",
    "ToolCall",
    "Turn",
    "TurnEnded",
    "TurnEvent",
    "TurnFailedError",
    "TurnKnown",
    "TurnObserver",
    "TurnOutcomeUnknownError",
    "TurnQueued",
    "TurnStatus",
    "TurnStream",
    "TurnUpdate",
    "UnprocessableEntityError",
]
