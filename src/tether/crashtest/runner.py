"""The whole crash test: replicas up, crash-free references, then the rounds.

``tool`` rounds run the tool agent's turns (``--tool-agent``, whose tools record
their runs in the tool-call ledger); every other round runs the long agent's.
Each has its own crash-free references of the same prompts.

Everything random (prompts, producers, faults and where they land) comes from one
``random.Random(seed)``, so a seed names a run; the timing of real processes is
the only thing a seed cannot pin down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster, ClusterError
from tether.crashtest.conversation_rounds import (
    draw_conversation_fault,
    play_conversation_round,
)
from tether.crashtest.faults import FaultChoice, FaultKind, draw_kind, plan_fault
from tether.crashtest.fence import StoreReader
from tether.crashtest.instruments.pause_in_write import WriteKind
from tether.crashtest.reference import PROMPTS, Reference, conversation_prompt, crash_free_runs
from tether.crashtest.report import LiveView
from tether.crashtest.results import CrashTestReport
from tether.crashtest.rounds import RoundContext, RoundPlan, play_round
from tether.project_layout import project_paths
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
    conversations: int = 1
    """Turns each round runs at once on the replica it fails."""
    without: tuple[str, ...] = field(default=())
    """Stores the replicas run without (``tether serve --without``)."""
    pause_in: tuple[WriteKind, ...] = tuple(WriteKind)
    """The writes a pause-in-write round may pause in."""
    via_load_balancer: bool = False
    """Every request through HAProxy in front of the replicas; the client recovers through it."""
    tool_agent: str = "note-writer"
    """agent_identifier of the agent ``tool`` rounds run: its tools record their
    runs in the tool-call ledger (``tether.crashtest.instruments.tool_ledger.recorded``)."""

    @property
    def tool_rounds(self) -> bool:
        """Whether rounds may be ``tool`` rounds: ``--fault tool``, or ``mixed``
        where the project has the tool agent."""
        if self.fault is FaultChoice.TOOL:
            return True
        has_agent = self.tool_agent in project_agents(self.project_dir)
        return self.fault is FaultChoice.MIXED and has_agent

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
            "tool_agent": self.tool_agent if self.tool_rounds else None,
            "via_load_balancer": self.via_load_balancer,
            "dead_after_s": settings.dead_after,
            "checkpoint_interval_s": settings.checkpoint_interval,
        }


def project_agents(project_dir: Path) -> set[str]:
    """The agent identifiers the project's setups file names (empty if unreadable)."""
    try:
        setups = json.loads(project_paths(project_dir)[1].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(setups, list):
        return set()
    return {str(s.get("agent_identifier")) for s in setups if isinstance(s, dict)}


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
    agents = project_agents(config.project_dir)
    if config.fault is FaultChoice.TOOL and config.tool_agent not in agents:
        raise ClusterError(
            f"--fault tool runs the agent {config.tool_agent!r} (--tool-agent), which the "
            f"project {config.project_dir} does not define"
        )
    if config.fault is FaultChoice.MIXED and not config.tool_rounds:
        report.warnings.append(
            f"no tool rounds: the project has no agent {config.tool_agent!r} (--tool-agent)"
        )
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
        tool_api = TetherAPI(
            http,
            config.tool_agent,
            conversations=config.conversation_store,
            front=cluster.front,
            names=cluster.name_at,
        )
        unique = list(
            dict.fromkeys(prompt for round_prompts in prompts for prompt in round_prompts)
        )
        view.phase(f"crash-free runs of {len(unique)} prompts (the references)")
        references, tool_references, warnings = await _references(
            config, api, tool_api, cluster, unique
        )
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
        tool_context = dataclasses.replace(context, api=tool_api)
        for number, round_prompts in enumerate(prompts, start=1):
            producer = rng.choice(cluster.replicas)
            kind = draw_kind(rng, config.fault, tool_rounds=config.tool_rounds)
            round_references = tool_references if kind is FaultKind.TOOL else references
            plan = RoundPlan(
                number=number,
                prompts=round_prompts,
                producer=producer,
                fault=plan_fault(
                    rng,
                    kind,
                    round_references[round_prompts[0]].shape,
                    settings.checkpoint_interval,
                    conversations=config.conversations,
                    flush_interval=settings.recording_flush_interval,
                    writes=writes,
                ),
            )
            view.round_started(plan)
            round_context = tool_context if kind is FaultKind.TOOL else context
            if kind.conversational:
                shape = round_references[round_prompts[0]].shape
                fault = draw_conversation_fault(rng, kind, shape.messages)
                results = await play_conversation_round(context, plan, fault, round_references)
            else:
                results = await play_round(round_context, plan, round_references)
            report.results += results
            view.round_finished(results)
    return report


async def _references(
    config: CrashTestConfig,
    api: TetherAPI,
    tool_api: TetherAPI,
    cluster: Cluster,
    prompts: list[str],
) -> tuple[dict[str, Reference], dict[str, Reference], list[str]]:
    """The crash-free runs of every prompt, by the long agent and (where rounds
    may be tool rounds) by the tool agent, all at once; none of an agent no
    round runs. And the warnings about what cannot be checked."""

    async def no_runs() -> tuple[dict[str, Reference], list[str]]:
        return {}, []

    within = _REFERENCE_WITHIN
    (plain, warnings), (tool, _) = await asyncio.gather(
        crash_free_runs(api, cluster, prompts, within=within)
        if config.fault is not FaultChoice.TOOL
        else no_runs(),
        crash_free_runs(tool_api, cluster, prompts, within=within, ledger=cluster.ledger)
        if config.tool_rounds
        else no_runs(),
    )
    return plain, tool, warnings
