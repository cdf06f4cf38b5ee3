"""Old import path, kept working: the crash test's ``pause-in-write`` fault now
lives in ``tether.crashtest.instruments.pause_in_write``.

Only a re-export remains here, so that code importing ``tether.testing.pause_in_write``
runs unchanged; import from the new place in new code.
"""

from tether.crashtest.instruments.pause_in_write import (
    PAUSE_IN_VARIABLE,
    QUIET_WITHIN,
    PauseGate,
    PauseInWrite,
    WriteKind,
    install,
    install_from_env,
    stop_this_process,
)

__all__ = [
    "PAUSE_IN_VARIABLE",
    "QUIET_WITHIN",
    "PauseGate",
    "PauseInWrite",
    "WriteKind",
    "install",
    "install_from_env",
    "stop_this_process",
]
