"""Moving a broken user file out of the way under a dated name, never deleting it."""
from __future__ import annotations

import os
import time
from pathlib import Path


def move_aside(path: Path, *, companions: tuple[str, ...] = ()) -> Path:
    """Rename `path` to `<name>.broken-<time>` (a free name) and return it; raises OSError.

    `companions` are suffixes of files that belong with it (SQLite's "-wal", "-shm"): they follow
    it when present, best effort.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.broken-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.broken-{stamp}-{n}")
    os.replace(path, target)
    for suffix in companions:
        side = path.with_name(path.name + suffix)
        if side.exists():
            try:
                os.replace(side, target.with_name(target.name + suffix))
            except OSError:
                pass  # the main file is safe; SQLite rebuilds a missing -shm
    return target


def try_move_aside(path: Path) -> Path | None:
    """move_aside, or None when the file cannot be moved (the caller says so to the user)."""
    try:
        return move_aside(path)
    except OSError:
        return None
