"""Shared plumbing of the file-backed stores: safe names, atomic writes, locks, threads.

Every file store follows the same five rules, implemented once here and in ``_paths``:

- **Ids never become paths unescaped.** Where a row lives, its ids escaped
  into path components under the store's directory, is ``_paths``'s part.
- **A write is atomic, and durable when asked.** :func:`write_json` writes a unique
  temp file in the target's directory and ``os.replace``-s it over the target, so
  a concurrent reader sees the old document or the new one, never a torn one. With
  ``durable=True`` the file and its directory are fsynced before returning.
- **Corrupt data is loud.** :func:`read_json` returns None only for a missing
  file; anything unparsable raises ``StoreCorruptedError`` naming the file, so
  nothing ever reads a broken document as empty and overwrites it.
- **Read-check-write is serialized by a separate lock file.** :func:`exclusive_lock`
  takes ``fcntl.flock`` on ``<name>.lock``, never on the document being replaced
  (a replaced file is a new inode, so a lock on it would protect nothing). A
  holder may remove its lock file (:func:`remove_lock_file`, when the row it
  guards has no document left): whoever was waiting on the removed file finds, once it
  holds it, that the path no longer names it, and locks the path anew, so
  two holders are never in at once.
- **Nothing named after a conversation outlives its rows.** A locked step
  that leaves a row with no document (:func:`locked_row`) removes its lock
  file, and then every directory between it and the row kind's directory
  that it leaves empty (:func:`remove_empty_directories`): those directories
  are named after tenants and users. Whoever creates a file in such a
  directory makes it first, and makes it again when it was removed in
  between (:func:`write_json`, :func:`exclusive_lock`). What a store keeps of
  a conversation for ever lives in files named by its keyed hash
  (``tether.adapters.file.kept_numbers``).

The helpers are blocking; stores call them inside one :func:`run_in_thread` per
operation so the event loop never waits on the disk. POSIX only (``fcntl``).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel, ValidationError

from tether.adapters.file._paths import RowFiles
from tether.domain.store_errors import StoreCorruptedError, StoreError

_P = ParamSpec("_P")
_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)


async def run_in_thread(func: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run a blocking store step off the event loop, as one thread call.

    OSErrors (permissions, a full disk) leave as ``StoreError`` with the original
    as ``__cause__``, so callers only ever see the store error types.
    """
    with _os_errors_as_store_errors():
        return await asyncio.to_thread(func, *args, **kwargs)


async def run_in_executor(executor: Executor, step: Callable[[], _T]) -> _T:
    """``run_in_thread`` on a given executor: a store's own thread, for work that
    must not queue behind everything else in the loop's default one."""
    with _os_errors_as_store_errors():
        return await asyncio.get_running_loop().run_in_executor(executor, step)


@contextmanager
def _os_errors_as_store_errors() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise StoreError(f"file store I/O failed: {exc}") from exc


def read_json(path: Path) -> Any | None:
    """The parsed document at ``path``; None if there is no file.

    An empty or unparsable file raises ``StoreCorruptedError`` naming it; the
    file is left untouched for an operator to inspect.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse_json(path, raw)


def parse_json(path: Path, raw: bytes) -> Any:
    """The document ``raw``, read from ``path``; raises as ``read_json`` does."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreCorruptedError(f"{path} is not valid JSON ({exc}); left as is") from exc


def read_model(path: Path, model: type[_M]) -> _M | None:
    """The document at ``path`` validated as ``model``; None if there is no file."""
    document = read_json(path)
    if document is None:
        return None
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise StoreCorruptedError(
            f"{path} does not hold a valid {model.__name__} ({exc}); left as is"
        ) from exc


