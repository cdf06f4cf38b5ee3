"""Every request gets an id: the ``x-request-id`` a gateway set, or a new one.

asgi-correlation-id does the work: it reads or generates the id, keeps it in a
contextvar for the request's lines (``ContextFilter`` adds it to each) and
echoes it in the response's ``x-request-id``. Tasks a request starts (a
turn's producer) inherit the contextvar, so their lines carry it too.
"""

from __future__ import annotations

import re

from asgi_correlation_id import CorrelationIdMiddleware
from fastapi import FastAPI

__all__ = ["REQUEST_ID_HEADER", "install_request_ids", "is_acceptable_request_id"]

REQUEST_ID_HEADER = "x-request-id"
# Gateways write ids of their own shapes (HAProxy's unique-id, an nginx
# $request_id, a UUID), so any short token is taken as it is; anything else (a
# header that could forge a log line, or bloat every line) is replaced.
_ACCEPTABLE = re.compile(r"[A-Za-z0-9._:+/=-]{1,128}")


def is_acceptable_request_id(value: str) -> bool:
    """Whether a request's own ``x-request-id`` is used as it is."""
    return _ACCEPTABLE.fullmatch(value) is not None


def install_request_ids(app: FastAPI) -> None:
    """Give every request of ``app`` an id (the outermost middleware added
    so far: add it last, so every other middleware's lines carry it)."""
    app.add_middleware(
        CorrelationIdMiddleware,
        header_name=REQUEST_ID_HEADER,
        validator=is_acceptable_request_id,
    )
