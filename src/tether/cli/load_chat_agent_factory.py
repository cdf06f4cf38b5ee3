"""Importing a project's ``agents`` package so its ``@ChatAgentClassRegistry.register()`` run.

The package is imported from its path, not from ``sys.path``, under a module name
derived from its resolved location (``_tether_agents_<dir>_<hash>``). That keeps
two projects whose packages are both called ``agents`` apart in one process, makes
importing the same directory twice a no-op, and still lets modules of the package
import each other relatively (``from .tools import search``). Absolute imports of
the package by its directory name (``import agents.tools``) do not work, because
the name ``agents`` is exactly what would collide.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.project_layout import AGENTS_PACKAGE

# Imports run user code and touch sys.modules; one at a time keeps "import once" true.
_lock = threading.Lock()


class AgentPackageImportError(ImportError):
    """The agents package is missing, is not a package, or failed to import; the
    message names the path, and the original error is the ``__cause__``."""


def from_string(path: str | os.PathLike[str]) -> type[ChatAgentClassRegistry]:
    """Import the agents package at ``path`` (or ``path/agents`` for a project
    directory) with every module in it, and return ``ChatAgentClassRegistry``.

    Raises ``AgentPackageImportError`` naming the path when there is no package
    there or when importing it fails.
    """
    package_dir = _find_package(Path(path))
    with _lock:
        _import_package(package_dir)
    return ChatAgentClassRegistry


def module_name_for(package_dir: Path) -> str:
    """The name the package at ``package_dir`` is imported under (stable per path)."""
    resolved = package_dir.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    readable = re.sub(r"\W", "_", resolved.name) or "pkg"
    return f"_tether_agents_{readable}_{digest}"


def _find_package(path: Path) -> Path:
    given = path.expanduser()
    if not given.exists():
        raise AgentPackageImportError(
            f"{path}: agents package not found (resolved to {given.resolve()})"
        )
    if not given.is_dir():
        raise AgentPackageImportError(f"{path}: expected the agents package directory, not a file")
    if (given / "__init__.py").is_file():
        return given.resolve()
    if (given / AGENTS_PACKAGE / "__init__.py").is_file():
        return (given / AGENTS_PACKAGE).resolve()
    raise AgentPackageImportError(
        f"{path}: not an agents package: neither {given / '__init__.py'} nor "
        f"{given / AGENTS_PACKAGE / '__init__.py'} exists"
    )


def _import_package(package_dir: Path) -> ModuleType:
    name = module_name_for(package_dir)
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    init_file = package_dir / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init_file, submodule_search_locations=[str(package_dir)]
    )
    if spec is None or spec.loader is None:
        raise AgentPackageImportError(f"{package_dir}: cannot import {init_file}")
    module = importlib.util.module_from_spec(spec)
    # In sys.modules before running, as the import system does: relative imports
    # inside the package look the parent up there.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        _import_submodules(module)
    except BaseException as exc:
        # Forget everything half-imported, so fixing the error and retrying works.
        for loaded in [key for key in sys.modules if key == name or key.startswith(name + ".")]:
            del sys.modules[loaded]
        if not isinstance(exc, Exception):
            raise
        raise AgentPackageImportError(
            f"{package_dir}: importing the agents package failed: "
            f"{type(exc).__name__}: {exc}{_location(exc, package_dir)}"
        ) from exc
    return module


def _import_submodules(package: ModuleType) -> None:
    """Import every module of the package, depth first, so an agent registers
    even when ``__init__.py`` does not import its module."""
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if info.ispkg:
            _import_submodules(module)


def _location(exc: BaseException, package_dir: Path) -> str:
    """Where in the package the error happened, when the traceback says."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}, line {exc.lineno})"
    frame_file, frame_line = None, None
    traceback = exc.__traceback__
    while traceback is not None:
        filename = traceback.tb_frame.f_code.co_filename
        if filename.startswith(str(package_dir)):
            frame_file, frame_line = filename, traceback.tb_lineno
        traceback = traceback.tb_next
    return f" ({frame_file}, line {frame_line})" if frame_file else ""
