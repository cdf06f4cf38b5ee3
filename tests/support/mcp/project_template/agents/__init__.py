"""Agents for the MCP tests."""

from . import whoami_agent  # noqa: F401 - registers the agent
