"""Where the client sends its requests: one load-balanced URL, or the replicas' own.

Every replica serves every route for every conversation (design §3), so the
choice only matters when one stops answering: the client then moves on to the
next URL. Behind one load-balanced URL moving on is asking again; the load
balancer picks a healthy replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Endpoints(Protocol):
    """The base URLs a client may use, in the order it should try them."""

    def current(self) -> str | None:
        """The base URL to send the next request to; None when none is usable
        right now (the caller waits and asks again)."""
        ...

    def failed(self, url: str) -> None:
        """``url`` did not answer, or answered that it cannot serve (a 5xx):
        the next ``current`` should be another one, where there is another."""
        ...


class RotatingEndpoints:
    """A fixed list of base URLs, used in turn: the current one until it fails."""

    def __init__(self, urls: str | Sequence[str]) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        self.urls = [url.rstrip("/") for url in listed]
        if not self.urls:
            raise ValueError("the client needs at least one base URL")
        self._position = 0

    def current(self) -> str:
        return self.urls[self._position]

    def failed(self, url: str) -> None:
        # Only the URL still current moves the rotation: a late failure of one
        # already left behind must not skip the one now in use.
        if self.urls[self._position] == url.rstrip("/"):
            self._position = (self._position + 1) % len(self.urls)
