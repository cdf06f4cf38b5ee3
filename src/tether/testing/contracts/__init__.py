"""The store contract test kit: subclass a contract to run it against your adapter.

Each contract is a class of pytest tests with a fixture to override (``store``,
or store factories for the state machine and the cross-process races); see each
module's docstring for an example. The kit needs pytest, pytest-asyncio and
hypothesis.
"""

import pytest

# The contracts are plain asserts in library modules; registering them before they
# are imported gives the user's pytest run its usual assertion diffs.
pytest.register_assert_rewrite(
    "tether.testing.contracts._support",
    "tether.testing.contracts.agent_state",
    "tether.testing.contracts.clock",
    "tether.testing.contracts.conversation",
    "tether.testing.contracts.conversation_full",
    "tether.testing.contracts.conversation_removal",
    "tether.testing.contracts.cross_process",
    "tether.testing.contracts.fencing",
    "tether.testing.contracts.lookups",
    "tether.testing.contracts.recording",
    "tether.testing.contracts.stateful",
    "tether.testing.contracts.supervision",
)

from tether.testing.contracts._support import TRICKY_IDS, ManualClock, StoreFactory  # noqa: E402
from tether.testing.contracts.agent_state import ChatAgentStateStoreContract  # noqa: E402
from tether.testing.contracts.clock import ChatStreamSupervisionClockContract  # noqa: E402
from tether.testing.contracts.conversation import ChatConversationStoreContract  # noqa: E402
from tether.testing.contracts.conversation_full import (  # noqa: E402
    ChatConversationStoreFullContract,
)
from tether.testing.contracts.conversation_removal import (  # noqa: E402
    ChatConversationRemovalContract,
)
from tether.testing.contracts.cross_process import (  # noqa: E402
    ChatStreamRecordingCrossProcessContract,
    ChatStreamSupervisionCrossProcessContract,
)
from tether.testing.contracts.fencing import (  # noqa: E402
    ChatAgentStateFenceContract,
    ChatConversationFenceContract,
    ChatStreamRecordingFenceContract,
    ChatStreamSupervisionEpochContract,
)
from tether.testing.contracts.lookups import (  # noqa: E402
    ChatConversationRetentionContract,
    ChatStreamSupervisionLookupContract,
    ChatStreamSupervisionStaleContract,
)
from tether.testing.contracts.recording import ChatStreamRecordingStoreContract  # noqa: E402
from tether.testing.contracts.stateful import ChatStreamStoresStateMachineContract  # noqa: E402
from tether.testing.contracts.supervision import ChatStreamSupervisionStoreContract  # noqa: E402

__all__ = [
    "TRICKY_IDS",
    "ChatAgentStateFenceContract",
    "ChatAgentStateStoreContract",
    "ChatConversationFenceContract",
    "ChatConversationRemovalContract",
    "ChatConversationRetentionContract",
    "ChatConversationStoreContract",
    "ChatConversationStoreFullContract",
    "ChatStreamRecordingCrossProcessContract",
    "ChatStreamRecordingFenceContract",
    "ChatStreamRecordingStoreContract",
    "ChatStreamStoresStateMachineContract",
    "ChatStreamSupervisionClockContract",
    "ChatStreamSupervisionCrossProcessContract",
    "ChatStreamSupervisionEpochContract",
    "ChatStreamSupervisionLookupContract",
    "ChatStreamSupervisionStaleContract",
    "ChatStreamSupervisionStoreContract",
    "ManualClock",
    "StoreFactory",
]
