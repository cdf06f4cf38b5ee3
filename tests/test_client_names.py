"""One vocabulary (issue 28): the Python and the TypeScript clients have the
same names, and docs/clients/python.md's tables ("One vocabulary") pair them.

Each table is read from the page and held against both clients' code: every
name a row gives is there (Python: ``tether.client``, ``TetherClient`` and
``SyncTetherClient``, ``Turn`` and ``SyncTurn``; TypeScript: what the package
exports and its ``TetherClient`` and ``Turn`` have, read by Node from
``clients/typescript/src``), a pair is one word in snake_case and camelCase,
the arguments that both take by position come in the same order, every
public name of either client is in a table, and a turn's events have the same
types and fields (``clients/typescript/src/types.js``, ``TurnEvent``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

import tether.client as python_client
from tests.support.node import node_and_npm
from tether.client import SyncTetherClient, SyncTurn, TetherClient, Turn
from tether.client.turn_events import EVENT_TYPES, TurnEvent

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "clients" / "python.md"
TYPESCRIPT = ROOT / "clients" / "typescript"

DEPRECATED_PYTHON = {
    "AsyncTetherClient": "TetherClient",
    "TurnStream": "Turn",
    "SyncTurnStream": "SyncTurn",
    "StreamStatus": "TurnStatus",
}
"""Old Python names, kept as aliases of the new ones."""
DEPRECATED_TYPESCRIPT = {"TetherHttpError": "TetherHTTPError", "position": "queuePosition"}
"""Old TypeScript names, kept (the same class; a getter of the new property)."""
SAME_THING_OTHER_WORD = {
    ("aclose", "close"): "asyncio's name for closing, as async generators have it",
}
"""The one pair whose words differ, and why."""

NODE_SCRIPT = """
const m = await import(process.argv[1]);
const members = (value) => {
  const names = new Set(Object.keys(value));
  let p = Object.getPrototypeOf(value);
  for (; p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
    for (const name of Object.getOwnPropertyNames(p)) if (name !== "constructor") names.add(name);
  }
  return [...names];
};
const params = (fn) => {
  const source = fn.toString();
  const inside = source.slice(source.indexOf("(") + 1, source.indexOf(")"));
  return inside.split(",").map((p) => p.split("=")[0].trim()).filter(Boolean);
};
const signatures = (value) =>
  Object.fromEntries(
    members(value)
      .filter((name) => typeof value[name] === "function")
      .map((name) => [name, params(value[name])]),
  );
