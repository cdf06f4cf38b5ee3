"""One answer for every request that fails validation: ``422 INVALID_REQUEST``.

FastAPI's default echoes the client's input back (``{"detail": [{"input": ...}]}``),
up to a whole oversized field, and cannot even encode that echo when the input
holds a lone surrogate, so the client got a plain-text 500. This handler
answers tether's ``{"code", "message"}`` shape instead, with the ``field`` that
failed, and never the value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tether.api.forms import UNSAFE_TEXT
from tether.domain.safe_text import shown_path

logger = logging.getLogger(__name__)

CODE = "INVALID_REQUEST"


def invalid_request(field: str, message: str) -> RequestValidationError:
    """A refusal raised by a route's own strict parsing (a header, a cursor),
    answered by the same handler as the models' refusals."""
    return RequestValidationError(
        [{"type": "value_error", "loc": tuple(field.split(".")), "msg": message}]
    )


def describe(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The field and message of the first error, printable, without the input."""
    if not errors:
        return "request", "the request is not valid"
    first = errors[0]
    field = shown_path(tuple(first.get("loc", ())))
    context = first.get("ctx") or {}
    if first.get("type") == UNSAFE_TEXT:
        path = context.get("path") or ""
        field = f"{field}.{path}" if path else field
        message = f"{field} {context.get('reason')}"
    else:
        message = f"{field}: {first.get('msg', 'is not valid')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    # Pydantic's messages name our expectations, not the input; still, nothing
    # that cannot be encoded may reach the response.
    message = message.encode("utf-8", "replace").decode("utf-8")
    return field or "request", message


async def validation_error(request: Request, error: Exception) -> JSONResponse:
    """The exception handler for ``RequestValidationError``."""
    assert isinstance(error, RequestValidationError)
    field, message = describe(error.errors())
    logger.info("refused %s %s: %s", request.method, request.url.path, message)
    return JSONResponse(
        {"code": CODE, "message": message, "field": field, "detail": message},
        status_code=422,
    )
