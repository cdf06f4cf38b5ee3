"""Models and interfaces only: no I/O, no web framework, no drivers."""

from tether.domain.agent_dependency import AgentDependencyFactory, ResumableAgentDependency
from tether.domain.agent_registries import (
    AgentConstructionError,
    AgentRegistriesFactory,
    BotParamsRejectedError,
    CreatedAgent,
)
from tether.domain.agent_setup import AgentSetup, AgentSetupError, AgentSetupRetriever
from tether.domain.chat_agent import ChatAgent, StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_agent_state_store import (
    ChatAgentStateStore,
    DependencyState,
    construct_agent_state_key,
)
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationNotOwnedError,
    LastTurnStatus,
)
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTable,
    ContentPartTool,
    ContentPartType,
    ConversationContext,
    FunctionCallRequest,
    FunctionCallResponse,
    ToolCallStatus,
)
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
)
from tether.domain.message_bus import ConversationUpdated, MessageBus
from tether.domain.turn_context import TurnContext

__all__ = [
    "AgentConstructionError",
    "AgentDependencyFactory",
    "AgentRegistriesFactory",
    "AgentSetup",
    "AgentSetupError",
    "AgentSetupRetriever",
    "BotParamsRejectedError",
    "ChatAgent",
    "ChatAgentClassRegistry",
    "ChatAgentStateStore",
    "ChatConversationStore",
    "ChatMessage",
    "ChatMessageSender",
    "ChatRequest",
    "ChatStreamRecordingStore",
    "ChatStreamStatus",
    "ChatStreamSupervision",
    "ChatStreamSupervisionStore",
    "ContentPart",
    "ContentPartTable",
    "ContentPartTool",
    "ContentPartType",
    "ConversationContext",
    "ConversationNotOwnedError",
    "ConversationUpdated",
    "CreatedAgent",
    "DependencyState",
    "FunctionCallRequest",
    "FunctionCallResponse",
    "LastTurnStatus",
    "MessageBus",
    "RecordedStreamEvent",
    "RequestHeaders",
    "ResumableAgentDependency",
    "StreamableChatAgent",
    "ToolCallStatus",
    "TurnContext",
    "construct_agent_state_key",
]
