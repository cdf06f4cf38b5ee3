"""SIGTERM drains under whichever server runs the app, from the app's own lifespan:
``uvicorn app:app`` serving the seed's wiring, and gunicorn with uvicorn workers
(``tether serve`` is tested in ``tests/test_replicas.py``). The drain is bounded
even when an agent swallows its cancellation or blocks the event loop.

Real server processes, real signals; every wait is on a stream's events, a
probe's answer or the process's exit. The first two tests drive one replica's
drain in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest

from tests.support.client import turn_body
from tests.support.inprocess import InProcessRegistries
from tests.support.project import make_project
from tests.support.replicas import LiveRead, read_in_background, started
from tests.support.servers import free_port
from tests.support.services import import_or_skip
from tests.test_seed_wiring import WIRING
from tether.adapters.file import LocalFileChatStreamSupervisionStore
from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.api.app import setup_app
from tether.api.signal_drain import EXIT_MARGIN, EXIT_STATUS
from tether.domain.agent_registries import CreatedAgent
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.message_bus import MessageBus
from tether.domain.turn_context import TurnContext
from tether.handlers.chat_handler import ChatHandler
from tether.runtime.lifecycle import TurnState
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings

ALICE = {"requester-uuid": "alice"}
DEFAULTS = TetherSettings()

# Short drain settings for the agents that will not stop (the seed's wiring
# takes the defaults, so this app passes its own).
GRACE, TIMEOUT = 0.5, 2.0
SHORT_WIRING = WIRING.replace("import os\n", "import os\n\nfrom tether import TetherSettings\n", 1)
SHORT_WIRING = SHORT_WIRING.replace(
    "app = setup_app(\n",
    "app = setup_app(\n"
    f"    settings=TetherSettings(drain_grace={GRACE}, drain_timeout={TIMEOUT}),\n",
)

AGENTS = '''
"""Agents that do not stop when asked."""

import asyncio
import time

from tether.domain.chat_agent import StreamableChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_message import ChatMessage, ChatMessageSender


@ChatAgentClassRegistry.register()
class Stubborn(StreamableChatAgent):
    """Swallows every cancellation, forever."""

    agent_name = "stubborn"

    async def execute_streaming(self, conversation):
        yield ChatMessage(sender=ChatMessageSender.BOT, content="thinking")
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass


@ChatAgentClassRegistry.register()
class Blocker(StreamableChatAgent):
    """Holds the event loop (a synchronous call in async code)."""

    agent_name = "blocker"

    async def execute_streaming(self, conversation):
        yield ChatMessage(sender=ChatMessageSender.BOT, content="blocking")
        await asyncio.sleep(0.2)
        time.sleep(60)
        yield ChatMessage(sender=ChatMessageSender.BOT, content="blocking, done")
'''


class SwallowsOnce(StreamableChatAgent):
    """Swallows the cancellation, then returns as if it had finished."""

    agent_name = "swallows-once"

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncIterator[ChatMessage]:
        yield ChatMessage(sender=ChatMessageSender.BOT, content="working")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


class SwallowsUntilReleased(StreamableChatAgent):
    """Swallows every cancellation until the test releases it (at its end: the
    test's event loop waits for every task before it closes)."""

    agent_name = "swallows-until-released"

    def __init__(self, released: asyncio.Event) -> None:
        self.released = released

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncIterator[ChatMessage]:
        yield ChatMessage(sender=ChatMessageSender.BOT, content="working")
        while not self.released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await self.released.wait()


class Registries(InProcessRegistries):
    AGENTS = ("swallows-once", "swallows-until-released")

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()

    async def get_setup(self, agent_identifier: str) -> AgentSetup | None:
        if agent_identifier in self.AGENTS:
            return AgentSetup(agent_identifier=agent_identifier, agent_name=agent_identifier)
        return await super().get_setup(agent_identifier)

    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        if setup.agent_name == "swallows-once":
            return CreatedAgent(agent=SwallowsOnce(), setup=setup)
        if setup.agent_name == "swallows-until-released":
            return CreatedAgent(agent=SwallowsUntilReleased(self.released), setup=setup)
        return await super().create_agent(setup, request, turn)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("agent", Registries.AGENTS)
async def test_a_turn_whose_agent_swallows_its_cancellation_is_handed_off(agent: str) -> None:
    supervision = InMemoryChatStreamSupervisionStore()
    stores = TurnStores(
        agent_state=InMemoryChatAgentStateStore(),
        recording=InMemoryChatStreamRecordingStore(),
        supervision=supervision,
    )
    settings = TetherSettings(drain_grace=0.0, drain_timeout=0.4)
    registries = Registries()
    handler = ChatHandler(registries, stores, settings, MessageBus())
    request = ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid="u"),
        agent_identifier=agent,
        conversation=[ChatMessage(sender=ChatMessageSender.USER, content="Work.")],
        stateful=True,
        session_id="s",
    )
    try:
        turn = await handler.start_turn(request)
        async for _ in turn.buffer.follow():
            break  # the agent is working
        stuck = await asyncio.wait_for(handler.drain(), settings.drain_timeout + 1)
        # Handed off either way: with its agent when the agent ends after all
        # (not sealed as if it had answered), without it at the timeout.
        assert stuck == ([] if agent == "swallows-once" else [turn.message_id])
        assert turn.buffer.end is not None and turn.buffer.end.reason == "dead"
        assert turn.lifecycle.state is TurnState.HANDED_OFF
        row = await supervision.read("t", "u", "s")
        assert row is not None and row.is_dead(datetime.now(UTC))
    finally:
        registries.released.set()
        await handler.shutdown()


