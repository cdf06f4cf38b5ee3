"""Old import path, kept working: the in-memory MCP OAuth repository now lives in
``tether.adapters.memory.mcp_repository``.

Only a re-export remains here, so that code importing ``tether.adapters.mcp.in_memory`` (the
seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.memory.mcp_repository import InMemoryMCPOAuthRepository

__all__ = [
    "InMemoryMCPOAuthRepository",
]
