"""deploy/: the manifests are valid, agree with each other and with the server.

The Kubernetes manifests are checked against the Kubernetes API's own schemas
(``kubernetes-validate``, strict: an unknown field is an error) and
``compose.yaml`` against the Compose specification's JSON schema
(``check-jsonschema``'s copy); both ship their schemas, so nothing is fetched.
Then what no schema knows: the grace periods cover tether's drain, the probes
and health checks name routes the server has, the load balancer knows every
replica. The image is built where a Docker daemon answers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.services import import_or_skip

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
"""The oldest Kubernetes these manifests are meant for (PodDisruptionBudget
policy/v1 and every field used exist there)."""
HARD_EXIT_SECONDS = 2
"""A process whose drain cannot end exits by itself this long after
TETHER_DRAIN_TIMEOUT (README: Graceful drain)."""


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
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    replicas = compose["services"]["tether"]["deploy"]["replicas"]
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    template = re.search(r"server-template \S+ (\d+) tether:8000", haproxy)
    assert template is not None and int(template.group(1)) >= replicas
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
