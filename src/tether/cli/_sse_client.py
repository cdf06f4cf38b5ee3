"""The SSE reader moved to ``tether.client.sse``; these names stay importable from here."""

from __future__ import annotations

from tether.client.sse import SSEEvent, SSEParser, iter_sse, iter_sse_text

__all__ = ["SSEEvent", "SSEParser", "iter_sse", "iter_sse_text"]
