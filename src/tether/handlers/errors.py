"""Why a turn cannot start (or be attached to, resumed, cancelled), as the client hears it.

Each error carries its HTTP status and a stable code; the API answers them
before any stream starts, so a client never gets a 201 for a turn that failed
a check.
"""

from __future__ import annotations

from typing import Any


class TurnRequestError(Exception):
    status_code = 400
    code = "BAD_REQUEST"

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "detail": self.message, **self.extra}

    def headers(self) -> dict[str, str]:
        """Headers the refusal carries besides its body."""
        return {}


class UnknownAgentError(TurnRequestError):
    status_code = 404
    code = "UNKNOWN_AGENT"


class StorageNotConfiguredError(TurnRequestError):
    status_code = 400
    code = "AGENTS_STORAGE_NOT_CONFIGURED"


class BotParamsError(TurnRequestError):
    status_code = 400
    code = "BOT_PARAMS_REJECTED"


class NotOwnerError(TurnRequestError):
    status_code = 403
    code = "CONVERSATION_NOT_OWNED"


class ConversationBusyError(TurnRequestError):
    """409: a turn occupies the conversation (a new turn, a resume of a live
    turn, a cancel racing a takeover, a delete while a turn runs).

    The body names the occupant the way the seed's SDK clients read it,
    ``{"detail": {"session_id": S, "message_id": M}}``, with ``code``,
    ``message`` and a top-level ``message_id`` beside it for older clients."""

    status_code = 409
    code = "CONVERSATION_BUSY"

    def __init__(self, message: str, *, message_id: str, session_id: str | None) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.session_id = session_id

    def body(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "detail": {"session_id": self.session_id, "message_id": self.message_id},
            "message_id": self.message_id,
        }


class TurnNotFoundError(TurnRequestError):
    status_code = 404
    code = "TURN_NOT_FOUND"


class TurnEndedError(TurnRequestError):
    """410: the turn has ended (or was cleaned up, or replaced by a newer one).

    The wire code stays ``TURN_GONE`` (clients match on it); in the code "gone"
    means only the stream verdict: another producer owns the turn now."""

    status_code = 410
    code = "TURN_GONE"


class NotImplementedByStoreError(TurnRequestError):
    status_code = 501
    code = "NOT_IMPLEMENTED_BY_STORE"


class DrainingError(TurnRequestError):
    status_code = 503
    code = "DRAINING"


class _LimitError(TurnRequestError):
    """429: a fair limit (``handlers.limits``) refuses the request for now;
    ``Retry-After`` says when to try again."""

    status_code = 429

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "detail": self.message,
            "retry_after": self.retry_after,
        }

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class TooManyTurnsError(_LimitError):
    """The requester, or its tenant, runs as many turns as it may at once."""

    code = "TOO_MANY_TURNS"


class QueueFullError(_LimitError):
    """The conversation's queue holds as many messages as it may."""

    code = "QUEUE_FULL"
