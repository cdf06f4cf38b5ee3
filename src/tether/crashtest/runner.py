"""The whole crash test: replicas up, crash-free references, then the rounds.

Everything random (prompts, producers, faults and where they land) comes from one
``random.Random(seed)``, so a seed names a run; the timing of real processes is
the only thing a seed cannot pin down.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster
from tether.crashtest.faults import FaultChoice, plan_fault
from tether.crashtest.reference import PROMPTS, crash_free_runs
from tether.crashtest.report import LiveView
from tether.crashtest.results import CrashTestReport
from tether.crashtest.rounds import RoundContext, RoundPlan, play_round
from tether.settings import TetherSettings, settings_from_env

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

    @property
    def stores_described(self) -> str:
        described = f"store {self.store_url}"
        if self.stream_store_url is not None:
            described += f", stream store {self.stream_store_url}"
        return described

    def describe(self, settings: TetherSettings) -> dict[str, Any]:
        return {
            "project": str(self.project_dir),
            "store": self.store_url,
            "stream_store": self.stream_store_url,
            "replicas": self.replicas,
            "fault": str(self.fault),
            "seed": self.seed,
            "agent": self.agent,
            "dead_after_s": settings.dead_after,
            "checkpoint_interval_s": settings.checkpoint_interval,
        }


def new_report(config: CrashTestConfig) -> CrashTestReport:
    return CrashTestReport(
        settings=config.describe(settings_from_env()),
        planned_rounds=config.rounds,
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
    prompts = [rng.choice(pool) for _ in range(config.rounds)]
    cluster = Cluster(
        config.project_dir,
        config.store_url,
        size=config.replicas,
        workdir=config.workdir,
        stream_store_url=config.stream_store_url,
    )
    view.phase(f"starting {config.replicas} replicas on {config.stores_described}")
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, config.agent)
        view.phase(f"crash-free runs of {len(set(prompts))} prompts (the references)")
        references, warnings = await crash_free_runs(
            api, cluster, prompts, within=_REFERENCE_WITHIN
        )
        report.warnings += warnings
        context = RoundContext(
            api, cluster, settings, config.store_url, view.phase, config.stream_store_url
        )
        for number, prompt in enumerate(prompts, start=1):
            reference = references[prompt]
            plan = RoundPlan(
                number=number,
                prompt=prompt,
                producer=rng.choice(cluster.replicas),
                fault=plan_fault(rng, config.fault, reference.shape, settings.checkpoint_interval),
            )
            view.round_started(plan)
            result = await play_round(context, plan, reference)
            report.results.append(result)
            view.round_finished(result)
    return report
