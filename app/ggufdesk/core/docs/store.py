"""A collection's index: one SQLite file holding its files, their passages, FTS5 (BM25) and sqlite-vec vectors.

Every change to one file (its passages, their text and vectors, its row) is one transaction: a crash,
a cancel or a full disk in the middle leaves the file's previous passages in place, and searches read
the last committed state meanwhile (WAL). Collections live in the data directory, one file each
(`docs/NAME.sqlite3`); deleting a collection deletes that file and its WAL companions.
"""
from __future__ import annotations

import json
import logging
import os
import re
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from ggufdesk.core.docs import db
from ggufdesk.core.docs.chunk import Chunk
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.docs")

SCHEMA_VERSION = 1
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
  id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL, sha256 TEXT NOT NULL, chunks INTEGER NOT NULL DEFAULT 0,
  note TEXT NOT NULL DEFAULT '', vec_model TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS chunks (
  id INTEGER PRIMARY KEY, file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
  page INTEGER NOT NULL, line_start INTEGER NOT NULL, line_end INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, tokenize = 'porter unicode61 remove_diacritics 2');
"""


class CollectionError(KnownError):
    """A collection that does not exist, has a bad name, or cannot be opened."""


class IndexFull(KnownError):
    """The disk (or the index's size limit) filled while writing: the index keeps its previous state."""


@dataclass(frozen=True, slots=True)
class FileRow:
    id: int
    path: str
    kind: str
    size: int
    mtime_ns: int
    sha256: str
    chunks: int
    note: str
    vec_model: str


@dataclass(frozen=True, slots=True)
class Passage:
    """A stored passage as a search returns it (score: higher is better, its meaning depends on the search)."""

    id: int
    source: str
    page: int
    line_start: int
    line_end: int
    text: str
    score: float = 0.0


def docs_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("ggufdesk", appauthor=False)) / "docs"


def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise CollectionError(f"{name!r} is not a collection name: use 1-64 letters, digits, '_', '.' or '-', "
                              "starting with a letter or digit")
    return name


def collection_path(name: str, root: Path | None = None) -> Path:
    return (root or docs_dir()) / f"{check_name(name)}.sqlite3"


def list_collections(root: Path | None = None) -> list[str]:
    folder = root or docs_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name[:-len(".sqlite3")] for p in folder.glob("*.sqlite3") if NAME_RE.match(p.stem))


def delete_collection(name: str, root: Path | None = None) -> bool:
    """Delete a collection's files; False when there was none."""
    path = collection_path(name, root)
    existed = path.exists()
    for extra in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(f"{path}{extra}")
        except FileNotFoundError:
            pass
    return existed


def pack(vector: Sequence[float]) -> bytes:
    return struct.pack(f"{len(vector)}f", *vector)


