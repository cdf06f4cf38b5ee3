"""How values cross into SQLite and back: ids as bytes, documents as JSON, loud corruption."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tether.domain.store_errors import StoreCorruptedError

_M = TypeVar("_M", bound=BaseModel)

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def key(value: str | None) -> bytes:
    """An id as the BLOB it is stored and compared as; a missing id is ``""``.

    UTF-8 with ``surrogatepass`` is injective for every Python str (NUL bytes and
    lone surrogates from a JSON request included), where binding a str as TEXT
    would fail on a lone surrogate. Byte order of UTF-8 is code point order, so
    SQL sorts ids the way Python sorts strings.
    """
    return (value or "").encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class RowKey:
    """The ids addressing one row of the state, supervision or recording table."""

    tenant: str
    user: str | None
    session: str

    def params(self) -> dict[str, bytes]:
        """The ids as the ``:tenant``, ``:user`` and ``:session`` parameters."""
        return {"tenant": key(self.tenant), "user": key(self.user), "session": key(self.session)}

    def describe(self, table: str) -> str:
        """The row, for an error message."""
        return (
            f"the {table} row of tenant {shown(self.tenant)}, user {shown(self.user or '')}, "
            f"session {shown(self.session)}"
        )


def text(blob: object, what: str) -> str:
    """A stored id back as str; anything but valid bytes is corruption."""
    if not isinstance(blob, bytes):
        raise StoreCorruptedError(f"{what} holds a {type(blob).__name__}, not an id; left as is")
    try:
        return blob.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise StoreCorruptedError(f"{what} holds an id that is not UTF-8; left as is") from exc


def dump(document: Any) -> str:
    """``document`` as compact, ASCII-only JSON (lone surrogates survive as escapes)."""
    return json.dumps(document, separators=(",", ":"))


def dump_model(model: BaseModel) -> str:
    """A model as JSON text. Through ``json`` rather than pydantic's serializer,
    which refuses lone surrogates that ``json`` escapes and reads back."""
    return dump(model.model_dump(mode="json"))


def load(raw: object, what: str) -> Any:
    """The JSON document ``raw``; an empty, non-text or unparsable value raises
    ``StoreCorruptedError`` naming ``what``, never reads as empty."""
    if not isinstance(raw, str):
        raise StoreCorruptedError(f"{what} holds a {type(raw).__name__}, not JSON; left as is")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StoreCorruptedError(f"{what} is not valid JSON ({exc}); left as is") from exc


def validate(model: type[_M], document: Any, what: str) -> _M:
    """``document`` as ``model``; a document of the wrong shape is corruption."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise StoreCorruptedError(
            f"{what} does not hold a valid {model.__name__} ({exc}); left as is"
        ) from exc


def load_model(model: type[_M], raw: object, what: str) -> _M:
    """The JSON text ``raw`` validated as ``model``."""
    return validate(model, load(raw, what), what)


def microseconds(moment: datetime) -> int:
    """An aware datetime as exact integer microseconds since 1970, for SQL ordering."""
    return (moment - _UNIX_EPOCH) // _MICROSECOND


def shown(value: str) -> str:
    """An id short enough for an error message (ids may be 10,000 characters)."""
    return repr(value if len(value) <= 80 else f"{value[:80]}...")
