"""tether: run LLM chat agents in production.

Public names are re-exported here so that the seed's wiring runs with
``zav.agents_sdk`` renamed to ``tether``.
"""

from tether.adapters.agent_setup_retriever_from_file import AgentSetupRetrieverFromFile
from tether.adapters.mcp import (
    MCPOAuthIntegrationStore,
    get_local_file_mcp_oauth_integration_store,
    get_mcp_oauth_token_client,
)
from tether.api.app import setup_app
from tether.domain import *  # noqa: F403 - the domain's __all__ is the public vocabulary
from tether.domain import __all__ as _domain_all
from tether.settings import TetherSettings

__all__ = [
    *_domain_all,
    "AgentSetupRetrieverFromFile",
    "MCPOAuthIntegrationStore",
    "TetherSettings",
    "get_local_file_mcp_oauth_integration_store",
    "get_mcp_oauth_token_client",
    "setup_app",
]
