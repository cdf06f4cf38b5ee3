"""MCP tools for agents: ask for ``MCPTools`` in the constructor, get the user's tools per turn.

Importing this module registers ``MCPToolsFactory`` with the process-wide
``AgentDependencyRegistry``, so an agent module needs only::

    from tether.mcp_tools import MCPTools

    @ChatAgentClassRegistry.register()
    class Assistant(StreamableChatAgent):
        agent_name = "assistant"

        def __init__(self, chat_client: ChatClient, mcp_tools: MCPTools) -> None:
            self.chat_client = chat_client
            self.mcp_tools = mcp_tools

        async def execute_streaming(self, conversation):
            tools = await self.mcp_tools.tools()
            async for message in self.chat_client.stream(
                conversation, tools=tools, system_prompt=self.mcp_tools.system_prompt()
            ):
                yield self.mcp_tools.annotate(message)

The servers come from the setup's ``agent_configuration.mcp_servers`` (see
``tether.adapters.mcp.config``), never from the request; OAuth uses the store
and token client of the app serving the turn (``MCPOAuthRuntimeMiddleware``).
"""

from __future__ import annotations

from tether.adapters.agent_dependency_registry import AgentDependencyRegistry
from tether.adapters.mcp.config import MCPServerConfig, mcp_servers_from_setup
from tether.adapters.mcp.runtime import current_mcp_oauth_runtime
from tether.adapters.mcp.session import ServerSession
from tether.adapters.mcp.tools import MCPNotice, MCPTool, MCPTools
from tether.domain.agent_dependency import AgentDependencyFactory
from tether.domain.agent_setup import AgentSetup
from tether.domain.turn_context import TurnContext


class MCPToolsFactory(AgentDependencyFactory):
    """Builds a turn's ``MCPTools`` from the agent setup and the turn's user."""

    @classmethod
    def create(cls, setup: AgentSetup, turn: TurnContext) -> MCPTools:
        servers = mcp_servers_from_setup(setup)
        runtime = current_mcp_oauth_runtime()
        return MCPTools(
            [
                ServerSession(
                    server, tenant=turn.tenant, user_uuid=turn.requester_uuid, runtime=runtime
                )
                for server in servers
            ]
        )


AgentDependencyRegistry.register(MCPToolsFactory)

__all__ = ["MCPNotice", "MCPServerConfig", "MCPTool", "MCPTools", "MCPToolsFactory"]
