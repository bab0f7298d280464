"""Index files and folders into a collection: incremental (size + mtime, then sha256), streamed, cancellable.

A file is read a block (text) or a page (PDF) at a time and its passages are written as they are made,
inside the file's own transaction, so memory stays bounded whatever the folder's size and a cancel or
failure leaves every other file as it was. A file that cannot be read gets a note and is passed over.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ggufdesk.core.docs.chunk import Chunk, chunks
from ggufdesk.core.docs.extract import Skip, extract
from ggufdesk.core.docs.store import Collection, FileRow
from ggufdesk.core.docs.walk import Found, Note, walk
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.docs")

EMBED_BATCH = 32  # passages per embedding request
PROGRESS_EVERY_S = 0.2
EMPTY = "no text in it (an empty file)"
EMPTY_PDF = "no text in it (a scanned PDF without a text layer needs OCR, which ggufdesk does not do)"

Embedder = Callable[[list[str]], Sequence[Sequence[float]]]


class Cancelled(KnownError):
    """Indexing was cancelled: files finished before stay indexed, the one in progress keeps its old state."""


@dataclass(slots=True)
class Progress:
    """How far a run is: shown as a bar with a count and an ETA."""

    phase: str  # "scanning" | "indexing" | "done"
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    chunks: int = 0
    current: str = ""
    elapsed_s: float = 0.0
    eta_s: float | None = None  # None until there is a rate to go by


@dataclass(slots=True)
class Report:
    """What a run did. `notes` lists every file or folder passed over, with the reason."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    chunks: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    cancelled: bool = False
    vectors: str = ""  # "" when vectors were made, else why not
    notes: list[tuple[str, str]] = field(default_factory=list)
    touched: list[str] = field(default_factory=list)  # files whose passages were (re)written

    def as_dict(self) -> dict[str, object]:
        return {"added": self.added, "updated": self.updated, "unchanged": self.unchanged,
                "removed": self.removed, "chunks": self.chunks, "bytes_read": self.bytes_read,
                "seconds": round(self.seconds, 3), "cancelled": self.cancelled,
                "vectors": self.vectors or "on", "skipped": [{"path": p, "reason": r} for p, r in self.notes]}