const client = new m.TetherClient({ urls: ["http://127.0.0.1:9"], tenant: "t" });
const turn = client.follow("s"); // nothing is asked before it is read
console.log(JSON.stringify({
  exports: Object.keys(m),
  client: members(client),
  turn: members(turn),
  clientParams: signatures(client),
  same: m.TetherHTTPError === m.TetherHttpError,
}));
"""


# ------------------------------------------------------------- the page


def _tables() -> dict[str, list[tuple[list[str], list[str]]]]:
    """The tables of "One vocabulary", by their first header cell: each row's
    Python names and TypeScript names (none for "—")."""
    section = PAGE.read_text(encoding="utf-8").split("## One vocabulary", 1)[1]
    section = section.split("\n## ", 1)[0]
    tables: dict[str, list[tuple[list[str], list[str]]]] = {}
    rows: list[tuple[list[str], list[str]]] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if rows is None:
            rows = tables.setdefault(cells[0], [])
        elif not set(cells[0]) <= {"-"}:
            rows.append((_names(cells[0]), _names(cells[1])))
    return tables


def _names(cell: str) -> list[str]:
    return re.findall(r"`([A-Za-z_]\w*)`", cell)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _pairs(rows: list[tuple[list[str], list[str]]]) -> Iterator[tuple[str, str]]:
    for python, typescript in rows:
        if python and typescript:
            assert len(python) == len(typescript), (python, typescript)
            yield from zip(python, typescript, strict=True)


TABLES = _tables()
EXPORTS = TABLES["Python (`tether.client`)"]
CLIENT = TABLES["Python `TetherClient`"]
TURN = TABLES["Python `Turn`"]
ARGUMENTS = TABLES["Python"]


# --------------------------------------------------------- the clients


@pytest.fixture(scope="module")
def typescript() -> dict[str, Any]:
    """What the TypeScript package exports, and its client's and turn's members."""
    node, _ = node_and_npm()
    run = subprocess.run(
        [node, "--input-type=module", "-e", NODE_SCRIPT, str(TYPESCRIPT / "src" / "index.js")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, Any] = json.loads(run.stdout)
    declarations = (TYPESCRIPT / "types" / "index.d.ts").read_text(encoding="utf-8")
    found["types"] = re.findall(r"^export type (\w+) =", declarations, re.MULTILINE)
    return found


def _python_members(cls: type, instance: object | None = None) -> set[str]:
    names = {name for name in dir(cls) if not name.startswith("_")}
    if instance is not None:
        names |= {name for name in vars(instance) if not name.startswith("_")}
    return names


@pytest.fixture(scope="module")
def python_client_members() -> set[str]:
    client = TetherClient("http://127.0.0.1:9", tenant="t")
    return _python_members(TetherClient, client)


# ----------------------------------------------------------------- tests


def test_every_pair_is_one_word() -> None:
    for table in (EXPORTS, CLIENT, TURN):
        for python, typescript in _pairs(table):
            if (python, typescript) in SAME_THING_OTHER_WORD:
                continue
            assert _camel(python) == typescript, f"{python} / {typescript}"


def test_the_exports_are_both_packages(typescript: dict[str, Any]) -> None:
    typescript_names = set(typescript["exports"]) | set(typescript["types"])
    listed_python = {name for python, _ in EXPORTS for name in python}
    listed_typescript = {name for _, names in EXPORTS for name in names}
    for name in listed_python:
        assert hasattr(python_client, name), f"tether.client.{name}"
    assert listed_typescript <= typescript_names, listed_typescript - typescript_names
    # Every name either package hands on is in the table (old names aside).
    assert set(python_client.__all__) - set(DEPRECATED_PYTHON) == listed_python
    assert typescript_names - set(DEPRECATED_TYPESCRIPT) == listed_typescript
    # The old names still work: aliases of the new ones.
    for old, new in DEPRECATED_PYTHON.items():
        assert getattr(python_client, old) is getattr(python_client, new), old
    assert typescript["same"], "TetherHttpError is TetherHTTPError"


def test_the_client_methods_are_paired(
    typescript: dict[str, Any], python_client_members: set[str]
) -> None:
    listed_python = {name for python, _ in CLIENT for name in python}
    listed_typescript = {name for _, names in CLIENT for name in names}
    assert listed_python == python_client_members
    assert listed_typescript == set(typescript["client"])
    # The blocking client has every method, without await (close for aclose).
    methods = {name for name in listed_python if callable(getattr(TetherClient, name, None))}
    expected = {"close" if name == "aclose" else name for name in methods}
    assert expected <= _python_members(SyncTetherClient)


def test_arguments_by_position_come_in_the_same_order(typescript: dict[str, Any]) -> None:
    """The conversation before the turn: ``cancel(session_id, message_id)`` and
    ``cancel(sessionId, messageId)``; an options or request object is TypeScript's
    keyword arguments."""
    for python, name in _pairs(CLIENT):
        for client in (TetherClient, SyncTetherClient):
            parameters = inspect.signature(getattr(client, python)).parameters.values()
            positional = [
                _camel(p.name)
                for p in parameters
                if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"
            ]
            theirs = [
                p for p in typescript["clientParams"][name] if p not in ("options", "request")
            ]
            assert positional[: len(theirs)] == theirs, f"{client.__name__}.{python}"
    assert typescript["clientParams"]["cancel"][:2] == ["sessionId", "messageId"]
    assert list(inspect.signature(TetherClient.cancel).parameters)[1:3] == [
        "session_id",
        "message_id",
    ]


def test_the_turn_members_are_paired(typescript: dict[str, Any]) -> None:
    listed_python = {name for python, _ in TURN for name in python}
    listed_typescript = {name for _, names in TURN for name in names}
    assert listed_python == _python_members(Turn)
    assert listed_typescript == set(typescript["turn"]) - set(DEPRECATED_TYPESCRIPT)
    expected = {"close" if name == "aclose" else name for name in listed_python}
    assert expected <= _python_members(SyncTurn)


def test_the_arguments_that_differ_are_there() -> None:
    """The arguments table names real parameters: the Python client's and the
    TypeScript declarations'."""
    python_parameters = {
        name
        for function in (TetherClient.__init__, TetherClient.stream, TetherClient.follow)
        for name in inspect.signature(function).parameters
    }
    declarations = "\n".join(
        path.read_text(encoding="utf-8") for path in (TYPESCRIPT / "types").glob("*.d.ts")
    )
    for python, typescript in ARGUMENTS:
        assert set(python) <= python_parameters, python
        for name in typescript:
            assert re.search(rf"\b{name}\??:", declarations), name


def _typescript_events() -> dict[str, set[str]]:
    """The fields of each type of TurnEvent, as clients/typescript/src/types.js declares it."""
    source = (TYPESCRIPT / "src" / "types.js").read_text(encoding="utf-8")
    declaration = source.split("} TurnEvent", 1)[0].rsplit("@typedef", 1)[1]
    return {
        kind: set(re.findall(r"(\w+):", body))
        for kind, body in re.findall(r'\{type: "(\w+)"([^{}]*)\}', declaration)
    }


def test_a_turn_tells_the_same_events() -> None:
    typescript = _typescript_events()
    python = {cls.__dataclass_fields__["type"].default: cls for cls in get_args(TurnEvent)}
    assert set(python) == set(typescript) == set(EVENT_TYPES)
    for kind, cls in python.items():
        fields = {_camel(f.name) for f in dataclasses.fields(cls) if f.name != "type"}
        assert fields == typescript[kind], kind
