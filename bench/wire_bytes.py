"""Bytes on the wire: one ~4 KB answer streamed cumulative and in delta mode (issue 25).

One real ``tether serve`` process (in-memory stores) streams the same
deterministic answer of the offline model, paced as a model would send it,
once per mode. Two readers per turn, both counted: the direct reader (``POST
/chat/stream``) and a second screen attached from the start (``GET
/chat/stream/{message_id}``, same replica). A reader's bytes are the body of
its response as it arrived (every event, the final ``stream_status``, any
ping), without HTTP headers. Figures are ratios to the answer's length in
UTF-8, and of the cumulative mode's bytes in the same run to this mode's.
Target: delta mode at most 4x the answer's length.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from bench.cross_replica import AGENT, PROMPT, Pace, write_project
from tether.crashtest.cluster import Replica

MODES = ("cumulative", "delta")
PACES = {
    # A token a chunk (one word), as most model APIs stream.
    "token-sized": Pace(chunk_size=1, chunks_per_second=50.0, answer_chunks=620),
    # The shape: about 200 chunks for a 4 KB answer.
    "200 chunks": Pace(chunk_size=3, chunks_per_second=50.0, answer_chunks=200),
}
TARGET = 4.0
"""Delta mode's bytes at most this many times the answer's length."""


@dataclass
class _Read:
    bytes: int = 0
    events: int = 0


async def _read(http: httpx2.AsyncClient, method: str, url: str, **kwargs: Any) -> _Read:
    body = bytearray()
    async with http.stream(method, url, **kwargs) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            body += chunk
    return _Read(len(body), body.count(b"event: new_message"))


async def _turn(http: httpx2.AsyncClient, base: str, mode: str) -> tuple[_Read, _Read, str]:
    """The direct reader's and the second screen's bytes, and the direct
    reader's last whole message's text (the answer, in cumulative mode)."""
    body = {
        "agent_identifier": AGENT,
        "session_id": f"wire-{uuid.uuid4().hex[:10]}",
        "conversation": [{"sender": "user", "content": PROMPT}],
    }
    params = {"tenant": "bench", "stream_mode": mode}
    direct = _Read()
    buffer = bytearray()
    async with http.stream("POST", f"{base}/chat/stream", params=params, json=body) as response:
        response.raise_for_status()
        message_id = response.headers["x-tether-message-id"]
        second = asyncio.ensure_future(
            _read(http, "GET", f"{base}/chat/stream/{message_id}", params=params)
        )
        async for chunk in response.aiter_raw():
            buffer += chunk
    direct.bytes = len(buffer)
    direct.events = buffer.count(b"event: new_message")
    return direct, await second, _last_content(buffer)


def _last_content(body: bytearray) -> str:
    """The last whole message's content in a cumulative stream."""
    for line in reversed(body.decode().splitlines()):
        if line.startswith('data: {"sender"'):
            return str(json.loads(line[6:])["content"])
    return ""


async def measure(name: str, pace: Pace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as directory:
        workdir = Path(directory)
        project = write_project(workdir / "project", pace)
        replica = Replica("r1", project, "memory://", env={}, log_path=workdir / "r1.log")
        await replica.start()
        try:
            async with httpx2.AsyncClient(timeout=120) as http:
                await _turn(http, replica.url, "cumulative")  # warm-up, unmeasured
                reads = {mode: await _turn(http, replica.url, mode) for mode in MODES}
        finally:
            replica.stop()
    rows = []
    baseline = reads["cumulative"][0].bytes
    # The offline model is deterministic: both modes stream this answer.
    length = len(reads["cumulative"][2].encode())
    for mode, (direct, second, _) in reads.items():
        for reader, read in (("direct", direct), ("second screen", second)):
            rows.append(
                {
                    "pace": name,
                    "mode": mode,
                    "reader": reader,
                    "answer_bytes": length,
                    "events": read.events,
                    "bytes": read.bytes,
                    "x_answer": read.bytes / length if length else float("nan"),
                    "cumulative_over_this": baseline / read.bytes if read.bytes else float("nan"),
                }
            )
    return rows


HEADERS = [
    "pace",
    "mode",
    "reader",
    "answer bytes",
    "events",
    "bytes on the wire",
    "x answer",
    "cumulative ÷ this",
    f"delta ≤ {TARGET:g}x answer",
]


def row(result: dict[str, Any]) -> list[object]:
    return [
        result["pace"],
        result["mode"],
        result["reader"],
        result["answer_bytes"],
        result["events"],
        result["bytes"],
        result["x_answer"],
        result["cumulative_over_this"],
        ("yes" if result["x_answer"] <= TARGET else "no") if result["mode"] == "delta" else "",
    ]
