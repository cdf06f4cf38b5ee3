"""Old import path, kept working: the file stores' kept numbers now live in
``tether.adapters.file.kept_numbers``.

Only a re-export remains here, so that code importing ``tether.adapters.kept_numbers`` (the
seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.kept_numbers import KEY_CHECK_FILE, KeptNumber, KeptNumbers

__all__ = [
    "KEY_CHECK_FILE",
    "KeptNumber",
    "KeptNumbers",
]
