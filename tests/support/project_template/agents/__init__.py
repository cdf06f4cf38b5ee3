"""Agents for the real-process tests: the long-writer shape, with a counting tool,
the resumable-dependency example of docs/writing-agents.md, and an answer that
goes backwards."""

from . import outline, rewinder, writer  # noqa: F401 - registers the agents
