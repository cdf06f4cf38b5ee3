"""Agents for the real-process tests: the long-writer shape, with a counting tool,
the README's resumable-dependency example, and an answer that goes backwards."""

from . import outline, rewinder, writer  # noqa: F401 - registers the agents
