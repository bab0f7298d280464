"""The documents under files and folders: each readable file once, a note for every folder or file passed over.

Symbolic links are followed, but a folder already seen (same device and inode) is not entered again, so a
link loop ends with a note instead of running forever. Hidden folders and tool caches are not entered.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ggufdesk.core.docs.extract import kind_of

SKIP_DIRS = frozenset({"node_modules", "__pycache__", "venv", ".venv", "site-packages", "dist-packages"})


@dataclass(frozen=True, slots=True)
class Found:
    path: Path  # absolute, as the user named it (links not resolved: the name the user knows)
    kind: str
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Note:
    path: Path
    reason: str


def walk(roots: Iterable[Path]) -> Iterator[Found | Note]:
    seen: set[tuple[int, int]] = set()
    files: set[tuple[int, int]] = set()
    for root in roots:
        yield from _visit(Path(os.path.abspath(root)), seen, files, top=True)


def _visit(path: Path, seen: set[tuple[int, int]], files: set[tuple[int, int]], *, top: bool) -> Iterator[Found | Note]:
    try:
        st = path.stat()
    except FileNotFoundError:
        yield Note(path, "does not exist" if top else "a broken link or a file that went away")
        return
    except OSError as e:
        yield Note(path, f"cannot be read ({e.strerror or e})")
        return
    key = (st.st_dev, st.st_ino)
    if stat.S_ISDIR(st.st_mode):
        if key in seen:
            yield Note(path, "a folder seen already (a link loop or a second link to it): not read again")
            return
        seen.add(key)
        yield from _folder(path, seen, files)
    elif stat.S_ISREG(st.st_mode):
        kind = kind_of(path)
        if kind is None:
            if top:
                yield Note(path, "not a document type ggufdesk reads")
            return
        if key in files:
            return  # the same file through another link
        files.add(key)
        yield Found(path, kind, st.st_size, st.st_mtime_ns)
    elif top:
        yield Note(path, "not a regular file or folder")


def _folder(path: Path, seen: set[tuple[int, int]], files: set[tuple[int, int]]) -> Iterator[Found | Note]:
    try:
        with os.scandir(path) as it:
            names = sorted(e.name for e in it)
    except OSError as e:
        yield Note(path, f"folder cannot be read ({e.strerror or e})")
        return
    for name in names:
        if name.startswith(".") or name in SKIP_DIRS and (path / name).is_dir():
            continue
        yield from _visit(path / name, seen, files, top=False)