def write_json(path: Path, document: Any, *, durable: bool) -> None:
    """Atomically replace ``path`` with ``document`` as JSON.

    With ``durable=True`` the data and the directory entry are on disk when this
    returns (transcripts, checkpoints); without, the write is still atomic but may
    be lost in an OS crash (heartbeats and recordings, rewritten every second).
    A failed write leaves no temp file behind.
    """
    temp_name = _temp_file(path, document, durable=durable)
    try:
        os.replace(temp_name, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    if durable:
        _fsync_dir(path.parent)


def create_json(path: Path, document: Any) -> bool:
    """Write ``document`` at ``path`` unless a file is there already; returns
    whether it wrote. Atomic (a reader finds no file or the whole document)
    and durable; of processes racing to create it, exactly one does."""
    temp_name = _temp_file(path, document, durable=True)
    try:
        # A hard link, unlike a replace, fails on an existing name.
        os.link(temp_name, path)
    except FileExistsError:
        return False
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temp_name)
    _fsync_dir(path.parent)
    return True


def _temp_file(path: Path, document: Any, *, durable: bool) -> str:
    """A new temp file beside ``path`` holding ``document``; removed if writing fails."""
    # Serialize first: a document that is not JSON fails before anything touches disk.
    data = json.dumps(document, separators=(",", ":")).encode("ascii")
    descriptor, temp_name = _in_directory(
        path.parent,
        lambda: tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"),
        durable=durable,
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    return temp_name


def remove_file(path: Path, *, durable: bool) -> bool:
    """Delete ``path``; returns whether it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if durable:
        _fsync_dir(path.parent)
    return True


@contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if needed).

    The lock excludes other processes and other threads of this one alike:
    every call opens its own file description. Closing the descriptor releases
    it, also when the holder dies. A lock file removed by its holder while
    this call waited on it is not the lock any more: the call then locks
    whatever file the path names now.
    """
    while True:
        descriptor = _in_directory(
            lock_path.parent,
            lambda: os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600),
            durable=False,
        )
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            held = _names(lock_path, descriptor)
        except BaseException:
            os.close(descriptor)
            raise
        if held:
            break
        os.close(descriptor)
    try:
        yield
    finally:
        os.close(descriptor)


@contextmanager
def locked_row(files: RowFiles) -> Iterator[None]:
    """``exclusive_lock`` on the row's lock file; a step that leaves the row
    with no document (it removed it, or found none) also removes the lock
    file and the directories it leaves empty (``remove_lock_file``), also
    when it raises: nothing named after the row's ids is left behind."""
    with exclusive_lock(files.lock):
        try:
            yield
        finally:
            if not files.data.exists():
                remove_lock_file(files)


def remove_lock_file(files: RowFiles) -> None:
    """Remove the row's lock file and the directories that held only it; call
    it only while holding the lock (``exclusive_lock``)."""
    with suppress(FileNotFoundError):
        files.lock.unlink()
    remove_empty_directories(files.lock, files.top)


def remove_empty_directories(path: Path, top: Path) -> None:
    """Remove the directories holding ``path`` that are empty, from the
    innermost up to ``top`` (kept), stopping at the first that is not."""
    directory = path.parent
    while directory != top and top in directory.parents:
        try:
            directory.rmdir()
        except FileNotFoundError:
            pass  # another process's erase removed it: its parent may be empty too
        except OSError as error:
            if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return  # another row lives there
            raise
        directory = directory.parent


def _names(path: Path, descriptor: int) -> bool:
    """Whether ``path`` still names the file open as ``descriptor``."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)


_DIRECTORY_ATTEMPTS = 100
"""How often a file is created again in a directory removed under it: each
retry needs another process to have emptied and removed it in between, so
only a directory that cannot be made (a dangling symlink) reaches this."""


def _in_directory(directory: Path, create: Callable[[], _T], *, durable: bool) -> _T:
    """``create()`` a file in ``directory``, made first: an erase elsewhere may
    remove an empty directory named after ids between the two, so both are
    done again when the directory turns out to be missing."""
    attempts = 0
    while True:
        try:
            _make_dirs(directory, durable=durable)
            return create()
        except FileNotFoundError:
            attempts += 1
            if attempts == _DIRECTORY_ATTEMPTS:
                raise


def _make_dirs(directory: Path, *, durable: bool) -> None:
    if directory.is_dir():
        return
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    for created in reversed(missing):
        with suppress(FileExistsError):
            created.mkdir()
        if durable:
            # A new directory entry is only durable once its parent is synced.
            _fsync_dir(created.parent)


def _fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
