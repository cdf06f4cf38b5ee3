"""Agents for the real-process tests: the long-writer shape, with a counting tool,
and the resumable-dependency example of docs/writing-agents.md."""

from . import outline, writer  # noqa: F401 - registers the agents
