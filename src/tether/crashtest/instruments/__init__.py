"""What a replica started by ``tether crash-test`` carries inside it: the
``pause-in-write`` fault (``pause_in_write``) and the tool-call ledger
(``tool_ledger``).

Each does nothing unless its environment variable is set, which only the
crash test sets; the server and the bundled example agents import them for
that reason alone. Neither imports the rest of the crash test.
"""
