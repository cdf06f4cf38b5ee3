"""Headless Chromium for the chat page's tests, driven by Playwright.

The browser is Debian's ``chromium`` package, never one Playwright downloads
(``playwright install`` needs the internet): ``apt-get install -y chromium``.
Without it the browser tests skip saying so; with ``TETHER_REQUIRE_SERVICES=1``
(set by ``.ci/run``, which installs it) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import missing

CHROMIUM_HOW = "install Debian's chromium: apt-get update && apt-get install -y chromium"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def chromium_path() -> str:
    path = os.environ.get("TETHER_CHROMIUM") or shutil.which("chromium")
    if path is None:
        missing(f"no chromium executable on PATH; {CHROMIUM_HOW}")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for a test module."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        missing(f"the playwright package is missing ({error}); run make install-dev")
    executable = chromium_path()
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        instance = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture(scope="module")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each step's screenshot goes: ``TETHER_SCREENSHOT_DIR`` or a temp dir."""
    configured = os.environ.get("TETHER_SCREENSHOT_DIR")
    directory = Path(configured) if configured else tmp_path_factory.mktemp("screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def wait_for(predicate: Callable[[], Any], within: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned)."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(0.05)