class Collection:
    """An open collection index. Not thread-safe: one per thread (SQLite handles the rest)."""

    def __init__(self, path: Path, *, create: bool = False, vectors: bool = True) -> None:
        self.path = path
        if not create and not path.exists():
            raise CollectionError(f"there is no collection {path.stem!r}; make one with 'ggufdesk docs add "
                                  f"{path.stem} PATH...'")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn, self.vec_missing = db.connect(path, vectors=vectors)
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise CollectionError(f"the collection {path.stem!r} was made by a newer ggufdesk")
            if version < SCHEMA_VERSION:
                with self.transaction():
                    self._create()
        except db.Error as e:
            raise CollectionError(f"the collection {path.stem!r} cannot be opened ({e})") from None

    def _create(self) -> None:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                self.conn.execute(statement)
        self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @classmethod
    def open(cls, name: str, *, create: bool = False, root: Path | None = None) -> Collection:
        return cls(collection_path(name, root), create=create)

    @property
    def name(self) -> str:
        return self.path.stem

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Collection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error; a full disk becomes IndexFull."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException as e:
            try:
                self.conn.execute("ROLLBACK")
            except db.Error:
                pass  # SQLite rolled back already
            if isinstance(e, db.Error) and db.is_full(e):
                raise IndexFull(f"the disk is full (writing {self.path}): the index keeps its previous "
                                "state; free some space and index again") from None
            raise

    # ---- meta ------------------------------------------------------------------------------------------

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, key: str, value: Any) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    @property
    def roots(self) -> list[str]:
        return list(self.get_meta("roots", []))

    @property
    def embed_model(self) -> str:
        """The embedding model the vectors were made with ("" when the collection has none)."""
        return str(self.get_meta("embed_model", ""))

    @property
    def has_vectors(self) -> bool:
        return not self.vec_missing and bool(self.embed_model) and self._vec_table_exists()

    def _vec_table_exists(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'chunks_vec'").fetchone() is not None

    def set_embedding(self, model: str, dim: int) -> None:
        """Use `model` (vectors of `dim` floats) from now on; vectors of another model are dropped."""
        if self.vec_missing:
            raise CollectionError(f"vectors are not available: {self.vec_missing}")
        if model == self.embed_model and self.get_meta("embed_dim") == dim and self._vec_table_exists():
            return
        with self.transaction() as c:
            c.execute("DROP TABLE IF EXISTS chunks_vec")
            c.execute(f"CREATE VIRTUAL TABLE chunks_vec USING vec0(embedding float[{int(dim)}] "
                      "distance_metric=cosine)")
            c.execute("UPDATE files SET vec_model = ''")
            self.set_meta("embed_model", model)
            self.set_meta("embed_dim", int(dim))

    # ---- files -----------------------------------------------------------------------------------------

    def files(self) -> dict[str, FileRow]:
        rows = self.conn.execute("SELECT id, path, kind, size, mtime_ns, sha256, chunks, note, vec_model FROM files")
        return {r[1]: FileRow(*r) for r in rows}

    def stats(self) -> dict[str, Any]:
        files, skipped, chunks = self.conn.execute(
            "SELECT count(*), sum(note != ''), coalesce(sum(chunks), 0) FROM files").fetchone()
        return {"name": self.name, "roots": self.roots, "files": files, "skipped": skipped or 0,
                "chunks": chunks, "embed_model": self.embed_model, "vectors": self.has_vectors,
                "bytes": self.disk_bytes()}

    def disk_bytes(self) -> int:
        return sum(os.path.getsize(f"{self.path}{x}") for x in ("", "-wal") if os.path.exists(f"{self.path}{x}"))

    def _drop_chunks(self, file_id: int) -> None:
        c = self.conn
        ids = [r[0] for r in c.execute("SELECT id FROM chunks WHERE file_id = ?", (file_id,))]
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            marks = ",".join("?" * len(part))
            c.execute(f"DELETE FROM chunks_fts WHERE rowid IN ({marks})", part)
            if self.has_vectors:
                c.execute(f"DELETE FROM chunks_vec WHERE rowid IN ({marks})", part)
        c.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))

    def remove_file(self, path: str) -> None:
        with self.transaction() as c:
            row = c.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
            if row:
                self._drop_chunks(row[0])
                c.execute("DELETE FROM files WHERE id = ?", (row[0],))

    def touch_file(self, path: str, *, size: int, mtime_ns: int) -> None:
        """The file's content is unchanged (same hash): only its size and time are new."""
        with self.transaction() as c:
            c.execute("UPDATE files SET size = ?, mtime_ns = ? WHERE path = ?", (size, mtime_ns, path))

    @contextmanager
    def replace_file(self, path: str, *, kind: str, size: int, mtime_ns: int, sha256: str) -> Iterator[FileWriter]:
        """Replace a file's passages in one transaction: `w.add(chunks, vectors)` as they are made."""
        with self.transaction() as c:
            row = c.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
            if row:
                self._drop_chunks(row[0])
                file_id = row[0]
                c.execute("UPDATE files SET kind = ?, size = ?, mtime_ns = ?, sha256 = ?, chunks = 0, note = '', "
                          "vec_model = '' WHERE id = ?", (kind, size, mtime_ns, sha256, file_id))
            else:
                file_id = c.execute("INSERT INTO files (path, kind, size, mtime_ns, sha256) VALUES (?, ?, ?, ?, ?)",
                                    (path, kind, size, mtime_ns, sha256)).lastrowid
            writer = FileWriter(self, file_id)
            yield writer
            c.execute("UPDATE files SET chunks = ?, note = ?, vec_model = ? WHERE id = ?",
                      (writer.count, writer.note, writer.vec_model, file_id))

    def add_vectors(self, file_id: int, model: str, vectors: list[tuple[int, Sequence[float]]]) -> None:
        """Vectors for a file's passages made after the passages were (a model chosen later)."""
        with self.transaction() as c:
            c.executemany("INSERT OR REPLACE INTO chunks_vec (rowid, embedding) VALUES (?, ?)",
                          [(cid, pack(v)) for cid, v in vectors])
            c.execute("UPDATE files SET vec_model = ? WHERE id = ?", (model, file_id))

    def passages_of(self, file_id: int) -> list[tuple[int, str]]:
        return [(r[0], r[1]) for r in self.conn.execute(
            "SELECT c.id, f.text FROM chunks c JOIN chunks_fts f ON f.rowid = c.id WHERE c.file_id = ? ORDER BY c.id",
            (file_id,))]

    # ---- search ----------------------------------------------------------------------------------------

    def _passages(self, scored: list[tuple[int, float]]) -> list[Passage]:
        if not scored:
            return []
        marks = ",".join("?" * len(scored))
        rows = self.conn.execute(
            f"SELECT c.id, fl.path, c.page, c.line_start, c.line_end, f.text FROM chunks c "
            f"JOIN files fl ON fl.id = c.file_id JOIN chunks_fts f ON f.rowid = c.id WHERE c.id IN ({marks})",
            [cid for cid, _ in scored])
        by_id = {r[0]: r for r in rows}
        out = []
        for cid, score in scored:
            if cid in by_id:
                _, source, page, start, end, text = by_id[cid]
                out.append(Passage(cid, source, page, start, end, text, score))
        return out

    @contextmanager
    def _reading(self) -> Iterator[None]:
        try:
            yield
        except db.Error as e:  # locked for too long, damaged, closed: the user's to know, not a bug
            raise CollectionError(f"the collection {self.name!r} cannot be searched ({e})") from None

    def search_text(self, match: str, k: int) -> list[Passage]:
        """BM25 over the passages for an FTS5 MATCH expression; score = -bm25 (higher is better)."""
        if not match:
            return []
        with self._reading():
            rows = self.conn.execute("SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? "
                                     "ORDER BY bm25(chunks_fts) LIMIT ?", (match, k)).fetchall()
            return self._passages([(r[0], -float(r[1])) for r in rows])

    def search_vector(self, vector: Sequence[float], k: int) -> list[Passage]:
        """Nearest passages by cosine distance; score = 1 - distance (higher is better)."""
        with self._reading():
            if not self.has_vectors:
                return []
            rows = self.conn.execute("SELECT rowid, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ? "
                                     "ORDER BY distance", (pack(vector), k)).fetchall()
            return self._passages([(r[0], 1.0 - float(r[1])) for r in rows])

    def passage(self, chunk_id: int) -> Passage | None:
        found = self._passages([(chunk_id, 0.0)])
        return found[0] if found else None


class FileWriter:
    """Adds one file's passages inside its replace_file transaction."""

    def __init__(self, coll: Collection, file_id: int) -> None:
        self.coll = coll
        self.file_id = file_id
        self.count = 0
        self.note = ""
        self.vec_model = ""

    def add(self, chunks: Sequence[Chunk], vectors: Sequence[Sequence[float]] | None = None) -> list[int]:
        c = self.coll.conn
        ids = []
        for ch in chunks:
            cid = c.execute("INSERT INTO chunks (file_id, page, line_start, line_end) VALUES (?, ?, ?, ?)",
                            (self.file_id, ch.page, ch.line_start, ch.line_end)).lastrowid
            c.execute("INSERT INTO chunks_fts (rowid, text) VALUES (?, ?)", (cid, ch.text))
            ids.append(cid)
        if vectors is not None:
            c.executemany("INSERT INTO chunks_vec (rowid, embedding) VALUES (?, ?)",
                          [(cid, pack(v)) for cid, v in zip(ids, vectors)])
            self.vec_model = self.coll.embed_model
        self.count += len(ids)
        return ids
