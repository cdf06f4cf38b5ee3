"""Errors every store backend raises, so callers never see a driver's own types.

Backends translate driver errors at the edge and keep the original as ``__cause__``.
"""

from __future__ import annotations


class StoreError(Exception):
    """A store could not do what was asked (unreachable, refused, broken)."""


class StoreCorruptedError(StoreError):
    """Stored data could not be read back. Never treated as empty: the message
    names what is broken so an operator can look, and nothing overwrites it."""


class StoreUnavailableError(StoreError):
    """The backend cannot be reached right now."""
