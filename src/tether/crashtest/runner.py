"""The whole crash test: replicas up, crash-free references, then the rounds.

Everything random (prompts, producers, faults and where they land) comes from one
``random.Random(seed)``, so a seed names a run; the timing of real processes is
the only thing a seed cannot pin down.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster
from tether.crashtest.faults import FaultChoice, plan_fault
from tether.crashtest.fence import StoreReader
from tether.crashtest.reference import PROMPTS, conversation_prompt, crash_free_runs
from tether.crashtest.report import LiveView
from tether.crashtest.results import CrashTestReport
from tether.crashtest.rounds import RoundContext, RoundPlan, play_round
from tether.settings import TetherSettings, settings_from_env
from tether.testing.pause_in_write import WriteKind

# A crash-free turn that takes longer than this is not one to test with.
_REFERENCE_WITHIN = 300.0


@dataclass(frozen=True)
class CrashTestConfig:
    project_dir: Path
    store_url: str
    replicas: int
    rounds: int
    fault: FaultChoice
    seed: int
    agent: str
    workdir: Path
    stream_store_url: str | None = None
    """Recording and supervision stores elsewhere (``tether serve --stream-store``)."""
    conversations: int = 1
    """Turns each round runs at once on the replica it fails."""
    without: tuple[str, ...] = field(default=())
    """Stores the replicas run without (``tether serve --without``)."""
    pause_in: tuple[WriteKind, ...] = tuple(WriteKind)
    """The writes a pause-in-write round may pause in."""
    via_load_balancer: bool = False
    """Every request through HAProxy in front of the replicas; the client recovers through it."""

    @property
    def writes(self) -> tuple[WriteKind, ...]:
        """The writes to pause in that the replicas make (a transcript only with a
        conversation store)."""
        return tuple(
            write
            for write in self.pause_in
            if self.conversation_store or write is not WriteKind.TRANSCRIPT
        )

    @property
    def stores_described(self) -> str:
        described = f"store {self.store_url}"
        if self.stream_store_url is not None:
            described += f", stream store {self.stream_store_url}"
        if self.without:
            described += f", without {', '.join(self.without)}"
        return described

    @property
    def conversation_store(self) -> bool:
        return "conversation" not in self.without

    @property
    def serve_args(self) -> tuple[str, ...]:
        return tuple(arg for name in self.without for arg in ("--without", name))

    def describe(self, settings: TetherSettings) -> dict[str, Any]:
        return {
            "project": str(self.project_dir),
            "store": self.store_url,
            "stream_store": self.stream_store_url,
            "replicas": self.replicas,
            "conversations": self.conversations,
            "without": list(self.without),
            "fault": str(self.fault),
            "pause_in": [str(write) for write in self.writes],
            "seed": self.seed,
            "agent": self.agent,
            "via_load_balancer": self.via_load_balancer,
            "dead_after_s": settings.dead_after,
            "checkpoint_interval_s": settings.checkpoint_interval,
        }


def new_report(config: CrashTestConfig) -> CrashTestReport:
    return CrashTestReport(
        settings=config.describe(settings_from_env()),
        planned_rounds=config.rounds,
        conversations=config.conversations,
        workdir=str(config.workdir),
    )


async def run_crash_test(
    config: CrashTestConfig, view: LiveView, report: CrashTestReport
) -> CrashTestReport:
    """Run every round into ``report`` (so an interrupted run keeps what it found).

    Raises ``ClusterError`` when the run cannot go on at all.
    """
    # The replicas read the same TETHER_* variables, so these are their settings too.
    settings = settings_from_env()
    rng = random.Random(config.seed)
    pool = PROMPTS[: min(len(PROMPTS), config.rounds)]
    # Each conversation of a round has a prompt of its own (its own tool expression).
    prompts = [
        tuple(conversation_prompt(rng.choice(pool), slot) for slot in range(config.conversations))
        for _ in range(config.rounds)
    ]
    writes = config.writes or tuple(WriteKind)
    cluster = Cluster(
        config.project_dir,
        config.store_url,
        size=config.replicas,
        workdir=config.workdir,
        stream_store_url=config.stream_store_url,
        serve_args=config.serve_args,
        load_balancer=config.via_load_balancer,
    )
    view.phase(f"starting {config.replicas} replicas on {config.stores_described}")
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(cluster)
        http = await stack.enter_async_context(TetherAPI.client())
        api = TetherAPI(
            http,
            config.agent,
            conversations=config.conversation_store,
            front=cluster.front,
            names=cluster.name_at,
        )
        unique = list(
            dict.fromkeys(prompt for round_prompts in prompts for prompt in round_prompts)
        )
        view.phase(f"crash-free runs of {len(unique)} prompts (the references)")
        references, warnings = await crash_free_runs(api, cluster, unique, within=_REFERENCE_WITHIN)
        report.warnings += warnings
        stores: StoreReader | None = None
        try:
            stores = await stack.enter_async_context(
                StoreReader(
                    config.store_url,
                    stream_store_url=config.stream_store_url,
                    without=config.without,
                )
            )
        except Exception as error:
            report.warnings.append(
                f"the store set cannot be read from here ({type(error).__name__}: {error}); "
                "the checks of what it holds are skipped"
            )
        context = RoundContext(
            api, cluster, settings, stores, view.phase, conversation_store=config.conversation_store
        )
        for number, round_prompts in enumerate(prompts, start=1):
            plan = RoundPlan(
                number=number,
                prompts=round_prompts,
                producer=rng.choice(cluster.replicas),
                fault=plan_fault(
                    rng,
                    config.fault,
                    references[round_prompts[0]].shape,
                    settings.checkpoint_interval,
                    conversations=config.conversations,
                    flush_interval=settings.recording_flush_interval,
                    writes=writes,
                ),
            )
            view.round_started(plan)
            results = await play_round(context, plan, references)
            report.results += results
            view.round_finished(results)
    return report
