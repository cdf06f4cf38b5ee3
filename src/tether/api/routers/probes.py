"""Health probes for the load balancer and the orchestrator."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["probes"])


@router.get("/probes/alive")
async def alive() -> dict[str, str]:
    """The process is up."""
    return {"status": "alive"}


@router.get("/probes/ready")
async def ready(request: Request) -> JSONResponse:
    """The server takes new turns (false while it drains)."""
    if request.app.state.chat_handler.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ready"})
