"""Agents for the real-process tests: the long-writer shape, with a counting tool."""

from . import writer  # noqa: F401 - registers the agents