def _writer(identifier: str, chunks: int) -> dict[str, object]:
    llm = {"seed": 5, "chunks_per_second": 40, "chunk_size": 3, "answer_chunks": chunks}
    return {
        "agent_identifier": identifier,
        "agent_name": "writer",
        "llm_configuration_name": "offline",
        "agent_configuration": {"llm": llm},
    }


def _project(directory: Path, wiring: str) -> Path:
    make_project(directory)
    agents = directory / "agents"
    (agents / "drain_agents.py").write_text(AGENTS)
    with open(agents / "__init__.py", "a") as init:
        init.write("from . import drain_agents  # noqa: E402, F401\n")
    setups = [
        _writer("long", 400),  # 10 s: handed off when the 2 s grace is over
        _writer("quick", 40),  # 1 s: finishes within the grace
        {"agent_identifier": "stubborn", "agent_name": "stubborn"},
        {"agent_identifier": "blocker", "agent_name": "blocker"},
    ]
    (agents / "agent_setups.json").write_text(json.dumps(setups))
    (directory / "app.py").write_text(wiring)
    return directory


class Served:
    """A server process on the project, in a session of its own (gunicorn forks)."""

    def __init__(self, project: Path, command: list[str], port: int) -> None:
        self.project = project
        self.url = f"http://127.0.0.1:{port}"
        self.log = project / f"server-{port}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command,
                cwd=project,
                # The project first, then whatever tether the tests run (a
                # checkout's src, when PYTHONPATH names one).
                env={**os.environ, "PYTHONPATH": os.pathsep.join(_python_path(project))},
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

    def wait_alive(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(f"{self.url}/probes/alive", timeout=0.5).status_code == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"not serving after {timeout} s: {self.log.read_text()[-3000:]}")

    def signal(self, signum: int) -> float:
        self.process.send_signal(signum)
        return time.monotonic()

    async def exited(self, within: float) -> int:
        try:
            return await asyncio.to_thread(self.process.wait, within)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {within} s later: {self.log.read_text()[-3000:]}"
            ) from None

    def kill(self) -> None:
        # The whole session: a gunicorn worker outlives a killed master.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def _python_path(project: Path) -> list[str]:
    inherited = os.environ.get("PYTHONPATH")
    return [str(project), *([inherited] if inherited else [])]


@contextlib.contextmanager
def serving(project: Path, *servers: str) -> Iterator[list[Served]]:
    """``uvicorn app:app`` or gunicorn with one uvicorn worker, per name, started
    side by side on the project (one store directory)."""
    processes = []
    try:
        for server in servers:
            port = free_port()
            if server == "uvicorn":
                command = [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)]
            else:
                import_or_skip("gunicorn", "install the dev dependencies: make install-dev")
                command = [
                    sys.executable, "-m", "gunicorn", "app:app", "--bind", f"127.0.0.1:{port}",
                    "--workers", "1", "--worker-class", "uvicorn.workers.UvicornWorker",
                    "--no-control-socket",
                ]  # fmt: skip
            processes.append(Served(project, command, port))
        for served in processes:
            served.wait_alive()
        yield processes
    finally:
        for served in processes:
            served.kill()


@pytest.fixture
async def client() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=30, headers=ALICE) as http:
        yield http


async def _start(client: httpx2.AsyncClient, url: str, agent: str, session: str) -> LiveRead:
    body = turn_body("Write", agent=agent, stateful=True, session_id=session)
    read = await started(
        read_in_background(client, "POST", f"{url}/chat/stream?tenant=t", json=body)
    )
    assert read.status_code == 201, read.events
    await read.until(lambda r: len(r.messages) >= 1)
    return read


async def _row(project: Path, session: str) -> ChatStreamSupervision:
    store = LocalFileChatStreamSupervisionStore(base_path=project / ".agent-state" / "supervision")
    row = await store.read("t", "alice", session)
    assert row is not None
    return row


async def _draining(client: httpx2.AsyncClient, url: str, within: float = 5.0) -> None:
    """Until the replica says it is draining (readiness 503)."""
    deadline = time.monotonic() + within
    while (await client.get(f"{url}/probes/ready")).status_code != 503:
        assert time.monotonic() < deadline, "never started draining"
        await asyncio.sleep(0.02)


