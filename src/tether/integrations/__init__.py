"""Agents written with other frameworks, run by tether with durable turns.

Each integration is a subpackage that imports its framework: import only the
one a project uses (``tether.integrations.pydantic_ai`` needs the
``tether[pydantic-ai]`` extra).
"""
