"""MCP servers as an agent setup configures them (``agent_configuration.mcp_servers``).

Only the operator's setup (with its secrets file) names servers: nothing in a
request can add one or change its URL, because this is read from the
``AgentSetup`` alone::

    "agent_configuration": {
      "mcp_servers": [
        {"name": "files", "url": "https://files.example/mcp"},
        {"name": "crm", "url": "https://crm.example/mcp",
         "auth": {"type": "header", "name": "X-Api-Key", "value": "..."}},
        {"name": "calendar", "url": "https://cal.example/mcp",
         "auth": {"type": "oauth", "scopes": ["calendar.read"]}}
      ]
    }

``auth`` is ``none`` (default), a static ``header``, or ``oauth`` on the user's
behalf (with an optional pre-registered ``client_id``/``client_secret``; without
one, tether registers itself dynamically).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tether.domain.agent_setup import AgentSetup

CONFIGURATION_KEY = "mcp_servers"


class NoAuth(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["none"] = "none"


class HeaderAuth(BaseModel):
    """A static credential sent on every request (an API key, a service token)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["header"]
    name: str = Field(default="Authorization", min_length=1)
    value: str = Field(min_length=1, repr=False)


class OAuthAuth(BaseModel):
    """OAuth on the user's behalf: each user authorizes in a browser, once."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["oauth"]
    client_id: str | None = None
    client_secret: str | None = Field(default=None, repr=False)
    token_endpoint_auth_method: str | None = None
    scopes: list[str] | None = None
    client_name: str = "tether"


ServerAuth = Annotated[NoAuth | HeaderAuth | OAuthAuth, Field(discriminator="type")]


class MCPServerConfig(BaseModel):
    """One MCP server an agent may use.

    ``tool_prefix`` goes before each tool's name as the model sees it (default
    ``"<name>__"``, so two servers' tools never collide); ``tools`` limits which
    of the server's tools are offered; ``timeout`` bounds each request, in seconds.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,48}$")
    url: str
    transport: Literal["streamable_http"] = "streamable_http"
    auth: ServerAuth = Field(default_factory=NoAuth)
    tool_prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{0,48}$")
    tools: list[str] | None = None
    timeout: float = Field(default=30.0, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("an MCP server url must be http:// or https://")
        return value

    @property
    def prefix(self) -> str:
        return f"{self.name}__" if self.tool_prefix is None else self.tool_prefix

    @property
    def needs_user_authorization(self) -> bool:
        return isinstance(self.auth, OAuthAuth)


def mcp_servers_from_setup(setup: AgentSetup) -> list[MCPServerConfig]:
    """The servers of ``setup``; raises ``ValueError`` naming the agent and the problem."""
    raw: Any = setup.agent_configuration.get(CONFIGURATION_KEY, [])
    if not isinstance(raw, list):
        raise ValueError(
            f"agent {setup.agent_identifier!r}: agent_configuration.{CONFIGURATION_KEY} "
            "must be a list of servers"
        )
    servers: list[MCPServerConfig] = []
    for index, entry in enumerate(raw):
        try:
            servers.append(MCPServerConfig.model_validate(entry))
        except ValidationError as error:
            raise ValueError(
                f"agent {setup.agent_identifier!r}: agent_configuration.{CONFIGURATION_KEY}"
                f"[{index}] is invalid: {error}"
            ) from error
    names = [server.name for server in servers]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(
            f"agent {setup.agent_identifier!r}: MCP server names must be unique; "
            f"repeated: {', '.join(duplicates)}"
        )
    return servers
