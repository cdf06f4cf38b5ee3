"""Who is asking: identity headers set by a trusted gateway.

With an authenticator configured (a later setting), identity comes from the
verified token instead and these headers are ignored.
"""

from __future__ import annotations

from fastapi import Request

from tether.domain.chat_request import RequestHeaders


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def request_identity(request: Request) -> RequestHeaders:
    headers = request.headers
    return RequestHeaders(
        requester_uuid=headers.get("requester-uuid"),
        user_roles=_split(headers.get("user-roles")),
        user_tenants=_split(headers.get("user-tenants")),
        authorization=headers.get("authorization"),
    )
