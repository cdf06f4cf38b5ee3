"""deploy/: the manifests are valid, agree with each other and with the server.

The Kubernetes manifests are checked against the Kubernetes API's own schemas
(``kubernetes-validate``, strict: an unknown field is an error) and
``compose.yaml`` against the Compose specification's JSON schema
(``check-jsonschema``'s copy); both ship their schemas, so nothing is fetched.
Then what no schema knows, and the README requires: the grace periods cover
tether's drain, the probes and health checks name routes the server has, the
load balancer knows every replica, retries only what started nothing and
deletes client-sent identity headers (checked by ``haproxy -c`` and by a real
HAProxy running the shipped rules), the servers verify JWTs with a key from a
Secret, the schema is upgraded by a Job the pods wait for (run for real on
PostgreSQL), the Ingress neither buffers nor times out a stream, and the
image's default is not header auth. The image is built where a Docker daemon
answers.
"""

from __future__ import annotations

import http.client
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import jwt
import pytest
import yaml

from tests.support.haproxy import require_haproxy
from tests.support.servers import ServerProcess, free_port
from tests.support.services import import_or_skip
from tether.cli.server_app import example_project_dir

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
"""The oldest Kubernetes these manifests are meant for (PodDisruptionBudget
policy/v1 and every field used exist there)."""
HARD_EXIT_SECONDS = 2
"""A process whose drain cannot end exits by itself this long after
TETHER_DRAIN_TIMEOUT (README: Graceful drain)."""
HAPROXY_CONFIGS = sorted(DEPLOY.rglob("*.cfg"))
IDENTITY_HEADERS = ("requester-uuid", "user-tenants", "user-roles")
"""What header auth trusts (README: HTTP API): a gateway's to set, never a client's."""
JWT_KEYS = ("TETHER_JWT_SECRET", "TETHER_JWT_PUBLIC_KEY", "TETHER_JWT_JWKS")
KEEPALIVE_SECONDS = 15
"""tether sends an SSE comment this often: a proxy's read timeout must be longer."""


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, document)
        for path in sorted(KUBERNETES.glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


def of_kind(kind: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in manifests() if doc["kind"] == kind]
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def secret_refs_of(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each variable set from a Secret: its (Secret, key)."""
    refs = {}
    for variable in container.get("env", []):
        ref = variable.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            refs[variable["name"]] = (ref["name"], ref["key"])
    return refs


def example_secrets() -> dict[str, dict[str, str]]:
    """secret.example.yaml's Secrets: name to their keys and values."""
    return {
        doc["metadata"]["name"]: doc["stringData"]
        for doc in yaml.safe_load_all((KUBERNETES / "secret.example.yaml").read_text())
        if doc
    }


def the_container() -> dict[str, Any]:
    (container,) = of_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def compose_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def haproxy_directives(path: Path) -> list[tuple[str, list[str]]]:
    """Each directive of an HAProxy config with the section it is in."""
    sections = ("global", "defaults", "frontend", "backend", "listen", "resolvers")
    section = ""
    found = []
    for line in path.read_text().splitlines():
        words = line.split("#")[0].split()
        if not words:
            continue
        if words[0] in sections:
            section = " ".join(words)
            continue
        found.append((section, words))
    return found


def server_routes() -> set[str]:
    from tests.support.inprocess import build
    from tether.runtime.turn_stores import TurnStores

    app = build(TurnStores(None, None, None, None))
    return set(app.openapi()["paths"])


@pytest.mark.parametrize("path", sorted(KUBERNETES.glob("*.yaml")), ids=lambda p: p.name)
def test_kubernetes_manifests_are_valid(path: Path) -> None:
    kubernetes_validate = import_or_skip("kubernetes_validate")
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_validator_refuses_a_mistake() -> None:
    """The check above is worth something: a misspelt field fails it."""
    kubernetes_validate = import_or_skip("kubernetes_validate")
    deployment = of_kind("Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 20
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    import_or_skip("check_jsonschema")
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", path],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_is_valid() -> None:
    done = check_compose(DEPLOY / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compose_validator_refuses_a_mistake(tmp_path: Path) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    compose["services"]["tether"]["replica"] = 3
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(compose))
    assert check_compose(broken).returncode != 0


def test_the_grace_periods_cover_the_drain() -> None:
    """SIGKILL never cuts a drain short: the pod waits for preStop, the drain
    timeout and the hard exit; compose waits for the drain and the exit."""
    pod = of_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    drain = float(env_of(container)["TETHER_DRAIN_TIMEOUT"])
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    needed = float(pre_stop[1]) + drain + HARD_EXIT_SECONDS
    assert pod["terminationGracePeriodSeconds"] > needed

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    tether = compose["services"]["tether"]
    compose_drain = float(tether["environment"]["TETHER_DRAIN_TIMEOUT"])
    stop_grace = float(tether["stop_grace_period"].removesuffix("s"))
    assert stop_grace > compose_drain + HARD_EXIT_SECONDS


def test_probes_and_health_checks_name_the_servers_routes() -> None:
    routes = server_routes()
    (container,) = of_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] in routes, probe
    # Readiness is the one that turns 503 on SIGTERM: the drain's signal to the LB.
    assert container["readinessProbe"]["httpGet"]["path"] == "/probes/ready"
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    checked = re.search(r"option httpchk GET (\S+)", haproxy)
    assert checked is not None and checked.group(1) == "/probes/ready"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "/probes/alive" in dockerfile
    assert "/probes/alive" in routes


def test_the_load_balancer_knows_every_replica() -> None:
    """Compose's replica count is a variable (2 unless set), and HAProxy reads
    the same variable, with the same default, for its number of slots."""
    services = compose_file()["services"]
    replicas = services["tether"]["deploy"]["replicas"]
    assert replicas == "${TETHER_REPLICAS:-2}"
    assert services["haproxy"]["environment"]["TETHER_REPLICAS"] == replicas
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    template = re.search(r'server-template \S+ "\$\{TETHER_REPLICAS-(\d+)\}" tether:8000', haproxy)
    assert template is not None and template.group(1) == "2"
    # No stickiness anywhere: any replica serves any turn.
    directives = [line.split("#")[0].split() for line in haproxy.splitlines()]
    assert not [d for d in directives if d and d[0] in ("stick", "stick-table", "cookie")]
    assert "sessionAffinity" not in of_kind("Service")["spec"]


def test_the_disruption_budget_leaves_replicas_to_take_turns_over() -> None:
    deployment = of_kind("Deployment")
    budget = of_kind("PodDisruptionBudget")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"] == selector
    assert of_kind("Service")["spec"]["selector"] == selector
    assert deployment["spec"]["replicas"] - budget["spec"]["maxUnavailable"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def _docker_answers() -> str | None:
    """Why the image cannot be built here, or None when it can."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker command on PATH"
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        return "the Docker daemon does not answer (docker info failed)"
    return None


@pytest.mark.timeout(900)
def test_the_image_builds() -> None:
    # Not governed by TETHER_REQUIRE_SERVICES: CI machines have no Docker
    # daemon (and no registry to pull the base image from); where one runs,
    # the build is checked for real.
    why = _docker_answers()
    if why is not None:
        pytest.skip(f"image not built: {why}; start Docker to build deploy/Dockerfile")
    done = subprocess.run(
        [
            "docker",
            "build",
            "--file",
            str(DEPLOY / "Dockerfile"),
            "--tag",
            "tether:test",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def _build_stage_copies() -> list[tuple[str, str]]:
    """The ``COPY SOURCE... DEST`` lines of the Dockerfile's build stage."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    build_stage = dockerfile.split("\nFROM ")[1]
    copies = []
    for line in build_stage.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, dest = line.split()[1:]
            copies += [(source, dest) for source in sources]
    return copies


@pytest.mark.timeout(240)
def test_the_image_context_carries_the_chat_pages_client_modules(tmp_path: Path) -> None:
    """What the build stage copies, and only that, makes a wheel whose chat
    page has its client modules: ``web/static/client`` is a link to the
    TypeScript client's sources, which dangled in the image before. Runs
    everywhere, Docker or not: the context is laid out as the build stage
    lays it, and the wheel built as it builds it (tether alone, no dependencies)."""
    admitted = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    context = tmp_path / "src"
    for source, dest in _build_stage_copies():
        assert source in admitted, f"the build copies {source}, which the dockerignore leaves out"
        origin = ROOT / source
        target = context / dest / origin.name if dest.endswith("/") else context / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(
                origin,
                target,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
            )
        else:
            shutil.copy(origin, target)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir"]
    done = subprocess.run(
        [*build, str(wheels), str(context)],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = wheels.glob("tether-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(name).name for name in archive.namelist() if "web/static/client/" in name}
    expected = {p.name for p in (ROOT / "clients" / "typescript" / "src").glob("*.js")}
    assert expected and expected <= shipped, sorted(expected - shipped)
    chat_page = (ROOT / "src" / "tether" / "web" / "static" / "app.js").read_text()
    imported = set(re.findall(r'from "\./client/([\w.]+\.js)"', chat_page))
    assert imported and imported <= shipped


# The load balancer ---------------------------------------------------------------------


def test_there_is_a_haproxy_config_to_check() -> None:
    assert DEPLOY / "haproxy.cfg" in HAPROXY_CONFIGS


@pytest.mark.parametrize("path", HAPROXY_CONFIGS, ids=lambda p: p.name)
def test_haproxy_accepts_the_config(path: Path) -> None:
    haproxy = require_haproxy()
    done = subprocess.run(
        [haproxy, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", HAPROXY_CONFIGS, ids=lambda p: p.name)
def test_haproxy_retries_only_what_started_nothing(path: Path) -> None:
    """README, Behind a load balancer: `retry-on conn-failure 503` and
    `option redispatch`, so a retry goes to another replica, and only a
    request no replica started anything for is sent again."""
    directives = [words for _, words in haproxy_directives(path)]
    (retry_on,) = [words for words in directives if words[0] == "retry-on"]
    assert retry_on[1:] == ["conn-failure", "503"]
    assert [words for words in directives if words[:2] == ["option", "redispatch"]]


@pytest.mark.parametrize("path", HAPROXY_CONFIGS, ids=lambda p: p.name)
def test_haproxy_deletes_client_sent_identity_before_anything_sets_it(path: Path) -> None:
    """In every frontend, each identity header is deleted before any rule that
    could set it; a backend never sets one."""
    directives = haproxy_directives(path)
    frontends = {section for section, _ in directives if section.startswith("frontend")}
    assert frontends
    for frontend in frontends:
        rules = [words for section, words in directives if section == frontend]
        for header in IDENTITY_HEADERS:
            deleted = [
                i
                for i, words in enumerate(rules)
                if words[:3] == ["http-request", "del-header", header]
            ]
            setting = [
                i
                for i, words in enumerate(rules)
                if words[0] == "http-request"
                and words[1] in ("set-header", "add-header")
                and words[2].lower() == header
            ]
            assert deleted, f"{frontend} forwards a client's {header}"
            assert all(deleted[0] < i for i in setting), (
                f"{frontend} sets {header} before deleting it"
            )
    for section, words in directives:
        if section.startswith("backend") and words[0] == "http-request" and len(words) > 2:
            assert words[2].lower() not in IDENTITY_HEADERS, f"{section} touches {words[2]}"


class _Recorder(BaseHTTPRequestHandler):
    """A replica stand-in: answers 200 to everything, keeps what it was sent."""

    received: list[dict[str, list[str]]]

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        if self.path != "/probes/ready":
            headers: dict[str, list[str]] = {}
            for name, value in self.headers.items():
                headers.setdefault(name.lower(), []).append(value)
            self.server.received.append(headers)  # type: ignore[attr-defined]
        body = b"ok"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def replica_stand_in() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _with_local_ends(config: str, listen: int, replica: int) -> str:
    """The shipped config, every rule as it is, listening on loopback and
    balancing to one local server instead of Docker's DNS names."""
    lines, binds, templates = [], 0, 0
    for line in config.splitlines():
        words = line.split()
        if words[:1] == ["bind"]:
            line, binds = f"    bind 127.0.0.1:{listen}", binds + 1
        elif words[:1] == ["server-template"]:
            line, templates = f"    server replica 127.0.0.1:{replica} check", templates + 1
        lines.append(line)
    assert (binds, templates) == (1, 1), "the config's shape changed: update this test"
    return "\n".join(lines) + "\n"


@pytest.mark.processes
@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", HAPROXY_CONFIGS, ids=lambda p: p.name)
def test_a_client_sent_identity_never_reaches_a_replica(
    path: Path, tmp_path: Path, replica_stand_in: ThreadingHTTPServer
) -> None:
    """A real HAProxy on the shipped rules: whatever identity headers a client
    sends, in any case and repeated, none reaches the replica; the bearer
    token JWT auth reads does, and so does any other header."""
    haproxy = require_haproxy()
    listen = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(_with_local_ends(path.read_text(), listen, replica_stand_in.server_port))
    log = tmp_path / "haproxy.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [haproxy, "-db", "-f", str(config)],
            stdout=output,
            stderr=output,
            env={k: v for k, v in os.environ.items() if k != "TETHER_REPLICAS"},
        )
    try:
        forged = [
            ("requester-uuid", "mallory"),
            ("Requester-UUID", "mallory"),
            ("requester-uuid", "mallory-again"),
            ("USER-TENANTS", "t,other"),
            ("user-roles", "admin"),
            ("Authorization", "Bearer a.b.c"),
            ("X-Kept", "yes"),
        ]
        deadline = time.monotonic() + 20
        while True:
            connection = http.client.HTTPConnection("127.0.0.1", listen, timeout=5)
            try:
                connection.putrequest("POST", "/chat/stream?tenant=t")
                for name, value in forged:
                    connection.putheader(name, value)
                connection.putheader("content-length", "2")
                connection.endheaders(b"{}")
                status = connection.getresponse().status
            except OSError:
                status = 0
            finally:
                connection.close()
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # until the health check finds the replica up
        assert status == 200, log.read_text(errors="replace")[-2000:]
    finally:
        process.terminate()
        process.wait(timeout=10)
    received = replica_stand_in.received  # type: ignore[attr-defined]
    assert received
    for headers in received:
        assert not [name for name in headers if name in IDENTITY_HEADERS], headers
        assert headers["authorization"] == ["Bearer a.b.c"]
        assert headers["x-kept"] == ["yes"]


# Identity ------------------------------------------------------------------------------


def test_the_kubernetes_servers_verify_tokens_with_a_key_from_a_secret() -> None:
    container = the_container()
    assert env_of(container)["TETHER_AUTH"] == "jwt"
    assert "headers" not in container["args"] and "--auth" not in container["args"]
    refs = secret_refs_of(container)
    keys = [name for name in JWT_KEYS if name in refs or name in env_of(container)]
    assert keys == ["TETHER_JWT_SECRET"], "exactly one key source, the secret"
    secret, key = refs["TETHER_JWT_SECRET"]
    assert key in example_secrets()[secret]


def test_compose_runs_jwt_and_refuses_to_start_without_a_secret() -> None:
    environment = compose_file()["services"]["tether"]["environment"]
    assert environment["TETHER_AUTH"] == "jwt"
    # `${VAR:?message}`: Compose stops with the message when it is unset or empty.
    assert re.fullmatch(r"\$\{TETHER_JWT_SECRET:\?[^}]+\}", environment["TETHER_JWT_SECRET"])


def dockerfile_env() -> dict[str, str]:
    """The ENV of the Dockerfile's final stage."""
    final_stage = (DEPLOY / "Dockerfile").read_text().split("\nFROM ")[-1]
    joined = re.sub(r"\\\n\s*", " ", final_stage)
    env = {}
    for line in joined.splitlines():
        if line.startswith("ENV "):
            for word in shlex.split(line[4:]):
                name, _, value = word.partition("=")
                env[name] = value
    return env


def dockerfile_serve_args() -> list[str]:
    """The image's CMD, from `serve` on."""
    (cmd,) = re.findall(r"^CMD (\[.*\])$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    args: list[str] = yaml.safe_load(cmd)
    assert args[:2] == ["tether", "serve"]
    return args[1:]


@pytest.mark.processes
@pytest.mark.timeout(90)
def test_the_image_default_is_jwt_not_headers_open_on_every_interface(tmp_path: Path) -> None:
    """The image's CMD, with its ENV: without a key it does not start at all;
    with one, a forged requester-uuid is a 401 and a token is honoured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(dockerfile_env(), TETHER_STORE="memory://")
    args = dockerfile_serve_args()
    assert args[args.index("--host") + 1] == "0.0.0.0"
    # The interface is the image's; here, loopback is enough to ask it.
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(free_port())
    refused = subprocess.run(
        [sys.executable, "-m", "tether", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0
    assert "--auth jwt needs exactly one of" in refused.stderr

    secret = "s" * 40
    server = ServerProcess(
        example_project_dir(),
        env={**dockerfile_env(), "TETHER_JWT_SECRET": secret, "TETHER_JWT_DEFAULT_TENANTS": "t"},
        log_path=tmp_path / "server.log",
    )
    server.start(timeout=40)
    try:
        forged = httpx2.get(
            f"{server.url}/conversations", params={"tenant": "t"}, headers={"requester-uuid": "a"}
        )
        assert forged.status_code == 401
        token = jwt.encode(
            {"sub": "alice", "exp": int(time.time()) + 300}, secret, algorithm="HS256"
        )
        honoured = httpx2.get(
            f"{server.url}/conversations",
            params={"tenant": "t"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert honoured.status_code == 200, honoured.text
    finally:
        server.stop()


# The schema ----------------------------------------------------------------------------


def the_schema_job() -> dict[str, Any]:
    job = of_kind("Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def the_schema_wait() -> dict[str, Any]:
    (init,) = of_kind("Deployment")["spec"]["template"]["spec"]["initContainers"]
    return init


def test_a_job_upgrades_the_schema_as_its_owner_and_the_servers_wait_for_it() -> None:
    """The servers' database user need not change the schema: a Job does, as
    another user, and each pod's initContainer waits for the schema to reach
    its own tether's version, as the servers' user."""
    job = the_schema_job()
    assert job["args"] == ["tether", "db", "upgrade"]
    wait = the_schema_wait()
    assert wait["args"][:3] == ["tether", "db", "check"] and "--wait" in wait["args"]
    assert job["image"] == wait["image"] == the_container()["image"]
    job_store = secret_refs_of(job)["TETHER_STORE"]
    server_store = secret_refs_of(the_container())["TETHER_STORE"]
    assert secret_refs_of(wait)["TETHER_STORE"] == server_store != job_store
    secrets = example_secrets()
    servers_url = secrets[server_store[0]][server_store[1]]
    owners_url = secrets[job_store[0]][job_store[1]]
    assert parse_qs(urlsplit(servers_url).query)["create_schema"] == ["false"]
    assert urlsplit(servers_url).username != urlsplit(owners_url).username
    # The Job's pod is nobody's replica: not behind the Service, not in the budget.
    job_pod_labels = of_kind("Job")["spec"]["template"]["metadata"]["labels"]
    selector = of_kind("Service")["spec"]["selector"]
    assert not selector.items() <= job_pod_labels.items()
    # Compose does the same with a service the replicas wait for.
    services = compose_file()["services"]
    assert services["schema"]["command"] == job["args"]
    depends = services["tether"]["depends_on"]["schema"]
    assert depends["condition"] == "service_completed_successfully"
    assert "create_schema=false" in services["tether"]["environment"]["TETHER_STORE"]


def _run_manifest_args(args: list[str], store: str) -> subprocess.Popen[str]:
    assert args[0] == "tether"
    env = {**os.environ, "TETHER_STORE": store}
    return subprocess.Popen(
        [sys.executable, "-m", "tether", *args[1:]],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_the_init_container_holds_the_pod_until_the_job_has_run(postgres_url: str) -> None:
    """The manifests' own commands on a real PostgreSQL: the initContainer's
    check fails on an empty database, waits while the Job has not run, and
    lets the pod go once it has."""
    wait_args = the_schema_wait()["args"]
    at_once = [*wait_args[: wait_args.index("--wait")], "--wait", "0"]
    empty = _run_manifest_args(at_once, postgres_url)
    _, stderr = empty.communicate(timeout=60)
    assert empty.returncode == 1 and "tether db upgrade" in stderr

    waiting = _run_manifest_args(wait_args, postgres_url)
    time.sleep(3)
    assert waiting.poll() is None, "the check let the pod go before the schema was there"
    job = _run_manifest_args(the_schema_job()["args"], postgres_url)
    _, job_err = job.communicate(timeout=60)
    assert job.returncode == 0, job_err
    _, wait_err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, wait_err


# Traffic and metrics ---------------------------------------------------------------------


def test_the_ingress_neither_buffers_nor_times_out_a_stream() -> None:
    ingress = of_kind("Ingress")
    annotations = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    max_turn = 900  # TETHER_MAX_TURN_SECONDS's default
    assert int(annotations[prefix + "proxy-read-timeout"]) >= max_turn > KEEPALIVE_SECONDS
    assert int(annotations[prefix + "proxy-send-timeout"]) >= max_turn
    assert annotations[prefix + "proxy-buffering"] == "off"
    assert not [name for name in annotations if "affinity" in name]
    service = of_kind("Service")
    port_names = {port["name"] for port in service["spec"]["ports"]}
    for rule in ingress["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"]["name"] in port_names


def test_the_service_monitor_scrapes_every_pods_metrics() -> None:
    path = KUBERNETES / "prometheus-operator" / "servicemonitor.yaml"
    monitor = yaml.safe_load(path.read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    )
    service = of_kind("Service")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {port["name"] for port in service["spec"]["ports"]}
    routes = server_routes()
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] in routes


def test_the_servers_have_readiness_and_liveness_probes_and_a_budget() -> None:
    container = the_container()
    assert container["readinessProbe"]["httpGet"]["path"] == "/probes/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/probes/alive"
    pod = of_kind("Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > float(env_of(container)["TETHER_DRAIN_TIMEOUT"])
    assert of_kind("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
