"""Choose every store from one URL: ``tether.stores.from_url("file://.tether")``.

One place decides which backend serves which store, for ``tether serve
--store URL`` and for code that calls ``setup_app(**bundle.setup_kwargs())``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, replace
from types import ModuleType
from urllib.parse import urlsplit

from tether.domain.store_bundle import STORE_NAMES, StoreBundle, StoreURLError

__all__ = [
    "STORE_NAMES",
    "MissingDriverError",
    "StoreBundle",
    "StoreURLError",
    "compose",
    "from_url",
    "import_backend",
]


class MissingDriverError(StoreURLError):
    """A store URL whose backend's driver is not installed: the message names
    the extra that installs it, in one line a CLI can print as it is."""

    def __init__(self, scheme: str) -> None:
        backend = _BACKENDS[scheme]
        super().__init__(
            f"{scheme}:// stores need the {backend.driver} driver, which is not installed: "
            f"pip install 'tether[{backend.extra}]'"
        )
        self.scheme = scheme
        self.extra = backend.extra


@dataclass(frozen=True)
class _Backend:
    module: str
    """Whose ``stores_from_url(url) -> StoreBundle`` serves the scheme; imported
    only when used, so a missing driver breaks only its own backend."""
    driver: str
    """What a user reads the backend needs (the driver's own name)."""
    extra: str
    """The optional dependency of tether's that installs the driver."""


_SQLITE = _Backend("tether.adapters.sqlite", "sqlite3", "")
_POSTGRES = _Backend("tether.adapters.postgres", "PostgreSQL (psycopg)", "postgres")
_REDIS = _Backend("tether.adapters.redis", "Redis (redis-py)", "redis")
_BACKENDS = {
    "sqlite": _SQLITE,
    "postgresql": _POSTGRES,
    "postgres": _POSTGRES,
    "redis": _REDIS,
    "rediss": _REDIS,
}


def from_url(url: str) -> StoreBundle:
    """Every store a backend can serve, for ``url``.

    - ``file://DIR`` (relative or absolute): file-backed stores under DIR, correct
      for any number of processes sharing the directory.
    - ``memory://``: in-memory stores, for one process (tests, demos).
    - ``sqlite:///PATH``, ``postgresql://...``, ``redis://...``: see each backend.

    Nothing is connected yet: ``setup_app`` opens every store that has an
    ``open()`` when the server starts (an unreachable URL fails start-up there),
    and closes it on shutdown.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        return _file_stores(parts.netloc + parts.path)
    if parts.scheme == "memory":
        return _memory_stores()
    if parts.scheme not in _BACKENDS:
        known = ", ".join(["file", "memory", *sorted(set(_BACKENDS))])
        raise StoreURLError(f"store URL {url!r}: unknown scheme {parts.scheme!r} (known: {known})")
    bundle: StoreBundle = import_backend(parts.scheme).stores_from_url(url)
    return bundle


def import_backend(scheme: str) -> ModuleType:
    """The backend module serving ``scheme``; ``MissingDriverError`` when its
    driver is not installed (the usual case after a bare ``pip install tether``)."""
    backend = _BACKENDS[scheme]
    try:
        return importlib.import_module(backend.module)
    except ModuleNotFoundError as error:
        # Only a missing third-party driver is the user's to install; a module
        # of tether's own that fails to import is a bug, and keeps its traceback.
        if backend.extra and not (error.name or "").startswith("tether"):
            raise MissingDriverError(scheme) from error
        raise


def _file_stores(directory: str) -> StoreBundle:
    from tether.adapters.file import (
        LocalFileChatAgentStateStore,
        LocalFileChatConversationStore,
        LocalFileChatStreamRecordingStore,
        LocalFileChatStreamSupervisionStore,
    )

    if not directory:
        raise StoreURLError("file:// store URL needs a directory, as in file://.tether")
    base = os.path.abspath(directory)
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as error:
        raise StoreURLError(f"store URL file://{directory}: cannot use {base}: {error}") from error
    return StoreBundle(
        agent_state_store=LocalFileChatAgentStateStore(base_path=os.path.join(base, "state")),
        chat_stream_recording_store=LocalFileChatStreamRecordingStore(
            base_path=os.path.join(base, "recording")
        ),
        chat_stream_supervision_store=LocalFileChatStreamSupervisionStore(
            base_path=os.path.join(base, "supervision")
        ),
        chat_conversation_store=LocalFileChatConversationStore(
            base_path=os.path.join(base, "conversations")
        ),
    )


def _memory_stores() -> StoreBundle:
    from tether.adapters.memory import (
        InMemoryChangeChannel,
        InMemoryChatAgentStateStore,
        InMemoryChatConversationStore,
        InMemoryChatStreamRecordingStore,
        InMemoryChatStreamSupervisionStore,
    )

    # One channel: followers and producers hear puts and epoch changes at once.
    channel = InMemoryChangeChannel()
    return StoreBundle(
        agent_state_store=InMemoryChatAgentStateStore(),
        chat_stream_recording_store=InMemoryChatStreamRecordingStore(channel),
        chat_stream_supervision_store=InMemoryChatStreamSupervisionStore(channel),
        chat_conversation_store=InMemoryChatConversationStore(),
    )


def compose(
    url: str,
    *,
    stream: str | None = None,
    state: str | None = None,
    conversation: str | None = None,
) -> StoreBundle:
    """The stores of ``url``, with per-store overrides taken from other URLs.

    ``stream`` serves the recording and supervision stores (they belong
    together: followers wake on the same backend that fences producers). A
    store the main backend lacks (Redis has no conversation store) stays None
    unless an override provides it.
    """
    bundle = from_url(url)
    if stream is not None:
        streams = from_url(stream)
        bundle = replace(
            bundle,
            chat_stream_recording_store=streams.chat_stream_recording_store,
            chat_stream_supervision_store=streams.chat_stream_supervision_store,
        )
    if state is not None:
        bundle = replace(bundle, agent_state_store=from_url(state).agent_state_store)
    if conversation is not None:
        chosen = from_url(conversation).chat_conversation_store
        if chosen is None:
            raise StoreURLError(f"store URL {conversation!r} has no conversation store")
        bundle = replace(bundle, chat_conversation_store=chosen)
    return bundle
