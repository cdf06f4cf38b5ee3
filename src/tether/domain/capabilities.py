"""Which optional methods each store implements, decided once and asked in one place.

Every store port (``ChatAgentStateStore``, ``ChatConversationStore``,
``ChatStreamRecordingStore``, ``ChatStreamSupervisionStore``) has required
methods (abstract: the seed's interface) and optional ones with a default: a
weaker fallback (``save_fenced`` checks before it writes), nothing
(``fence``, ``publish_deltas``) or ``NotImplementedError``
(``list_stale_running``, ``server_time``). A store *declares* a capability by
overriding that method; the runtime asks ``supports(store, capability)``
before it relies on one, instead of calling and catching
``NotImplementedError`` or comparing methods itself, so a store without it
is told apart in the same way everywhere (a warning at start-up, a 501, a
fallback).

The answer depends only on the store's class, so it is decided once per
class (and so once per store object) and cached. A store object may still
refuse what its class declares where the port documents it: a Redis or
PostgreSQL supervision store built over a given client or pool cannot be
copied for another event loop (``for_another_loop``).

``tether.testing.contracts.report`` reports, for a third-party adapter, each
capability as declared or not and whether the contract kit's tests of it
passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tether.domain.chat_agent_state_store import ChatAgentStateStore
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_stream_recording_store import ChatStreamRecordingStore
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore


class Port(StrEnum):
    """A store interface, by the name ``StoreBundle`` and ``--without`` use."""

    AGENT_STATE = "state"
    RECORDING = "recording"
    SUPERVISION = "supervision"
    CONVERSATION = "conversation"

    @property
    def interface(self) -> type:
        """The port's abstract class, whose methods are the defaults."""
        return _INTERFACES[self]


_INTERFACES: dict[Port, type] = {
    Port.AGENT_STATE: ChatAgentStateStore,
    Port.RECORDING: ChatStreamRecordingStore,
    Port.SUPERVISION: ChatStreamSupervisionStore,
    Port.CONVERSATION: ChatConversationStore,
}


class Capability(StrEnum):
    """One optional method of one port; the value is ``port.method``."""

    STATE_SAVE_FENCED = "state.save_fenced"
    STATE_FENCE = "state.fence"

    RECORDING_PUT_MANY = "recording.put_many"
    RECORDING_FENCE = "recording.fence"
    RECORDING_SUBSCRIBE = "recording.subscribe"
    RECORDING_PUBLISH_DELTAS = "recording.publish_deltas"
    RECORDING_ANNOUNCE_WATCH = "recording.announce_watch"
    RECORDING_WAIT_FOR_CHANGE = "recording.wait_for_change"

    SUPERVISION_SWAP_MANY = "supervision.compare_and_swap_many"
    SUPERVISION_LAST_EPOCH = "supervision.last_epoch"
    SUPERVISION_FIND_BY_MESSAGE_ID = "supervision.find_by_message_id"
    SUPERVISION_LIST_STALE_RUNNING = "supervision.list_stale_running"
    SUPERVISION_ANNOUNCE_DEAD_TURNS = "supervision.announce_dead_turns"
    SUPERVISION_SUBSCRIBE_DEAD_TURNS = "supervision.subscribe_dead_turns"
    SUPERVISION_FOR_ANOTHER_LOOP = "supervision.for_another_loop"
    SUPERVISION_SERVER_TIME = "supervision.server_time"
    SUPERVISION_PRESENCE_LOCK = "supervision.presence_lock"

    CONVERSATION_APPEND_FENCED = "conversation.append_fenced"
    CONVERSATION_REMOVE_FENCED = "conversation.remove_fenced"
    CONVERSATION_FENCE = "conversation.fence"
    CONVERSATION_GET = "conversation.get_conversation"
    CONVERSATION_LIST = "conversation.list_conversations"
    CONVERSATION_SET_SHARED = "conversation.set_shared"
    CONVERSATION_DELETE = "conversation.delete_conversation"
    CONVERSATION_LIST_STALE = "conversation.list_stale_conversations"

    @property
    def port(self) -> Port:
        return Port(self.value.partition(".")[0])

    @property
    def method(self) -> str:
        """The optional method a store overrides to declare it."""
        return self.value.partition(".")[2]

    @property
    def without(self) -> str:
        """What a store without it gets (for reports and start-up warnings)."""
        return _WITHOUT[self]


