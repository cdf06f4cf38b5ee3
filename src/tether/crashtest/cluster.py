"""The replicas under test: real ``python -m tether serve`` processes on loopback ports.

Every replica serves the same project against the same store URL, so any of them can
take over a turn another one started. Faults are real signals sent to these
processes; nothing here is simulated in-process. With ``load_balancer=True`` a
real HAProxy balances them (``load_balancer.HAProxy``), told of each restart.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx2

from tether.crashtest.instruments.pause_in_write import PAUSE_IN_VARIABLE
from tether.crashtest.instruments.tool_ledger import ToolLedger
from tether.crashtest.load_balancer import HAProxy, LoadBalancerError

LOOPBACK = "127.0.0.1"


_UNLIMITED: dict[str, str] = {
    "TETHER_MAX_TURNS_PER_REQUESTER": "0",
    "TETHER_MAX_TURNS_PER_TENANT": "0",
}
"""The fair limits, off unless the environment sets them: the crash test is
one requester running ``--conversations`` turns at once on one replica (20
in the README's runs), which a limit meant for many users would refuse."""


def inherited_env() -> dict[str, str]:
    """Our environment for a replica, less any fault meant for one start only."""
    inherited = {key: value for key, value in os.environ.items() if key != PAUSE_IN_VARIABLE}
    return {**_UNLIMITED, **inherited}


class ClusterError(RuntimeError):
    """A replica could not be started (or the cluster cannot run at all)."""


def free_port() -> int:
    """A port that was free a moment ago on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


class Replica:
    """One server process. It keeps its name across restarts; the port may change."""

    def __init__(
        self,
        name: str,
        project_dir: Path,
        store_url: str,
        *,
        env: dict[str, str],
        log_path: Path,
        stream_store_url: str | None = None,
        serve_args: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.project_dir = project_dir
        self.store_url = store_url
        self.stream_store_url = stream_store_url
        self.serve_args = serve_args
        self.env = env
        self.fault_env: dict[str, str] = {}
        """Variables of this start only (a fault armed inside the replica)."""
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.draining = False
        self.starts = 0
        self.on_started: Callable[[Replica], Awaitable[None]] | None = None
        """Called once each (re)start answers its probe: the load balancer learns
        the new port."""

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process id of the current start (None before the first)."""
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        """Started and not exited (it may be paused or draining)."""
        return self.process is not None and self.process.poll() is None

    @property
    def running(self) -> bool:
        """Started, not exited, not paused by SIGSTOP and not draining after a
        SIGTERM: it can take turns."""
        return self.alive and not self.paused and not self.draining

    async def start(self, within: float = 30.0, *, fault_env: dict[str, str] | None = None) -> None:
        """Start the process and wait until it answers its liveness probe.

        ``fault_env`` is added to this start's environment only (a fault armed
        inside the replica); a restart without it starts the replica clean.
        """
        if self.process is not None and self.process.poll() is None:
            return
        self.fault_env = dict(fault_env or {})
        # A fresh port on each start: the old one may linger in TIME_WAIT or be
        # taken by someone else meanwhile.
        self.port = free_port()
        command = [
            sys.executable, "-m", "tether", "serve", str(self.project_dir),
            "--host", LOOPBACK, "--port", str(self.port), "--store", self.store_url,
            "--log-level", "warning",
        ]  # fmt: skip
        if self.stream_store_url is not None:
            command += ["--stream-store", self.stream_store_url]
        command += list(self.serve_args)
        self.process = self._spawn(command)
        self.paused = False
        self.draining = False
        self.starts += 1
        deadline = time.monotonic() + within
        async with httpx2.AsyncClient(timeout=1.0) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ClusterError(
                        f"replica {self.name} exited with {self.process.returncode}:\n"
                        + self.log_tail()
                    )
                try:
                    answered = (await http.get(f"{self.url}/probes/alive")).status_code == 200
                except httpx2.HTTPError:
                    answered = False
                if answered:
                    if self.on_started is not None:
                        await self.on_started(self)
                    return
                await asyncio.sleep(0.05)
        self.stop()
        raise ClusterError(
            f"replica {self.name} did not start within {within} s:\n" + self.log_tail()
        )

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts + 1} on port {self.port}\n".encode())
            log.flush()
            # A session of its own: a Ctrl-C in the terminal reaches only the crash
            # test, which then stops its replicas in order instead of racing them.
            # The child keeps its own copy of the log descriptor; ours closes here.
            return subprocess.Popen(
                command,
                env={**inherited_env(), **self.env, **self.fault_env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def send(self, signum: int) -> None:
        """Deliver a signal; a no-op on a process that already exited."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signum)
        if signum == signal.SIGSTOP:
            self.paused = True
        elif signum == signal.SIGCONT:
            self.paused = False
        elif signum == signal.SIGTERM:
            self.draining = True

    def stopped_by_signal(self) -> bool:
        """Whether the process is stopped right now (``T`` in ``/proc/PID/stat``),
        whoever stopped it: a replica may stop itself (the pause-in-write fault)."""
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            with open(f"/proc/{self.process.pid}/stat", encoding="ascii", errors="replace") as stat:
                text = stat.read()
        except OSError:
            return False
        # "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
        fields = text.rpartition(")")[2].split()
        return bool(fields) and fields[0] in ("T", "t")

    async def wait_stopped(self, within: float, *, unless: Callable[[], bool]) -> bool:
        """Wait until the process is stopped; give up after ``within`` seconds, when
        ``unless()`` holds, or when the process exits. Marks it paused when stopped."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and self.alive and not unless():
            if self.stopped_by_signal():
                self.paused = True
                return True
            await asyncio.sleep(0.01)
        if self.stopped_by_signal():
            self.paused = True
            return True
        return False

    async def restart(
        self, within: float = 30.0, *, fault_env: dict[str, str] | None = None
    ) -> None:
        """Stop the process (continued, drained: it holds no turn between rounds)
        and start it again, with ``fault_env`` for the new start only."""
        if self.alive:
            self.send(signal.SIGCONT)
            self.send(signal.SIGTERM)
            if await self.wait_exit(within) is None:
                self.stop()
        await self.start(within, fault_env=fault_env)

    async def wait_exit(self, within: float) -> int | None:
        """The exit code, or None if the process is still there after ``within`` s."""
        if self.process is None:
            return None
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                return code
            await asyncio.sleep(0.02)
        return self.process.poll()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process for good: continue it if paused, SIGTERM, then SIGKILL.

        Blocking on purpose: it runs while the crash test exits (also when it was
        interrupted), where an await might itself be cancelled.
        """
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)
        self.paused = False
        self.draining = True
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)

    def log_tail(self, size: int = 3000) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-size:]


class Cluster:
    """N replicas on one store set, the tool log their calculator appends to, and
    the tool-call ledger (``tether.crashtest.instruments.tool_ledger``) of tools that record
    their runs by idempotency key."""

    def __init__(
        self,
        project_dir: Path,
        store_url: str,
        *,
        size: int,
        workdir: Path,
        env: dict[str, str] | None = None,
        stream_store_url: str | None = None,
        serve_args: tuple[str, ...] = (),
        load_balancer: bool = False,
    ) -> None:
        if size < 2:
            raise ClusterError(
                "a crash test needs at least 2 replicas: one to fail, one to take over"
            )
        self.tool_log = workdir / "tools.log"
        self.tool_log.touch()
        self.ledger = ToolLedger(workdir / "tool-calls")
        replica_env = {
            **(env or {}),
            "TETHER_TOOL_LOG": str(self.tool_log),
            **self.ledger.create(),
        }
        self.replicas = [
            Replica(
                f"r{number}",
                project_dir,
                store_url,
                env=replica_env,
                log_path=workdir / f"r{number}.log",
                stream_store_url=stream_store_url,
                serve_args=serve_args,
            )
            for number in range(1, size + 1)
        ]
        self.workdir = workdir
        self.wants_load_balancer = load_balancer
        self.front: HAProxy | None = None
        """The load balancer in front of the replicas, once started."""

    async def start(self) -> None:
        try:
            await asyncio.gather(*(replica.start() for replica in self.replicas))
            if self.wants_load_balancer:
                await self._start_front()
        except LoadBalancerError as error:
            self.stop()
            raise ClusterError(str(error)) from error
        except BaseException:
            self.stop()
            raise

    async def _start_front(self) -> None:
        self.front = HAProxy(
            {replica.name: replica.port for replica in self.replicas}, workdir=self.workdir
        )
        await self.front.start()
        for replica in self.replicas:
            replica.on_started = self._moved

    async def _moved(self, replica: Replica) -> None:
        """A replica came back on a new port: the load balancer sends there once
        its health checks pass (so a round placing turns on it finds it)."""
        assert self.front is not None
        try:
            await self.front.move(replica.name, replica.port)
        except LoadBalancerError as error:
            raise ClusterError(f"{error}\n{self.front.log_tail()}") from error

    @property
    def front_url(self) -> str | None:
        """The load balancer's URL, when the replicas have one in front."""
        return self.front.url if self.front is not None else None

    def replica_at(self, url: str) -> Replica | None:
        """The replica serving at base URL ``url`` now."""
        return next((r for r in self.replicas if r.url == url.rstrip("/")), None)

    def name_at(self, url: str) -> str | None:
        replica = self.replica_at(url)
        return replica.name if replica is not None else None

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()
        if self.front is not None:
            self.front.stop()

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        self.stop()

    def tool_runs(self) -> int:
        """Executions of the calculator so far, across every replica and restart."""
        with open(self.tool_log, encoding="utf-8") as log:
            return sum(1 for _ in log)

    def tool_runs_by_expression(self) -> Counter[str]:
        """Executions so far per expression (each log line is "PID EXPRESSION")."""
        with open(self.tool_log, encoding="utf-8") as log:
            return Counter(" ".join(line.split()[1:]) for line in log if line.strip())

    def others(self, replica: Replica) -> list[Replica]:
        """The replicas a client can turn to while ``replica`` is failing."""
        return [other for other in self.replicas if other is not replica and other.running]
