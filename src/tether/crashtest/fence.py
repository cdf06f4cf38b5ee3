"""Evidence that a fenced producer changed nothing (design §5.7).

Over HTTP: the conversation's status row and transcript as the new owner left
them, and again once the stopped producer has been continued and has had time
to do its worst (heartbeat, flush, checkpoint, seal). From the store set itself,
read through tether's own adapters as any other process would: the recording and
the checkpoint must carry the new owner's epoch.
"""

from __future__ import annotations

import contextlib
from typing import Any

import httpx2

from tether.crashtest.client import REQUESTER, TENANT, TetherAPI
from tether.crashtest.invariants import Snapshot, normalize_all
from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.stores import compose


async def snapshot(api: TetherAPI, base_url: str, session_id: str) -> Snapshot:
    try:
        status = await api.status(base_url, session_id)
        transcript = await api.transcript(base_url, session_id)
    except httpx2.HTTPError:
        return Snapshot(None, None)
    return Snapshot(status, normalize_all(transcript) if transcript is not None else None)


async def stored_turn(
    store_url: str, session_id: str, *, stream_store_url: str | None = None
) -> tuple[dict[str, Any] | None, int | None, int | None]:
    """The recording's last message and epoch, and the checkpoint's epoch, read from
    the same stores the replicas use."""
    bundle = compose(store_url, stream=stream_store_url)
    stores = [
        store
        for store in (bundle.chat_stream_recording_store, bundle.agent_state_store)
        if store is not None
    ]
    opened: list[Any] = []
    try:
        for store in {id(store): store for store in stores}.values():
            open_ = getattr(store, "open", None)
            if open_ is not None:
                await open_()
            opened.append(store)
        message = recorded_epoch = checkpoint_epoch = None
        if bundle.chat_stream_recording_store is not None:
            record = await bundle.chat_stream_recording_store.read(TENANT, REQUESTER, session_id)
            if record is not None:
                message = record.message.model_dump(mode="json")
                recorded_epoch = record.epoch
        if bundle.agent_state_store is not None:
            state = await bundle.agent_state_store.load(TENANT, REQUESTER, session_id)
            marker = state.get(TURN_STATE_KEY) or {}
            epoch = marker.get("epoch")
            checkpoint_epoch = int(epoch) if epoch is not None else None
        return message, recorded_epoch, checkpoint_epoch
    finally:
        for store in reversed(opened):
            close = getattr(store, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
