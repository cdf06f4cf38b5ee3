"""A real load balancer in front of the replicas: HAProxy (Debian's package) on loopback.

What it does is what a production load balancer in front of tether does:
round-robin over the replicas, health checks on ``/probes/ready`` (a draining
replica answers 503 there and gets no new requests; a killed one is marked
down within about 0.3 s), a request that could not reach a server (connection
refused, or a 503 refusal) retried on another, and no buffering: an answer's
server-sent events pass as they come (``option http-no-delay``), and a stream
may stay open for an hour.

Two headers are the test's own. ``X-Tether-Server`` on every response names
the replica that answered (the crash test's evidence says which replica
served each stream). ``X-Tether-Replica: NAME`` on a request sends it to that
replica while it is up (``use-server``); once it is down the request is
balanced like any other. The crash test places each round's turns on the
replica it is about to fail that way; recovery never pins anything.

Replicas come back on a new port after a restart; the test tells HAProxy
through its runtime API (``set server ... addr``), as service discovery would.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SERVER_HEADER = "X-Tether-Server"
PIN_HEADER = "X-Tether-Replica"
BACKEND = "replicas"
HAPROXY_HOW = "install Debian's haproxy: apt-get update && apt-get install -y haproxy"
_CONFIG = """\
# Written by tether's crash test: a load balancer on loopback for its replicas.
global
    nbthread 1
    maxconn 2000
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 1s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    timeout http-request 10s
    timeout http-keep-alive 10s
    timeout queue 5s
    timeout check 500ms
    # Only what never reached a replica, or what one refused before starting
    # anything (503: draining, store unavailable), is sent again: a POST that
    # reached a replica may have started a turn (the client sorts that out).
    retries 3
    retry-on conn-failure 503
    option redispatch 1

frontend tether
    bind {host}:{port}
    default_backend {backend}

backend {backend}
    balance roundrobin
    # Server-sent events are many small writes that must leave at once: without
    # this HAProxy waits for fuller packets (about 200 ms a message here).
    option http-no-delay
    option httpchk GET /probes/ready
    http-check expect status 200
    default-server check inter 250ms fastinter 100ms downinter 250ms fall 2 rise 2
    use-server %[req.hdr({pin})] if {{ req.hdr({pin}) -m found }}
    http-response set-header {server_header} %s
{servers}
"""


class LoadBalancerError(RuntimeError):
    """HAProxy is missing, or did not come up."""


def haproxy_executable() -> str | None:
    """``TETHER_HAPROXY``, else ``haproxy`` on PATH or in /usr/sbin (Debian's
    place for it, off a normal user's PATH)."""
    configured = os.environ.get("TETHER_HAPROXY")
    if configured:
        return configured
    found = shutil.which("haproxy")
    if found is not None:
        return found
    return "/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class HAProxy:
    """One HAProxy process balancing ``servers`` (name to port, on ``host``)."""

    def __init__(self, servers: dict[str, int], *, workdir: Path, host: str = "127.0.0.1") -> None:
        executable = haproxy_executable()
        if executable is None:
            raise LoadBalancerError(f"no haproxy executable found; {HAPROXY_HOW}")
        self.executable = executable
        self.servers = dict(servers)
        self.host = host
        self.workdir = workdir
        self.log_path = workdir / "haproxy.log"
        # A unix socket path must stay under 108 bytes: a short directory of its own.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="tether-lb-"))
        self.socket_path = self._socket_dir / "admin.sock"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def config(self) -> str:
        servers = "\n".join(
            f"    server {name} {self.host}:{port}" for name, port in self.servers.items()
        )
        return _CONFIG.format(
            socket=self.socket_path,
            host=self.host,
            port=self.port,
            backend=BACKEND,
            pin=PIN_HEADER.lower(),
            server_header=SERVER_HEADER,
            servers=servers,
        )

    async def start(self, within: float = 15.0) -> None:
        """Start HAProxy and wait until it balances: listening, every server up."""
        self.process = self._launch()
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LoadBalancerError(
                    f"haproxy exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                states = await self.states()
            except OSError:
                states = {}
            if states and all(states.get(name) == "UP" for name in self.servers):
                return
            await asyncio.sleep(0.05)
        self.stop()
        raise LoadBalancerError(f"haproxy did not balance within {within} s:\n{self.log_tail()}")

    def _launch(self) -> subprocess.Popen[bytes]:
        self.port = free_port(self.host)
        config_path = self.workdir / "haproxy.cfg"
        config_path.write_text(self.config(), encoding="utf-8")
        check = subprocess.run(
            [self.executable, "-c", "-q", "-f", str(config_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if check.returncode != 0:
            raise LoadBalancerError(f"haproxy refused its configuration:\n{check.stderr}")
        with open(self.log_path, "ab") as log:
            # -db: stay in the foreground, a child this process can signal and wait for.
            return subprocess.Popen(
                [self.executable, "-db", "-f", str(config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    async def command(self, text: str) -> str:
        """One command of HAProxy's runtime API; its answer."""
        reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        try:
            writer.write(text.encode() + b"\n")
            await writer.drain()
            return (await reader.read()).decode(errors="replace")
        finally:
            writer.close()

    async def states(self) -> dict[str, str]:
        """Each server's state as the health checks see it (UP, DOWN, ``DOWN 1/2``...)."""
        lines = (await self.command("show stat")).splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        header = lines[0][2:].split(",")
        proxy, name, status = header.index("pxname"), header.index("svname"), header.index("status")
        states = {}
        for line in lines[1:]:
            fields = line.split(",")
            if len(fields) > status and fields[proxy] == BACKEND and fields[name] in self.servers:
                states[fields[name]] = fields[status]
        return states

    async def move(self, name: str, port: int, *, within: float = 15.0) -> None:
        """Point server ``name`` at its new port and wait until it is up there."""
        answer = await self.command(f"set server {BACKEND}/{name} addr {self.host} port {port}")
        if "not found" in answer.lower() or "error" in answer.lower():
            raise LoadBalancerError(f"haproxy could not move {name}: {answer.strip()}")
        self.servers[name] = port
        if not await self.wait_up(name, within):
            raise LoadBalancerError(f"{name} is not up behind haproxy after {within} s")

    async def wait_up(self, name: str, within: float) -> bool:
        """Whether the health checks find ``name`` up within ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            try:
                if (await self.states()).get(name) == "UP":
                    return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)

    def log_tail(self, size: int = 3000) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-size:]
