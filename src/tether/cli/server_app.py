"""The app ``tether serve`` runs: a project's agents wired with the chosen stores."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI

from tether.adapters.agent_dependency_registry import AgentDependencyRegistry
from tether.adapters.agent_setup_retriever_from_file import AgentSetupRetrieverFromFile
from tether.adapters.local_agent_registries_factory import LocalAgentRegistriesFactory
from tether.adapters.mcp.config import mcp_servers_from_setup
from tether.adapters.mcp.serving import mcp_oauth_setup_kwargs
from tether.api.app import setup_app
from tether.api.auth import Authenticator
from tether.api.routers.mcp import install_mcp_oauth
from tether.cli.load_chat_agent_factory import from_string
from tether.crashtest.instruments.pause_in_write import install_from_env as install_crash_test_pause
from tether.domain.agent_setup import AgentSetup
from tether.domain.store_bundle import StoreBundle
from tether.project_layout import project_paths
from tether.settings import TetherSettings


def example_project_dir() -> Path:
    """The bundled example project (agents ``assistant``, ``long-writer``,
    ``note-writer``, ``pydantic-writer`` and ``pydantic-note-writer``)."""
    return Path(str(resources.files("tether") / "examples"))


def build_app(
    project_dir: Path | None,
    *,
    stores: StoreBundle | None = None,
    settings: TetherSettings | None = None,
    authenticator: Authenticator | None = None,
    mcp_store_url: str | None = None,
) -> FastAPI:
    project = project_dir or example_project_dir()
    agents_dir, setups_file, secrets_file = project_paths(project)
    registry = from_string(str(agents_dir))
    retriever = AgentSetupRetrieverFromFile(
        file_path=str(setups_file), secret_file_path=str(secrets_file)
    )
    factory = LocalAgentRegistriesFactory(
        agent_setup_retriever=retriever,
        chat_agent_class_registry=registry,
        agent_dependency_registry=AgentDependencyRegistry,
    )
    bundle = stores or StoreBundle()
    # Only replicas started by `tether crash-test` carry TETHER_CRASHTEST_PAUSE_IN;
    # without it nothing is patched.
    install_crash_test_pause(bundle)
    app = setup_app(
        agent_registries_factory=factory,
        settings=settings,
        authenticator=authenticator,
        **bundle.setup_kwargs(),
        # The MCP OAuth store lives beside the other stores of the same URL.
        **mcp_oauth_setup_kwargs(
            mcp_store_url, stores=bundle, oauth_agents=_oauth_agents(retriever.setups)
        ),
    )
    install_mcp_oauth(app)
    return app


def _oauth_agents(setups: list[AgentSetup]) -> list[str]:
    """The agents with an MCP server that needs a user's OAuth authorization.

    Their MCP configuration is checked here too, so a malformed ``mcp_servers``
    stops the server at start-up, naming the agent, not at its first turn.
    """
    return [
        setup.agent_identifier
        for setup in setups
        if any(server.needs_user_authorization for server in mcp_servers_from_setup(setup))
    ]
