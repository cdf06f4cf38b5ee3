"""Old import path, kept working: the file MCP OAuth repository now lives in
``tether.adapters.file.mcp_repository``.

Only a re-export remains here, so that code importing ``tether.adapters.mcp.local_file`` (the
seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.mcp_repository import LocalFileMCPOAuthRepository

__all__ = [
    "LocalFileMCPOAuthRepository",
]
