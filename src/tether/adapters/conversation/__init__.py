"""Conversation (transcript) stores: file-backed and in-memory."""

from tether.adapters.conversation.in_memory import InMemoryChatConversationStore
from tether.adapters.conversation.local_file import LocalFileChatConversationStore

__all__ = ["InMemoryChatConversationStore", "LocalFileChatConversationStore"]
