"""Validation of the ids clients send: tenants, sessions, messages.

Stores escape ids themselves; this is the first line: reject what no honest
client sends (control characters, path separators, absurd lengths) with a
clear 422.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

MAX_ID_LENGTH = 256
# Printable characters only, no whitespace at the ends: no NUL, no newlines.
# No slash or backslash either: an id is one name, never a path (no "../../x").
ID_PATTERN = r"^[^\x00-\x1f\x7f\s/\\](?:[^\x00-\x1f\x7f/\\]*[^\x00-\x1f\x7f\s/\\])?$"

TenantQuery = Annotated[
    str,
    Query(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="Tenant id"),
]
SessionQuery = Annotated[
    str,
    Query(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="Conversation"),
]
OptionalSessionQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="Conversation"),
]
MessageIdPath = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="Turn id")
]
SessionPath = Annotated[
    str,
    Path(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="Conversation"),
]