_WITHOUT: dict[Capability, str] = {
    Capability.STATE_SAVE_FENCED: "the lease is renewed just before each checkpoint (not atomic)",
    Capability.STATE_FENCE: "a fenced producer's checkpoint is refused only by the epoch inside it",
    Capability.RECORDING_PUT_MANY: "one put after another at each flush",
    Capability.RECORDING_FENCE: "a put is fenced only by the record the store holds",
    Capability.RECORDING_SUBSCRIBE: "followers poll; a cancel is heard at the next write",
    Capability.RECORDING_PUBLISH_DELTAS: "followers read snapshots (no deltas)",
    Capability.RECORDING_ANNOUNCE_WATCH: "no follower asks producers for deltas",
    Capability.RECORDING_WAIT_FOR_CHANGE: "waiting for a change sleeps out its time",
    Capability.SUPERVISION_SWAP_MANY: "each heartbeat of a batch is its own compare-and-swap",
    Capability.SUPERVISION_LAST_EPOCH: "epochs restart at 1 once a row is removed",
    Capability.SUPERVISION_FIND_BY_MESSAGE_ID: "a cancel must name its session_id",
    Capability.SUPERVISION_LIST_STALE_RUNNING: "no automatic takeover: clients resume",
    Capability.SUPERVISION_ANNOUNCE_DEAD_TURNS: "a drained turn is found at the next scan",
    Capability.SUPERVISION_SUBSCRIBE_DEAD_TURNS: "the takeover loop scans at its interval only",
    Capability.SUPERVISION_FOR_ANOTHER_LOOP: "leases are renewed on the serving loop",
    Capability.SUPERVISION_SERVER_TIME: "each replica judges liveness by its own clock",
    Capability.SUPERVISION_PRESENCE_LOCK: "a killed replica's turns read dead by age alone",
    Capability.CONVERSATION_APPEND_FENCED: "the lease is renewed just before each append; "
    "missing messages are found by reading the transcript (not atomic)",
    Capability.CONVERSATION_REMOVE_FENCED: "no rollback strategy (501) and no queued turns",
    Capability.CONVERSATION_FENCE: "a fenced producer's append is refused by the lease alone",
    Capability.CONVERSATION_GET: "no reading or sharing of a conversation (501); "
    "another user's write is not told apart",
    Capability.CONVERSATION_LIST: "no listing of conversations (501)",
    Capability.CONVERSATION_SET_SHARED: "no sharing (501)",
    Capability.CONVERSATION_DELETE: "no deleting of conversations (501)",
    Capability.CONVERSATION_LIST_STALE: "no retention (TETHER_RETENTION, tether db prune)",
}


def optional_capabilities(port: Port) -> tuple[Capability, ...]:
    """Every optional capability of ``port``, in declaration order."""
    return tuple(capability for capability in Capability if capability.port is port)


@dataclass(frozen=True)
class StoreCapabilities:
    """What one store declares: the ports it implements and, of their optional
    methods, those it overrides. ``capability in it`` asks for one."""

    store_type: str
    """The store's class name, for messages."""
    ports: frozenset[Port]
    declared: frozenset[Capability]

    @classmethod
    def of(cls, store: object) -> StoreCapabilities:
        """The capabilities of ``store`` (decided once per class, then cached)."""
        return _of_class(type(store))

    def __contains__(self, capability: object) -> bool:
        return capability in self.declared

    @property
    def optional(self) -> tuple[Capability, ...]:
        """Every optional capability of the store's ports."""
        return tuple(capability for capability in Capability if capability.port in self.ports)

    @property
    def missing(self) -> tuple[Capability, ...]:
        """The optional capabilities of its ports that the store leaves to the defaults."""
        return tuple(capability for capability in self.optional if capability not in self)


NO_STORE = StoreCapabilities(store_type="None", ports=frozenset(), declared=frozenset())
"""What a missing store (a layer turned off) declares: nothing."""


_DECIDED: dict[type, StoreCapabilities] = {}
"""Each store class's capabilities, once decided."""


def _of_class(store_class: type) -> StoreCapabilities:
    decided = _DECIDED.get(store_class)
    if decided is None:
        ports = frozenset(port for port in Port if issubclass(store_class, port.interface))
        declared = frozenset(
            capability
            for capability in Capability
            if capability.port in ports and _overrides(store_class, capability)
        )
        decided = StoreCapabilities(store_class.__name__, ports, declared)
        _DECIDED[store_class] = decided
    return decided


def _overrides(store_class: type, capability: Capability) -> bool:
    """Whether ``store_class`` has its own ``capability.method``, not the port's default."""
    default = getattr(capability.port.interface, capability.method)
    return getattr(store_class, capability.method, default) is not default


def capabilities(store: object | None) -> StoreCapabilities:
    """The capabilities of ``store``; a missing store (None) declares none."""
    return NO_STORE if store is None else StoreCapabilities.of(store)


def supports(store: object | None, capability: Capability) -> bool:
    """Whether ``store`` implements ``capability`` (False for a missing store)."""
    return capability in capabilities(store)
