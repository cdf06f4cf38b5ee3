"""Old import path, kept working: the file stores' plumbing now lives in
``tether.adapters.file._files``, and where their rows live in ``tether.adapters.file._paths``.

Only a re-export remains here, so that code importing ``tether.adapters._files`` (the seed's
wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.file._files import (
    create_json,
    exclusive_lock,
    locked_row,
    parse_json,
    read_json,
    read_model,
    remove_empty_directories,
    remove_file,
    remove_lock_file,
    run_in_executor,
    run_in_thread,
    write_json,
)
from tether.adapters.file._paths import (
    RowFiles,
    child_path,
    decode_component,
    encode_component,
    row_files,
    store_root,
)

__all__ = [
    "RowFiles",
    "child_path",
    "create_json",
    "decode_component",
    "encode_component",
    "exclusive_lock",
    "locked_row",
    "parse_json",
    "read_json",
    "read_model",
    "remove_empty_directories",
    "remove_file",
    "remove_lock_file",
    "row_files",
    "run_in_executor",
    "run_in_thread",
    "store_root",
    "write_json",
]
