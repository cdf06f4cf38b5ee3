"""Run the benchmarks and print Markdown tables for the README.

python -m bench store-ops      [--backends memory,file,sqlite,postgres,redis] [--count 300]
python -m bench follower-lag   [--backends ...] [--flushes 60]
python -m bench concurrent     [--backends ...] [--turns 1000]
python -m bench all
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from bench import concurrent_turns, follower_lag, store_ops
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


async def _concurrent(backends: list[str], turns: int) -> dict[str, Any]:
    results = {b: await concurrent_turns.measure(b, turns) for b in backends}
    rows = [
        [
            backend,
            f"{r['completed']}/{r['turns']}",
            r["delay"]["median_ms"],
            r["delay"]["p99_ms"],
            "yes" if r["delay"]["p99_ms"] < 50 else "no",
            r["max_renewal_gap_s"],
            r["false_dead"],
        ]
        for backend, r in results.items()
    ]
    print(f"\n### {turns} concurrent streamed turns on one replica\n")
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
            ],
            rows,
        )
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("which", choices=["store-ops", "follower-lag", "concurrent", "all"])
    parser.add_argument("--backends", default=",".join(ALL))
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--flushes", type=int, default=60)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--json", help="write the raw figures to this file")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    report: dict[str, Any] = {}
    if args.which in ("store-ops", "all"):
        report["store_ops"] = asyncio.run(_store_ops(backends, args.count))
    if args.which in ("follower-lag", "all"):
        report["follower_lag"] = asyncio.run(_follower_lag(backends, args.flushes))
    if args.which in ("concurrent", "all"):
        report["concurrent"] = asyncio.run(_concurrent(backends, args.turns))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
