"""LLM adapters: the model/tool loop and the models it can drive."""

from tether.adapters.llm.chat_client import ChatClient, ChatClientFactory
from tether.adapters.llm.offline import OfflineChatModel, OfflineChatModelOptions
from tether.adapters.llm.openai_compatible import OpenAICompatibleChatModel

__all__ = [
    "ChatClient",
    "ChatClientFactory",
    "OfflineChatModel",
    "OfflineChatModelOptions",
    "OpenAICompatibleChatModel",
]
