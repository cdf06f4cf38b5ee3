"""Node.js for the tests that run JavaScript: the TypeScript client's, the AI
SDK's and the load balancer's. One check of what they all need, so a machine
without it is told the same thing everywhere (skipped, or failed under
``TETHER_REQUIRE_SERVICES=1``; ``.ci/run`` installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess

from tests.support.services import missing

NODE_MAJOR = 20
"""The oldest Node.js the client supports (``clients/typescript/package.json``
engines) and the AI SDK runs on."""
NODE_HOW = (
    f"install Node.js {NODE_MAJOR} or newer with npm (.ci/run does: Debian's nodejs and npm, "
    f"then npm's node@{NODE_MAJOR} package where Debian's is older)"
)


def node_and_npm() -> tuple[str, str]:
    """The paths of ``node`` (new enough) and ``npm``, or skip (fail) saying why."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing(f"no node or npm on PATH; {NODE_HOW}")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = re.match(r"v(\d+)", version.stdout.strip())
    if major is None or int(major.group(1)) < NODE_MAJOR:
        missing(f"node {version.stdout.strip()} is too old; {NODE_HOW}")
    return node, npm
