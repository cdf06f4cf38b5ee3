"""Agents for the real-process tests: the long-writer shape, with a counting tool,
and the README's resumable-dependency example."""

from . import outline, writer  # noqa: F401 - registers the agents
