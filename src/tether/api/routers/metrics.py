"""``GET /metrics``: this replica's metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from tether.metrics import CONTENT_TYPE, TetherMetrics

router = APIRouter(tags=["probes"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Counters, gauges and histograms of this replica (scrape every replica)."""
    collected: TetherMetrics = request.app.state.chat_handler.metrics
    return Response(collected.render(), media_type=CONTENT_TYPE)
