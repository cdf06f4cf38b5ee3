"""The replicas under test: real ``python -m tether serve`` processes on loopback ports.

Every replica serves the same project against the same store URL, so any of them can
take over a turn another one started. Faults are real signals sent to these
processes; nothing here is simulated in-process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2

LOOPBACK = "127.0.0.1"


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
    ) -> None:
        self.name = name
        self.project_dir = project_dir
        self.store_url = store_url
        self.stream_store_url = stream_store_url
        self.env = env
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        """Started, not exited and not paused by SIGSTOP: it can answer requests."""
        return self.process is not None and self.process.poll() is None and not self.paused

    async def start(self, within: float = 30.0) -> None:
        """Start the process and wait until it answers its liveness probe."""
        if self.process is not None and self.process.poll() is None:
            return
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
        self.process = self._spawn(command)
        self.paused = False
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
                    if (await http.get(f"{self.url}/probes/alive")).status_code == 200:
                        return
                except httpx2.HTTPError:
                    pass
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
                env={**os.environ, **self.env},
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
    """N replicas on one store set, and the tool log their calculator appends to."""

    def __init__(
        self,
        project_dir: Path,
        store_url: str,
        *,
        size: int,
        workdir: Path,
        env: dict[str, str] | None = None,
        stream_store_url: str | None = None,
    ) -> None:
        if size < 2:
            raise ClusterError(
                "a crash test needs at least 2 replicas: one to fail, one to take over"
            )
        self.tool_log = workdir / "tools.log"
        self.tool_log.touch()
        replica_env = {**(env or {}), "TETHER_TOOL_LOG": str(self.tool_log)}
        self.replicas = [
            Replica(
                f"r{number}",
                project_dir,
                store_url,
                env=replica_env,
                log_path=workdir / f"r{number}.log",
                stream_store_url=stream_store_url,
            )
            for number in range(1, size + 1)
        ]

    async def start(self) -> None:
        try:
            await asyncio.gather(*(replica.start() for replica in self.replicas))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        self.stop()

    def tool_runs(self) -> int:
        """Executions of the calculator so far, across every replica and restart."""
        with open(self.tool_log, encoding="utf-8") as log:
            return sum(1 for _ in log)

    def others(self, replica: Replica) -> list[Replica]:
        """The replicas a client can turn to while ``replica`` is failing."""
        return [other for other in self.replicas if other is not replica and other.running]
