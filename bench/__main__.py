"""Run the benchmarks and print Markdown tables for docs/benchmarks.md.

python -m bench store-ops      [--backends memory,file,sqlite,postgres,redis] [--count 300]
python -m bench follower-lag   [--backends ...] [--flushes 60]
python -m bench concurrent     [--backends ...] [--turns 1000] [--chunk-size 3]
python -m bench cross-replica  [--backends postgres,redis,sqlite,file] [--turns 20] [--at-once 1]
python -m bench memory         [--backends sqlite] [--turns 1000]
python -m bench wire-bytes
python -m bench all

``--chunk-size`` is words per delta (1: token-sized deltas) for ``concurrent``,
``memory`` and ``cross-replica``. ``cross-replica`` also takes
``--backends postgres+redis`` (PostgreSQL, with the streams on Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

from bench import concurrent_turns, cross_replica, follower_lag, memory, store_ops, wire_bytes
from bench._backends import ALL
from bench._stats import table


async def _store_ops(backends: list[str], count: int) -> dict[str, Any]:
    results = {b: await store_ops.measure(b, count) for b in backends}
    baseline = results.get("memory")
    rows = []
    for backend, ops in results.items():
        for op, figures in ops.items():
            ratio = figures["median_ms"] / baseline[op]["median_ms"] if baseline else float("nan")
            rows.append([backend, op, figures["median_ms"], figures["p99_ms"], ratio])
    print("\n### Store operations (ms per operation; ratio = median / in-memory median)\n")
    print(table(["backend", "operation", "median", "p99", "x memory"], rows))
    return results


async def _follower_lag(backends: list[str], flushes: int) -> dict[str, Any]:
    results = {b: await follower_lag.measure(b, flushes) for b in backends}
    rows = []
    for backend, modes in results.items():
        poll = modes["poll"]["median_ms"]
        for mode, figures in modes.items():
            rows.append(
                [
                    backend,
                    mode,
                    figures["median_ms"],
                    figures["p99_ms"],
                    figures["median_ms"] / poll,
                ]
            )
    print("\n### Follower lag: producer put to follower event, another replica (ms)\n")
    print(table(["backend", "mode", "median", "p99", "x poll"], rows))
    return results


async def _concurrent(
    backends: list[str], turns: int, chunk_size: int, watched: bool, busy_core: bool = False
) -> dict[str, Any]:
    with concurrent_turns.busy_core() if busy_core else contextlib.nullcontext():
        results = {
            b: await concurrent_turns.measure(b, turns, chunk_size=chunk_size, watched=watched)
            for b in backends
        }
    rows = [
        [
            backend,
            f"{r['completed']}/{r['turns']}",
            r["delay"]["median_ms"],
            r["delay"]["p99_ms"],
            "yes" if r["delay"]["p99_ms"] < 50 else "no",
            r["max_renewal_gap_s"],
            r["false_dead"],
            round(r["turns_per_second"], 1),
            round(r["recording_puts_per_second"]),
            round(r["recorded_kb_per_second"]),
        ]
        + (
            [
                round(r["deltas_per_second"]),
                round(r["delta_batches_per_second"], 1),
                r["delta_batch"]["median_ms"] if r["delta_batch"] else "",
                r["delta_batch"]["p99_ms"] if r["delta_batch"] else "",
            ]
            if watched
            else []
        )
        for backend, r in results.items()
    ]
    print(
        f"\n### {turns} concurrent streamed turns on one replica "
        f"({chunk_size} word{'s' if chunk_size > 1 else ''} per delta"
        f"{', every turn watched' if watched else ''}"
        f"{', another process keeping a core busy' if busy_core else ''})\n"
    )
    print(
        table(
            [
                "backend",
                "completed",
                "yield→reader median ms",
                "p99 ms",
                "p99 < 50 ms",
                "max heartbeat gap s",
                "false dead",
                "turns/s",
                "recording puts/s",
                "recorded KB/s",
            ]
            + (
                ["deltas/s", "delta batches/s", "batch median ms", "batch p99 ms"]
                if watched
                else []
            ),
            rows,
        )
    )
    return results


async def _cross_replica(
    backends: list[str], turns: int, pace: cross_replica.Pace, at_once: int
) -> dict[str, Any]:
    results = await cross_replica.measure_all(backends, turns, pace, at_once)
    print(
        f"\n### Cross-replica follower: two `tether serve` processes, {turns} turns "
        f"({at_once} at once) of "
        f"{pace.answer_chunks} deltas at {pace.chunks_per_second:g}/s "
        f"({pace.chunk_size} word{'s' if pace.chunk_size > 1 else ''} each)\n"
    )
    print(table(cross_replica.LAG_HEADERS, [cross_replica.lag_row(r) for r in results.values()]))
    print(
        "\nText lag: when the follower on B first showed the text the direct reader on A"
        " had at each index, minus when the direct reader had it. Target with push:"
        " p50 < 50 ms, p99 < 150 ms, no index missed, end lag p99 < 100 ms."
    )
    print(
        f"\n### Cross-replica cancel: DELETE answer to the producer's last event ({turns} each)\n"
    )
    print(
        table(cross_replica.CANCEL_HEADERS, [cross_replica.cancel_row(r) for r in results.values()])
    )
    print(
        "\nDELETE sent to B while the turn streams on A; same replica: sent to A (the"
        " baseline; negative: the producer stopped before the DELETE was answered)."
        " Target p99: < 100 ms with push, < 1.2 s without."
    )
    for result in results.values():
        if result["unfinished"]:
            print(f"\n{result['backend']}: streams that did not finish: {result['unfinished']}")
    return results


async def _memory(backends: list[str], turns: int, chunk_size: int) -> dict[str, Any]:
    results = {b: await memory.measure(b, turns, chunk_size) for b in backends}
    print(
        f"\n### Memory: {turns} concurrent turns of {chunk_size}-word deltas, in one process "
        "(peak RSS growth per turn)\n"
    )
    print(
        table(
            memory.CONCURRENT_HEADERS,
            [memory.concurrent_row(b, r["concurrent"]) for b, r in results.items()],
        )
    )
    print("\n### Memory: one answer of 4,000 one-word deltas (live reader + one never reading)\n")
    print(
        table(
            memory.LONG_HEADERS, [memory.long_row(b, r["long_answer"]) for b, r in results.items()]
        )
    )
    return results


async def _wire_bytes() -> dict[str, Any]:
    results = {
        name: await wire_bytes.measure(name, pace) for name, pace in wire_bytes.PACES.items()
    }
    print(
        "\n### Bytes on the wire: one ~4 KB answer at 50 chunks/s, cumulative vs "
        "`stream_mode=delta` (one `tether serve`, two readers a turn)\n"
    )
    print(table(wire_bytes.HEADERS, [wire_bytes.row(r) for rows in results.values() for r in rows]))
    return results


# Each benchmark's defaults when --backends / --turns are not given.
_DEFAULT_BACKENDS = {
    "cross-replica": cross_replica.BACKENDS,
    "memory": memory.BACKENDS,
}
_DEFAULT_TURNS = {"concurrent": 1000, "memory": 1000, "cross-replica": 20}
_DEFAULT_CHUNK_SIZE = {"concurrent": 3, "memory": 1, "cross-replica": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument(
        "which",
        choices=[
            "store-ops",
            "follower-lag",
            "concurrent",
            "cross-replica",
            "memory",
            "wire-bytes",
            "all",
        ],
    )
    parser.add_argument(
        "--backends",
        help=f"comma-separated (default: {','.join(ALL)}; cross-replica: "
        f"{','.join(cross_replica.BACKENDS)}; memory: {','.join(memory.BACKENDS)})",
    )
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--flushes", type=int, default=60)
    parser.add_argument(
        "--turns",
        type=int,
        help="default: concurrent and memory 1000, cross-replica 20 (with all, one value for each)",
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        help="words per delta (1 = token-sized; default: concurrent 3, memory and cross-replica 1)",
    )
    parser.add_argument(
        "--chunks-per-second",
        type=float,
        default=cross_replica.Pace.chunks_per_second,
        help="cross-replica: deltas per second of each turn",
    )
    parser.add_argument(
        "--answer-chunks",
        type=int,
        default=cross_replica.Pace.answer_chunks,
        help="cross-replica: deltas per turn",
    )
    parser.add_argument(
        "--watched",
        action="store_true",
        help="concurrent: every turn publishes its deltas, as if followed on another replica",
    )
    parser.add_argument(
        "--busy-core",
        action="store_true",
        help="concurrent: another process spins on one core for the whole run (outside load)",
    )
    parser.add_argument(
        "--at-once",
        type=int,
        default=1,
        help="cross-replica: followed turns that stream together (default 1)",
    )
    parser.add_argument("--json", help="write the raw figures to this file")
    args = parser.parse_args(argv)

    def backends(which: str) -> list[str]:
        chosen = args.backends or ",".join(_DEFAULT_BACKENDS.get(which, ALL))
        return [b for b in chosen.split(",") if b]

    def turns(which: str) -> int:
        return int(args.turns or _DEFAULT_TURNS[which])

    def chunk_size(which: str) -> int:
        return int(args.chunk_size or _DEFAULT_CHUNK_SIZE[which])

    report: dict[str, Any] = {}
    if args.which in ("store-ops", "all"):
        report["store_ops"] = asyncio.run(_store_ops(backends("store-ops"), args.count))
    if args.which in ("follower-lag", "all"):
        report["follower_lag"] = asyncio.run(_follower_lag(backends("follower-lag"), args.flushes))
    if args.which in ("concurrent", "all"):
        report["concurrent"] = asyncio.run(
            _concurrent(
                backends("concurrent"),
                turns("concurrent"),
                chunk_size("concurrent"),
                args.watched,
                args.busy_core,
            )
        )
    if args.which in ("cross-replica", "all"):
        pace = cross_replica.Pace(
            chunk_size=chunk_size("cross-replica"),
            chunks_per_second=args.chunks_per_second,
            answer_chunks=args.answer_chunks,
        )
        report["cross_replica"] = asyncio.run(
            _cross_replica(
                [b for b in backends("cross-replica") if b != "memory"],
                turns("cross-replica"),
                pace,
                args.at_once,
            )
        )
    if args.which in ("memory", "all"):
        report["memory"] = asyncio.run(
            _memory(backends("memory"), turns("memory"), chunk_size("memory"))
        )
    if args.which in ("wire-bytes", "all"):
        report["wire_bytes"] = asyncio.run(_wire_bytes())
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
