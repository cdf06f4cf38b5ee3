"""MCP on the user's behalf: the OAuth records, their repositories and the store.

The repository (``MCPOAuthRepository``) is plain CRUD; ``MCPOAuthIntegrationStore``
wraps one and owns the flow rules. The agent side (``MCPTools``) lives in
``tether.mcp_tools``, which needs the ``mcp`` SDK; nothing here imports it.
"""

from tether.adapters.file.mcp_repository import LocalFileMCPOAuthRepository
from tether.adapters.mcp.encryption import (
    ENCRYPTION_KEYS_ENV,
    MCPOAuthCipher,
    MCPOAuthDecryptionError,
    MCPOAuthEncryptionNotConfiguredError,
    generate_encryption_key,
)
from tether.adapters.mcp.records import (
    MCPOAuthClientInfoRecord,
    MCPOAuthPendingAuthorization,
    MCPOAuthRefreshLease,
    MCPOAuthTokens,
    MCPUserIntegrationRecord,
)
from tether.adapters.mcp.repository import MCPOAuthRepository
from tether.adapters.mcp.settings import MCPOAuthSettings
from tether.adapters.mcp.store import (
    MCPOAuthIntegrationStore,
    MCPOAuthRefreshUnavailableError,
    get_local_file_mcp_oauth_integration_store,
)
from tether.adapters.mcp.token_client import (
    MCPOAuthClient,
    MCPOAuthTokenClient,
    MCPOAuthTokenError,
    get_mcp_oauth_token_client,
)
from tether.adapters.memory.mcp_repository import InMemoryMCPOAuthRepository

__all__ = [
    "ENCRYPTION_KEYS_ENV",
    "InMemoryMCPOAuthRepository",
    "LocalFileMCPOAuthRepository",
    "MCPOAuthCipher",
    "MCPOAuthClient",
    "MCPOAuthClientInfoRecord",
    "MCPOAuthDecryptionError",
    "MCPOAuthEncryptionNotConfiguredError",
    "MCPOAuthIntegrationStore",
    "MCPOAuthPendingAuthorization",
    "MCPOAuthRefreshLease",
    "MCPOAuthRefreshUnavailableError",
    "MCPOAuthRepository",
    "MCPOAuthSettings",
    "MCPOAuthTokenClient",
    "MCPOAuthTokenError",
    "MCPOAuthTokens",
    "MCPUserIntegrationRecord",
    "generate_encryption_key",
    "get_local_file_mcp_oauth_integration_store",
    "get_mcp_oauth_token_client",
]
