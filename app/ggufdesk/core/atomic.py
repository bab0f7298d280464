"""Files that several processes write: whole or not at all, and one read-modify-write at a time.

`write_atomic` writes a temporary file named for this process and thread, then renames it over the
real name: a reader never sees half a file, a crash or a full disk leaves the old file, and two writers
never share a temporary file. With one fixed temporary name per file, four processes recording 50
decode runs each into the planner's calibration file (core/hardware.py) failed 57 renames ("No such
file": another writer had just renamed the shared temporary file) and kept 14 runs where 50 fit.

`locked` serialises a read-modify-write of a file of entries that several processes add to (the
window's engine, a server's engines, the CLI): without it, two that read before either writes each
write back only their own new entry. A lock file beside the data file, through huggingface_hub's
filelock wrapper (which falls back to a soft lock where the file system has no flock); held across
processes and, since every call opens its own lock, across threads.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("ggufdesk")

LOCK_TIMEOUT_S = 10.0  # a read-modify-write takes milliseconds; this long only where a holder hangs


def write_atomic(path: Path, data: bytes | str | list[bytes | bytearray | memoryview]) -> None:
    """Write `data` (bytes, text as UTF-8, or parts written in turn) to `path` through a temporary file,
    on disk before the rename (a power cut leaves the old file or the new one, never an empty one);
    raises OSError, leaving nothing behind."""
    parts = [data.encode("utf-8")] if isinstance(data, str) else [data] if isinstance(data, bytes) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def locked(path: Path, timeout: float = LOCK_TIMEOUT_S, *, best_effort: bool = False) -> Iterator[None]:
    """Hold `path`'s lock file (`<name>.lock` beside it) inside. Raises TimeoutError (filelock.Timeout)
    past `timeout`, OSError where the folder cannot take the lock file; or with `best_effort` (a cache
    that only saves measuring again) goes ahead without the lock, and says so in the log."""
    from huggingface_hub.utils import WeakFileLock

    with contextlib.ExitStack() as held:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(WeakFileLock(path.with_name(path.name + ".lock"), timeout=timeout))
        except (OSError, TimeoutError) as e:
            if not best_effort:
                raise
            log.info("no lock on %s (%s): written without it", path, e)
        yield
