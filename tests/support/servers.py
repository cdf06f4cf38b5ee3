"""Real server processes for tests: ``python -m tether serve`` on a free port.

Claims about replicas (a reconnect lands elsewhere, a producer dies) are tested
with these, killed with real signals, never with in-process fakes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One replica. ``start()`` waits until it answers its liveness probe."""

    def __init__(
        self,
        project_dir: Path,
        *,
        store_url: str = "memory://",
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.project_dir = project_dir
        self.store_url = store_url
        self.env = env or {}
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        # The wait ends as soon as the server answers; the bound is for a
        # server that never does, generous so a loaded machine is not one.
        command = [
            sys.executable, "-m", "tether", "serve", str(self.project_dir),
            "--port", str(self.port), "--store", self.store_url, "--log-level", "warning",
            *self.extra_args,
        ]  # fmt: skip
        if self.log_path is not None:
            # The child keeps its own copy of the descriptor; ours closes at once.
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    command, env={**os.environ, **self.env}, stdout=log, stderr=log
                )
        else:
            self.process = subprocess.Popen(
                command,
                env={**os.environ, **self.env},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self._log()}")
            try:
                if httpx2.get(f"{self.url}/probes/alive", timeout=0.5).status_code == 200:
                    return self
            except httpx2.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not start within {timeout} s: {self._log()}")

    def _log(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-3000:]
        return "(no log)"

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: the replica dies mid-whatever, with no chance to clean up."""
        self.signal(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
