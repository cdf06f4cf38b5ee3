"""Old import path, kept working: the crash test's tool-call ledger now lives
in ``tether.crashtest.instruments.tool_ledger``.

Only a re-export remains here, so that code importing ``tether.testing.tool_ledger``
(a project's tools wrapped with ``recorded``) runs unchanged; import from the new
place in new code.
"""

from tether.crashtest.instruments.tool_ledger import (
    HOLD_AT_MOST,
    LEDGER_VARIABLE,
    ToolLedger,
    ToolRun,
    recorded,
)

__all__ = [
    "HOLD_AT_MOST",
    "LEDGER_VARIABLE",
    "ToolLedger",
    "ToolRun",
    "recorded",
]
