"""Evidence read after a round: over HTTP, and from the store set itself.

Over HTTP: the conversation's status row and transcript as the new owner left
them, and again once a fenced producer has been continued and has had time
to do its worst (heartbeat, flush, checkpoint, seal).

From the store set, read through tether's own adapters as any other process
would (``StoreReader``, opened once per run): the turn's recording (its last
message and epoch) and its checkpoint's turn marker (whose turn it is, the
input it carries, its epoch). They prove that a fenced producer wrote
nothing, and that a resumed turn loaded its own checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import replace
from types import TracebackType
from typing import Any

import httpx2

from tether.crashtest.client import REQUESTER, TENANT, TetherAPI
from tether.crashtest.invariants import Snapshot, StoredTurn, normalize_all
from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.stores import StoreBundle, compose


async def snapshot(api: TetherAPI, base_url: str, session_id: str) -> Snapshot:
    try:
        status = await api.status(base_url, session_id)
        transcript = await api.transcript(base_url, session_id)
    except httpx2.HTTPError:
        return Snapshot(None, None)
    return Snapshot(status, normalize_all(transcript) if transcript is not None else None)


class StoreReader:
    """The recording and agent state stores of the run, opened once."""

    def __init__(
        self, store_url: str, *, stream_store_url: str | None = None, without: Iterable[str] = ()
    ) -> None:
        self._bundle: StoreBundle = compose(store_url, stream=stream_store_url).without(without)
        self._opened: list[Any] = []

    async def __aenter__(self) -> StoreReader:
        bundle = self._bundle
        stores = [
            store
            for store in (bundle.chat_stream_recording_store, bundle.agent_state_store)
            if store is not None
        ]
        try:
            for store in {id(store): store for store in stores}.values():
                open_ = getattr(store, "open", None)
                if open_ is not None:
                    await open_()
                self._opened.append(store)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for store in reversed(self._opened):
            close = getattr(store, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        self._opened.clear()

    async def read(self, session_id: str) -> StoredTurn:
        """The conversation's recording and checkpoint marker, as stored now."""
        bundle = self._bundle
        stored = StoredTurn()
        if bundle.chat_stream_recording_store is not None:
            record = await bundle.chat_stream_recording_store.read(TENANT, REQUESTER, session_id)
            if record is not None:
                stored = StoredTurn(
                    recorded_final=record.message.model_dump(mode="json"),
                    recorded_epoch=record.epoch,
                    recorded_message_id=record.message_id,
                )
        if bundle.agent_state_store is not None:
            state = await bundle.agent_state_store.load(TENANT, REQUESTER, session_id)
            marker = state.get(TURN_STATE_KEY)
            if isinstance(marker, dict):
                epoch = marker.get("epoch")
                conversation = marker.get("conversation")
                stored = replace(
                    stored,
                    checkpoint_epoch=int(epoch) if epoch is not None else None,
                    checkpoint_message_id=(
                        str(marker["message_id"]) if marker.get("message_id") is not None else None
                    ),
                    checkpoint_input=(
                        tuple(m for m in conversation if isinstance(m, dict))
                        if isinstance(conversation, list)
                        else None
                    ),
                )
        return stored