@pytest.mark.processes
@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
async def test_sigterm_drains_the_seed_wiring(
    server: str, tmp_path: Path, client: httpx2.AsyncClient
) -> None:
    project = _project(tmp_path, WIRING)
    with serving(project, server, "uvicorn") as (served, other):
        # A reader on the draining replica of a turn another replica produces.
        elsewhere = await _start(client, other.url, "long", "s-elsewhere")
        attach = f"{served.url}/chat/stream/{elsewhere.message_id}?tenant=t&session_id=s-elsewhere"
        follower = await started(read_in_background(client, "GET", attach))
        await follower.until(lambda r: len(r.messages) >= 1)
        long = await _start(client, served.url, "long", "s-long")
        claimed = await _row(project, "s-long")
        quick = await _start(client, served.url, "quick", "s-quick")
        terminated_at = served.signal(signal.SIGTERM)

        # At once: no new turn, with the draining error.
        await _draining(client, served.url)
        refused = await client.post(
            f"{served.url}/chat/stream?tenant=t",
            json=turn_body("Write", agent="quick", stateful=True, session_id="s-new"),
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "DRAINING"

        # A turn that ends within the grace finishes as usual...
        await quick.finished(within=DEFAULTS.drain_grace + 5)
        assert quick.verdict() == "done" and quick.error is None
        assert (await _row(project, "s-quick")).status is ChatStreamStatus.DONE

        # ...and one that does not is handed off when the grace is over: its
        # reader is told dead, and its row reads dead at once, not 3 s later.
        await long.finished(within=DEFAULTS.drain_grace + 5)
        assert long.verdict() == "dead", long.events[-2:]
        handed_off_after = time.monotonic() - terminated_at
        assert DEFAULTS.drain_grace <= handed_off_after < DEFAULTS.drain_grace + 3
        row = await _row(project, "s-long")
        assert row.message_id == long.message_id
        # Handed off: the next epoch, dead. (Or already taken over by the other
        # replica, at the epoch after.)
        handed_off = row.epoch == claimed.epoch + 1 and row.is_dead(datetime.now(UTC))
        assert handed_off or row.epoch > claimed.epoch + 1, (claimed, row)

        # Then the server shuts down by itself (uvicorn re-raises the signal),
        # without waiting for the turn it only follows, which goes on elsewhere.
        code = await served.exited(within=DEFAULTS.drain_timeout)
        assert code in (0, -signal.SIGTERM), served.log.read_text()[-3000:]
        await follower.finished(within=1)
        assert elsewhere.task is not None and not elsewhere.task.done()


@pytest.mark.processes
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_an_agent_that_swallows_its_cancellation_does_not_hold_the_drain(
    signum: int, tmp_path: Path, client: httpx2.AsyncClient
) -> None:
    project = _project(tmp_path, SHORT_WIRING)
    with serving(project, "uvicorn") as (served,):
        stuck = await _start(client, served.url, "stubborn", "s-stuck")
        terminated_at = served.signal(signum)

        # Handed off without its agent at the drain timeout.
        await stuck.finished(within=TIMEOUT + 5)
        assert stuck.verdict() == "dead", stuck.events[-2:]
        assert time.monotonic() - terminated_at < TIMEOUT + 1
        assert (await _row(project, "s-stuck")).is_dead(datetime.now(UTC))

        # The process ends even though the agent's task never does: SIGTERM as
        # uvicorn ends it; after SIGINT asyncio would wait for that task forever,
        # so the watchdog ends the process soon after the app has shut down.
        code = await served.exited(within=TIMEOUT + 2 * EXIT_MARGIN + 3)
        elapsed = time.monotonic() - terminated_at
        log = served.log.read_text()[-3000:]
        if signum == signal.SIGTERM:
            assert code in (0, -signal.SIGTERM), log
        else:
            assert code == EXIT_STATUS and "did not stop when cancelled" in log, log
        assert elapsed < TIMEOUT + 2 * EXIT_MARGIN + 1, log


@pytest.mark.processes
async def test_an_agent_that_blocks_the_event_loop_does_not_hold_the_exit(
    tmp_path: Path, client: httpx2.AsyncClient
) -> None:
    project = _project(tmp_path, SHORT_WIRING)
    with serving(project, "uvicorn") as (served,):
        await _start(client, served.url, "blocker", "s-blocked")
        terminated_at = served.signal(signal.SIGTERM)
        code = await served.exited(within=TIMEOUT + EXIT_MARGIN + 5)
        log = served.log.read_text()[-3000:]
        assert code == EXIT_STATUS and "the drain did not end" in log, log
        assert time.monotonic() - terminated_at < TIMEOUT + EXIT_MARGIN + 1.5, log


def test_setup_app_without_settings_reads_the_tether_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`uvicorn app:app` on the seed's wiring is configured as `tether serve` is."""
    monkeypatch.setenv("TETHER_DRAIN_TIMEOUT", "7")
    monkeypatch.setenv("TETHER_TAKEOVER_LIMIT", "1")
    app = setup_app(InProcessRegistries())
    settings = app.state.chat_handler.settings
    assert (settings.drain_timeout, settings.takeover_limit) == (7.0, 1)