def sha256_of(path: Path, cancel: threading.Event | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            if cancel is not None and cancel.is_set():
                raise Cancelled("indexing was cancelled")
    return h.hexdigest()


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


class Indexer:
    """One indexing run over a collection. `embed` (texts -> vectors) adds vectors with `embed_model`;
    without it the collection is BM25-only. `on_progress` is called from the indexing thread."""

    def __init__(self, coll: Collection, *, embed: Embedder | None = None, embed_model: str = "",
                 on_progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.coll = coll
        self.embed = embed
        self.embed_model = embed_model
        self.on_progress = on_progress or (lambda p: None)
        self.cancel = cancel or threading.Event()
        self.clock = clock
        self.report = Report()
        self.progress = Progress("scanning")
        self._t0 = 0.0
        self._shown = -1.0
        self._read = 0  # bytes actually read (the rate the ETA goes by)
        self._partial = 0  # bytes read so far of the file being indexed
        self._bytes_before = 0  # bytes of the files before it

    # ---- the run -----------------------------------------------------------------------------------

    def run(self, roots: Sequence[Path] | None = None) -> Report:
        """Index `roots` (added to the collection's roots) or, with none, the collection's own roots again."""
        self._t0 = self.clock()
        names = list(dict.fromkeys([*self.coll.roots, *(os.path.abspath(r) for r in roots or ())]))
        if roots:
            with self.coll.transaction():
                self.coll.set_meta("roots", names)
        self._prepare_vectors()
        found, missing_roots = self._scan(names)
        known = self.coll.files()
        try:
            done = 0
            for item in found:
                self._check_cancel()
                self._one(item, known.get(str(item.path)))
                done += item.size
                self.progress.files_done += 1
                self._bytes_before = done
                self._show(force=True)
            self._remove_gone(known, {str(f.path) for f in found}, [r for r in names if r not in missing_roots])
        except Cancelled:
            self.report.cancelled = True
        self.progress.phase = "done"
        self._show(force=True)
        self.report.seconds = self.clock() - self._t0
        return self.report

    def _prepare_vectors(self) -> None:
        if self.embed is None:
            self.report.vectors = "no embedding model: BM25 (keyword) search only"
        elif self.coll.vec_missing:
            self.report.vectors = f"vectors are not available ({self.coll.vec_missing}): BM25 search only"
            self.embed = None

    def _scan(self, roots: list[str]) -> tuple[list[Found], set[str]]:
        found: list[Found] = []
        missing: set[str] = set()
        for item in walk(Path(r) for r in roots):
            if isinstance(item, Note):
                self.report.notes.append((str(item.path), item.reason))
                if str(item.path) in roots:
                    missing.add(str(item.path))
                continue
            found.append(item)
            self.progress.files_total += 1
            self.progress.bytes_total += item.size
            self._show()
            self._check_cancel()
        self.progress.phase = "indexing"
        return found, missing

    def _remove_gone(self, known: dict[str, FileRow], present: set[str], walked: list[str]) -> None:
        for path in known:
            if path not in present and _under(path, walked) and not os.path.exists(path):
                self.coll.remove_file(path)
                self.report.removed += 1
            elif path not in present and not _under(path, self.coll.roots):
                self.coll.remove_file(path)  # its root was removed from the collection
                self.report.removed += 1

    # ---- one file ----------------------------------------------------------------------------------

    def _one(self, item: Found, row: FileRow | None) -> None:
        path = str(item.path)
        self.progress.current = path
        if row is not None and row.size == item.size and row.mtime_ns == item.mtime_ns:
            if row.note:
                self.report.notes.append((path, row.note))
            elif self.embed is not None and row.chunks and row.vec_model != self.embed_model:
                self._vectors_for(row)
            self.report.unchanged += 1
            return
        try:
            digest = sha256_of(item.path, self.cancel)
        except OSError as e:
            return self._unreadable(path, row, e)
        if row is not None and row.sha256 == digest and not row.note:
            self.coll.touch_file(path, size=item.size, mtime_ns=item.mtime_ns)
            self.report.unchanged += 1
            return
        self._index(item, digest, row)

    def _unreadable(self, path: str, row: FileRow | None, e: OSError) -> None:
        if isinstance(e, FileNotFoundError):
            reason = "went away while indexing"
            if row is not None:
                self.coll.remove_file(path)
                self.report.removed += 1
        else:
            reason = f"cannot be read ({e.strerror or e})"
        self.report.notes.append((path, reason))

    def _index(self, item: Found, digest: str, row: FileRow | None) -> None:
        path = str(item.path)
        try:
            note = self._write(item, digest)
        except _EmbedFailed:  # the embedding engine failed on this file: once more without vectors
            note = self._write(item, digest)
        except OSError as e:
            return self._unreadable(path, row, e)
        finally:
            self._partial = 0
        self._read += item.size
        self.report.bytes_read += item.size
        if note:
            self.report.notes.append((path, note))
            return
        self.report.touched.append(path)
        if row is None:
            self.report.added += 1
        else:
            self.report.updated += 1

    def _write(self, item: Found, digest: str) -> str:
        """Read, chunk and store one file in its transaction; returns why it was passed over ("" if not)."""
        note = ""
        size = item.size

        def where(fraction: float) -> None:
            self._partial = int(fraction * size)

        try:
            with self.coll.replace_file(str(item.path), kind=item.kind, size=size, mtime_ns=item.mtime_ns,
                                        sha256=digest) as w:
                for batch in self._batches(chunks(extract(item.path, item.kind, where))):
                    w.add(batch, self._vectors(batch))
                    self.report.chunks += len(batch)
                    self.progress.chunks += len(batch)
                    self._show()
                if not w.count:
                    note = w.note = EMPTY if item.kind != "pdf" else EMPTY_PDF
        except Skip as e:  # nothing of the file is kept: a PDF whose later page failed is not half-read
            note = str(e)
        except (OSError, KnownError):
            raise
        except Exception as e:  # a document that crashes its reader must not stop the others
            log.warning("%s could not be read", item.path, exc_info=True)
            note = f"could not be read ({type(e).__name__}: {e})"
        if note and note not in (EMPTY, EMPTY_PDF):
            self._note_only(item, digest, note)
        return note

    def _note_only(self, item: Found, digest: str, note: str) -> None:
        with self.coll.replace_file(str(item.path), kind=item.kind, size=item.size, mtime_ns=item.mtime_ns,
                                    sha256=digest) as w:
            w.note = note

    def _batches(self, items: Iterable[Chunk]) -> Iterable[list[Chunk]]:
        batch: list[Chunk] = []
        for ch in items:
            batch.append(ch)
            if len(batch) >= EMBED_BATCH:
                self._check_cancel()
                yield batch
                batch = []
        if batch:
            yield batch

    def _vectors(self, batch: list[Chunk]) -> Sequence[Sequence[float]] | None:
        if self.embed is None:
            return None
        try:
            vectors = self.embed([c.text for c in batch])
        except KnownError as e:  # the embedding engine failed: go on with BM25, fill vectors in next time
            log.warning("embeddings failed: %s", e)
            self.report.vectors = f"embeddings failed ({e}): the rest of this run is BM25 only"
            self.embed = None
            raise _EmbedFailed from e
        return vectors

    def _vectors_for(self, row: FileRow) -> None:
        """Vectors for passages indexed before the embedding model was chosen (no re-reading)."""
        assert self.embed is not None
        pairs = self.coll.passages_of(row.id)
        done: list[tuple[int, Sequence[float]]] = []
        for i in range(0, len(pairs), EMBED_BATCH):
            self._check_cancel()
            part = pairs[i:i + EMBED_BATCH]
            vectors = self.embed([t for _, t in part])
            done += [(cid, v) for (cid, _), v in zip(part, vectors)]
        self.coll.add_vectors(row.id, self.embed_model, done)

    # ---- progress ----------------------------------------------------------------------------------

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Cancelled("indexing was cancelled")

    def _show(self, *, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._shown < PROGRESS_EVERY_S:
            return
        self._shown = now
        p = self.progress
        p.elapsed_s = now - self._t0
        p.bytes_done = self._bytes_before + self._partial
        read = self._read + self._partial
        left = p.bytes_total - p.bytes_done
        p.eta_s = left / (read / p.elapsed_s) if read and p.elapsed_s > 0 else None
        self.on_progress(p)


class _EmbedFailed(KnownError):
    """Internal: the file being indexed is retried without vectors."""
