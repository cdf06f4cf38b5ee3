"""What the client raises: one class per HTTP status the API answers, and the
ways a streamed turn can end badly.

Every HTTP refusal carries the server's own ``code`` (``CONVERSATION_BUSY``,
``UNKNOWN_AGENT``, ``TENANT_NOT_ALLOWED``...), its ``message`` and the parsed
body, so a caller can branch on the class (``except ConversationBusyError``)
or on the code. ``error_from_response`` is the one place a status becomes a
class; a status without a class of its own is a plain ``TetherHTTPError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class TetherError(Exception):
    """Anything the tether client raises."""


class ConnectionFailedError(TetherError):
    """No base URL answered at all (refused, reset, timed out) within the bound;
    ``__cause__`` is the last transport error."""


class TetherHTTPError(TetherError):
    """The server (or a proxy in front of it) answered with an error status."""

    status_code: int = 0

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"HTTP {status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.body = body
        self.headers = dict(headers or {})

    @property
    def retry_after(self) -> float | None:
        """Seconds the server asked to wait (``Retry-After``), if it said."""
        value = self.headers.get("retry-after")
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None


class BadRequestError(TetherHTTPError):
    """400: a request the server will not run (``AGENTS_STORAGE_NOT_CONFIGURED``,
    ``BOT_PARAMS_REJECTED``, ``INVALID_IDENTITY``, ``BAD_REQUEST``)."""


class AuthenticationError(TetherHTTPError):
    """401: no token, or one that does not verify (``UNAUTHENTICATED``)."""


class PermissionDeniedError(TetherHTTPError):
    """403: not the conversation's owner (``CONVERSATION_NOT_OWNED``) or a tenant
    the identity does not name (``TENANT_NOT_ALLOWED``)."""


class NotFoundError(TetherHTTPError):
    """404: no such agent (``UNKNOWN_AGENT``), turn or conversation (``TURN_NOT_FOUND``)."""


class ConflictError(TetherHTTPError):
    """409: the request conflicts with the conversation's current state."""


class ConversationBusyError(ConflictError):
    """409 ``CONVERSATION_BUSY``: another turn occupies the conversation.

    ``occupant`` is that turn's message id: attach to it
    (``client.follow(session_id=..., message_id=error.occupant)``) or cancel it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        body = self.body if isinstance(self.body, dict) else {}
        detail = body.get("detail")
        detail = detail if isinstance(detail, dict) else {}
        self.occupant: str | None = detail.get("message_id") or body.get("message_id")
        self.session_id: str | None = detail.get("session_id")


class GoneError(TetherHTTPError):
    """410 ``TURN_GONE``: the turn has ended, or a newer turn replaced it."""


class PayloadTooLargeError(TetherHTTPError):
    """413 ``BODY_TOO_LARGE``."""


class UnprocessableEntityError(TetherHTTPError):
    """422: the body or a parameter is invalid; ``message`` names the fields."""


class InternalServerError(TetherHTTPError):
    """500: the server failed (``INTERNAL``, ``STORE_ERROR``); its log has the rest."""


class NotImplementedByServerError(TetherHTTPError):
    """501 ``NOT_IMPLEMENTED_BY_STORE``: the server's stores cannot do this
    (listing conversations on a store that keeps none)."""


class BadGatewayError(TetherHTTPError):
    """502: a proxy in front of the servers got no valid answer from one."""


class ServiceUnavailableError(TetherHTTPError):
    """503: a replica that is draining (``DRAINING``), a store that cannot be
    reached (``STORE_UNAVAILABLE``), or a proxy with no server to send to.
    Worth retrying, elsewhere or after ``retry_after``."""


class GatewayTimeoutError(TetherHTTPError):
    """504: a proxy in front of the servers gave up waiting for one."""


_BY_STATUS: dict[int, type[TetherHTTPError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    500: InternalServerError,
    501: NotImplementedByServerError,
    502: BadGatewayError,
    503: ServiceUnavailableError,
    504: GatewayTimeoutError,
}


def error_from_response(
    status_code: int, text: str, headers: Mapping[str, str] | None = None
) -> TetherHTTPError:
    """The typed error for an error response, from either body shape the server
    uses (``{"code", "message"}``, or FastAPI's ``{"detail": [...]}`` for a 422)
    or from a proxy's HTML page."""
    body: Any
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    code, message = _code_and_message(status_code, body, text)
    cls = _BY_STATUS.get(status_code, TetherHTTPError)
    if status_code == 409 and code == "CONVERSATION_BUSY":
        cls = ConversationBusyError
    lowered = {key.lower(): value for key, value in (headers or {}).items()}
    return cls(status_code, code, message, body=body if body is not None else text, headers=lowered)


def _code_and_message(status_code: int, body: Any, text: str) -> tuple[str, str]:
    if isinstance(body, dict):
        detail = body.get("detail")
        if "code" in body:
            return str(body["code"]), str(body.get("message") or detail or "")
        if isinstance(detail, list):
            # FastAPI's 422: one entry per invalid field.
            problems = [
                f"{'.'.join(str(p) for p in item.get('loc', []))}: {item.get('msg', item)}"
                if isinstance(item, dict)
                else str(item)
                for item in detail
            ]
            return "VALIDATION_ERROR", "; ".join(problems)
        if detail is not None:
            return f"HTTP_{status_code}", str(detail)
    # Not ours: a proxy's error page, or an empty body.
    first_line = text.strip().splitlines()[0][:200] if text.strip() else ""
    return f"HTTP_{status_code}", first_line


class StreamError(TetherError):
    """A streamed turn could not be read to its end."""


class TurnFailedError(StreamError):
    """The turn ended ``errored``: the server's ``event: error`` said why
    (``code`` such as ``INTERNAL``, ``TURN_TIMEOUT``, ``TAKEOVER_LIMIT``)."""

    def __init__(self, code: str, message: str, *, message_id: str | None = None) -> None:
        super().__init__(f"the turn failed: {code}: {message}")
        self.code = code
        self.message = message
        self.message_id = message_id


class RecoveryError(StreamError):
    """The client lost its turn's stream and could not get it back: no replica
    answered within the recovery bound, or the turn is no longer known."""

    def __init__(self, message: str, *, message_id: str | None = None) -> None:
        super().__init__(message)
        self.message_id = message_id


class TurnOutcomeUnknownError(StreamError):
    """A new turn's request was lost on the way and the conversation's current
    turn cannot be told to be this client's: it may or may not have started."""
