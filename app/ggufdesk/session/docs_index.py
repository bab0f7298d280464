"""Indexing a collection off the caller's thread, with progress, cancel, and a poll that re-indexes what changed.

The window, the terminal chat and `ggufdesk docs add` all index through IndexJob; Watcher is the
session layer's way of keeping an attached folder current (the window may also use Qt's file watcher
to poll sooner): every `every_s` it runs an incremental pass, which stats the files and reads only
those whose size or time changed.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from ggufdesk.core.docs.indexer import Embedder, Indexer, Progress, Report
from ggufdesk.core.docs.store import Collection
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.docs")


class IndexJob:
    """One indexing run in its own thread. `on_progress(Progress)` and `on_done(Report | None, error)`
    are called from that thread (a GUI hands them to its main thread)."""

    def __init__(self, name: str, roots: Sequence[Path] = (), *, embed: Embedder | None = None,
                 embed_model: str = "", embed_dim: int = 0,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_done: Callable[[Report | None, KnownError | None], None] | None = None,
                 root_dir: Path | None = None, create: bool = True) -> None:
        self.name = name
        self.roots = list(roots)
        self.embed = embed
        self.embed_model = embed_model
        self.embed_dim = embed_dim
        self.on_progress = on_progress or (lambda p: None)
        self.on_done = on_done or (lambda r, e: None)
        self.root_dir = root_dir
        self.create = create
        self.cancelled = threading.Event()
        self.report: Report | None = None
        self.error: KnownError | None = None
        self._thread = threading.Thread(target=self._run, name=f"index-{name}", daemon=True)

    def start(self) -> IndexJob:
        self._thread.start()
        return self

    def cancel(self) -> None:
        self.cancelled.set()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def run_here(self) -> Report:
        """Index in the calling thread (raises KnownError)."""
        with Collection.open(self.name, create=self.create, root=self.root_dir) as coll:
            if self.embed is not None and self.embed_model:
                dim = self.embed_dim or len(self.embed(["the size of a vector"])[0])  # loads the model
                coll.set_embedding(self.embed_model, dim)
            return Indexer(coll, embed=self.embed, embed_model=self.embed_model, on_progress=self.on_progress,
                           cancel=self.cancelled).run(self.roots)

    def _run(self) -> None:
        try:
            self.report = self.run_here()
        except KnownError as e:
            self.error = e
        except OSError as e:
            self.error = KnownError(f"indexing {self.name!r} failed: {e}")
        self.on_done(self.report, self.error)


class Watcher:
    """Re-index a collection when `poll()` finds it is time (every `every_s`); the caller decides where
    poll runs (the terminal chat before each question, the window on a timer or a file-watcher signal)."""

    def __init__(self, name: str, *, every_s: float = 10.0, embed: Embedder | None = None, embed_model: str = "",
                 root_dir: Path | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.every_s = every_s
        self.embed = embed
        self.embed_model = embed_model
        self.root_dir = root_dir
        self.clock = clock
        self.last = -float("inf")
        self.cancel = threading.Event()

    def due(self) -> bool:
        return self.clock() - self.last >= self.every_s

    def poll(self, *, force: bool = False) -> Report | None:
        """An incremental pass if it is due (or forced); its report, None when not run."""
        if not force and not self.due():
            return None
        self.last = self.clock()
        with Collection.open(self.name, root=self.root_dir) as coll:
            embed = self.embed if self.embed_model and self.embed_model == coll.embed_model else None
            return Indexer(coll, embed=embed, embed_model=self.embed_model, cancel=self.cancel).run()


def describe(p: Progress) -> str:
    """One line: '120/400 files, 35 MB of 120 MB, 1,234 passages, about 2 min left'."""
    if p.phase == "scanning":
        return f"scanning: {p.files_total:,} files found ({p.bytes_total / 1e6:,.1f} MB)"
    eta = "" if p.eta_s is None else f", {eta_text(p.eta_s)}"
    return (f"{p.files_done:,}/{p.files_total:,} files, {p.bytes_done / 1e6:,.1f} of {p.bytes_total / 1e6:,.1f} MB, "
            f"{p.chunks:,} passages{eta}")


def eta_text(seconds: float) -> str:
    if seconds < 1:
        return "almost done"
    if seconds < 90:
        return f"about {seconds:.0f} s left"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min left"
    return f"about {seconds / 3600:.1f} h left"


def summary(report: Report) -> str:
    what = (f"{report.added} added, {report.updated} updated, {report.unchanged} unchanged, {report.removed} removed, "
            f"{len(report.notes)} skipped; {report.chunks:,} passages written")
    return ("cancelled: " if report.cancelled else "") + what
