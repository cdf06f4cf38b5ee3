"""The four stores a server runs with, as one value (``StoreBundle``).

Each backend builds one from its URL (``stores_from_url``), and
``tether.stores`` chooses the backend: the bundle sits below both, so a
backend never imports the module that imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from tether.domain.capabilities import StoreCapabilities, capabilities
from tether.domain.chat_agent_state_store import ChatAgentStateStore
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_stream_recording_store import ChatStreamRecordingStore
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore

STORE_NAMES = ("state", "recording", "supervision", "conversation")


class StoreURLError(ValueError):
    """A store URL that names no known backend or cannot be used."""


@dataclass(frozen=True)
class StoreBundle:
    """The four stores a server runs with; any of them may be None (layer off)."""

    agent_state_store: ChatAgentStateStore | None = None
    chat_stream_recording_store: ChatStreamRecordingStore | None = None
    chat_stream_supervision_store: ChatStreamSupervisionStore | None = None
    chat_conversation_store: ChatConversationStore | None = None

    def setup_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``setup_app``."""
        return {
            "agent_state_store": self.agent_state_store,
            "chat_stream_recording_store": self.chat_stream_recording_store,
            "chat_stream_supervision_store": self.chat_stream_supervision_store,
            "chat_conversation_store": self.chat_conversation_store,
        }

    def capabilities(self) -> dict[str, StoreCapabilities]:
        """What each store declares (``tether.domain.capabilities``), by its name
        in ``STORE_NAMES``; a store left out declares nothing."""
        held = (
            self.agent_state_store,
            self.chat_stream_recording_store,
            self.chat_stream_supervision_store,
            self.chat_conversation_store,
        )
        return {name: capabilities(store) for name, store in zip(STORE_NAMES, held, strict=True)}

    def without(self, names: Iterable[str]) -> StoreBundle:
        """The same bundle with the named stores (see ``STORE_NAMES``) left out."""
        fields = {
            "state": "agent_state_store",
            "recording": "chat_stream_recording_store",
            "supervision": "chat_stream_supervision_store",
            "conversation": "chat_conversation_store",
        }
        dropped: dict[str, None] = {}
        for name in names:
            if name not in fields:
                raise StoreURLError(f"unknown store {name!r}; the stores are {', '.join(fields)}")
            dropped[fields[name]] = None
        return replace(self, **dropped)
