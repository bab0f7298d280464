"""Conversations in SQLite (WAL, schema version in PRAGMA user_version): the chat history."""
from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from ggufdesk.core.aside import move_aside
from ggufdesk.core.errors import BugError, KnownError, SettingsError
from ggufdesk.core.image_store import ImageStore, images_of
from ggufdesk.core.images import to_data_url
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.core.wording import role_name, state_note

log = logging.getLogger("ggufdesk.history")
_T = TypeVar("_T")

MODES = ("chat", "completion")
ROLES = ("system", "user", "assistant", "tool")  # "tool": an MCP tool's result (stats name the call)
# "streaming": being written now; "partial": the engine stopped mid-answer; "cancelled": user stop.
STATUSES = ("done", "streaming", "partial", "cancelled", "error")

# Each entry moves the schema from version i to i+1; all run inside one transaction.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        sampling TEXT NOT NULL DEFAULT '{}',
        mode TEXT NOT NULL DEFAULT 'chat'
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created REAL NOT NULL,
        status TEXT NOT NULL DEFAULT 'done'
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    """
    ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE conversations ADD COLUMN model TEXT NOT NULL DEFAULT '';
    """,
    # Regenerate and edit keep what they replace: the replaced message and the turns after it
    # become an earlier version (message_versions), stepped through in the window.
    """
    ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE message_versions (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        ordinal INTEGER NOT NULL,
        turns TEXT NOT NULL
    );
    CREATE INDEX versions_by_position ON message_versions(conversation_id, position);
    """,
    # MCP servers a conversation does not use (a JSON list of names; all enabled servers by default).
    """
    ALTER TABLE conversations ADD COLUMN mcp_off TEXT NOT NULL DEFAULT '[]';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(slots=True, kw_only=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    system_prompt: str = ""
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    mode: str = "chat"
    model: str = ""
    mcp_off: tuple[str, ...] = ()  # MCP servers turned off in this conversation


@dataclass(slots=True, kw_only=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    created: float
    status: str = "done"
    stats: dict[str, Any] = field(default_factory=dict)


def history_path() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("ggufdesk")) / "history.sqlite3"


def _names_from_json(text: str) -> tuple[str, ...]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return ()
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _sampling_from_json(text: str) -> SamplingSettings:
    try:
        return SamplingSettings(**json.loads(text or "{}"))
    except (ValueError, TypeError, SettingsError) as e:  # an old or hand-edited row
        log.warning("ignoring stored sampling settings (%s); using defaults", e)
        return SamplingSettings()


class HistoryError(KnownError):
    """The history database cannot be used as it is; ``kind`` says why."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # "locked" | "read_only" | "corrupt" | "newer" | "unavailable"


def _classify(e: BaseException) -> str:
    name = getattr(e, "sqlite_errorname", "") or ""
    text = str(e).lower()
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED") or "locked" in text:
        return "locked"
    if name.startswith("SQLITE_READONLY") or "readonly" in text or "read-only" in text:
        return "read_only"
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or "not a database" in text or "malformed" in text:
        return "corrupt"
    return "unavailable"  # SQLITE_CANTOPEN, I/O errors, a folder we cannot write


@dataclass(frozen=True, slots=True)
class HistoryOpen:
    """How History.open got a history: ``mode`` "ok" | "read_only" | "recovered" | "memory", and what
    to tell the user (``warning``; None when all is well)."""

    history: History
    mode: str = "ok"
    warning: str | None = None
    moved_to: Path | None = None


class History:
    """All conversations. Thread-safe: one connection guarded by a lock (reads run off the GUI thread).

    ``read_only`` opens an existing file without writing to it (writes raise HistoryError);
    ``memory`` keeps everything in memory (nothing is saved). ``History.open`` picks for the app.
    """

    def __init__(self, path: Path | None = None, *, read_only: bool = False, memory: bool = False,
                 timeout: float = 5.0) -> None:
        self.path = Path(path) if path else history_path()
        self.read_only, self.memory = read_only, memory
        self._lock = threading.RLock()
        # the messages' images, by sha256, beside the database (core/image_store.py)
        self.images = ImageStore(None if memory else self.path.parent / "images")
        self._savepoints = 0
        db: sqlite3.Connection | None = None
        try:
            if memory:
                db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            elif read_only:
                db = self._connect_read_only(timeout)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=timeout)
            self._db = db
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            if not read_only:
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
            if not read_only:
                self._recover_interrupted()
            else:
                self._db.execute("SELECT count(*) FROM conversations").fetchone()  # readable at all?
        except (sqlite3.Error, OSError) as e:
            if db is not None:
                db.close()
            kind = "unavailable" if isinstance(e, OSError) else _classify(e)
            raise HistoryError(f"the chat history {self.path} cannot be opened: {e}", kind) from e

    def _connect_read_only(self, timeout: float) -> sqlite3.Connection:
        from urllib.parse import quote

        if not self.path.is_file():
            raise HistoryError(f"the chat history {self.path} does not exist", "unavailable")
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None, timeout=timeout)
        try:
            db.execute("PRAGMA user_version").fetchone()
            return db
        except sqlite3.OperationalError:  # a WAL file in a read-only folder: read the file as it is
            db.close()
            return sqlite3.connect(uri + "&immutable=1", uri=True, check_same_thread=False,
                                   isolation_level=None, timeout=timeout)

    @classmethod
    def open(cls, path: Path | None = None, *, timeout: float = 5.0) -> HistoryOpen:
        """The history for the app to start with; never raises, never deletes anything.

        Locked by another program, read-only or written by a newer version: opened read-only
        (browsing works, new chats are not saved). Damaged: moved aside to
        ``<name>.broken-<time>`` and a new, empty history started. Not even readable: in memory.
        """
        path = Path(path) if path else history_path()
        try:
            return HistoryOpen(cls(path, timeout=timeout))
        except HistoryError as e:
            first = e
        if first.kind == "corrupt":
            moved = _move_aside(path)
            if moved is not None:
                try:
                    return HistoryOpen(cls(path, timeout=timeout), "recovered",
                                       f"The chat history was damaged ({first.__cause__}). It was moved to "
                                       f"{moved} (nothing was deleted) and a new history was started.", moved)
                except HistoryError as e:
                    first = e
        else:
            why = {"locked": "is locked by another program", "read_only": "cannot be written",
                   "newer": "was written by a newer ggufdesk"}.get(first.kind, "cannot be written")
            try:
                return HistoryOpen(cls(path, read_only=True, timeout=timeout), "read_only",
                                   f"The chat history {why} ({first.__cause__ or first}). It is open read-only: "
                                   "you can read past chats, but new ones are not saved until you restart "
                                   "ggufdesk once that is fixed.")
            except HistoryError:
                pass
        return HistoryOpen(cls(path, memory=True), "memory",
                           f"The chat history cannot be used ({first.__cause__ or first}). Chats in this "
                           "session are kept in memory only and are lost when ggufdesk closes.")

    def _writable(self) -> None:
        if self.read_only:
            raise HistoryError(f"the chat history {self.path} is open read-only; this change is not saved",
                               "read_only")

    # ---- transactions -------------------------------------------------------------------------

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Everything written inside is saved together or not at all: one transaction (a savepoint
        when nested). A user action (send, regenerate, edit) is one `atomic` block, so a crash or a
        full disk halfway leaves the history as it was before the action, never half of it."""
        with self._lock:
            if self._db.in_transaction:
                self._savepoints += 1
                name = f"sp{self._savepoints}"
                self._db.execute(f"SAVEPOINT {name}")
                try:
                    yield
                except BaseException:
                    if self._db.in_transaction:  # an error may have rolled it all back already
                        self._quietly(f"ROLLBACK TO {name}", f"RELEASE {name}")
                    raise
                else:
                    self._db.execute(f"RELEASE {name}")
                finally:
                    self._savepoints -= 1
                return
            self._writable()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite rolls back by itself on some errors (a full disk, an I/O error): then there
                # is nothing to roll back, and the error to report is the one that happened.
                if self._db.in_transaction:
                    self._quietly("ROLLBACK")
                raise

    def _quietly(self, *statements: str) -> None:
        """Clean-up statements after an error: their own failure must not hide the error."""
        for sql in statements:
            try:
                self._db.execute(sql)
            except sqlite3.Error as e:
                log.warning("%s failed after an error: %s", sql, e)

    # ---- schema -------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION and not self.read_only:
            raise HistoryError(
                f"the chat history {self.path} was written by a newer ggufdesk "
                f"(schema {version}, this version knows {SCHEMA_VERSION}); update ggufdesk", "newer"
            )
        if version >= SCHEMA_VERSION or self.read_only:
            if version < SCHEMA_VERSION:
                raise HistoryError(f"the chat history {self.path} needs an upgrade it cannot get read-only",
                                   "read_only")
            return
        log.info("migrating %s from schema %d to %d", self.path, version, SCHEMA_VERSION)
        with self.atomic():
            for i in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _recover_interrupted(self) -> None:
        """Answers left 'streaming' by a previous run that died keep their text as 'partial'."""
        with self._lock:
            self._db.execute("UPDATE messages SET status='partial' WHERE status='streaming'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- conversations ------------------------------------------------------------------------

    def _conversation(self, row: sqlite3.Row) -> Conversation:
        return Conversation(
            id=row["id"], title=row["title"], created=row["created"], updated=row["updated"],
            system_prompt=row["system_prompt"], sampling=_sampling_from_json(row["sampling"]),
            mode=row["mode"], model=row["model"], mcp_off=_names_from_json(row["mcp_off"]),
        )

    def new_conversation(
        self, title: str = "New chat", *, system_prompt: str = "",
        sampling: SamplingSettings | None = None, mode: str = "chat", model: str = "",
        mcp_off: tuple[str, ...] = (),
    ) -> Conversation:
        if mode not in MODES:
            raise SettingsError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        now = time.time()
        sampling = sampling or SamplingSettings()
        self._writable()
        with self.atomic():
            cur = self._db.execute(
                "INSERT INTO conversations(title, created, updated, system_prompt, sampling, mode, model, mcp_off)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, json.dumps(dataclasses.asdict(sampling)), mode, model,
                 json.dumps(list(mcp_off))),
            )
            return self.get_conversation(int(cur.lastrowid or 0))

    def get_conversation(self, conversation_id: int) -> Conversation:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return self._conversation(row)

    def list_conversations(self, query: str = "") -> list[Conversation]:
        """Most recently updated first; `query` matches titles and message text (case-insensitive)."""
        with self._lock:
            if not query.strip():
                rows = self._db.execute(
                    "SELECT * FROM conversations ORDER BY updated DESC, id DESC"
                ).fetchall()
            else:
                pattern = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace(
                    "_", "\\_") + "%"
                rows = self._db.execute(
                    "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS ("
                    " SELECT 1 FROM messages m WHERE m.conversation_id = c.id"
                    " AND m.content LIKE ?1 ESCAPE '\\') ORDER BY updated DESC, id DESC",
                    (pattern,),
                ).fetchall()
        return [self._conversation(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        self.update_conversation(conversation_id, title=title)

    def update_conversation(
        self, conversation_id: int, *, title: str | None = None, system_prompt: str | None = None,
        sampling: SamplingSettings | None = None, mode: str | None = None, model: str | None = None,
        mcp_off: tuple[str, ...] | None = None,
    ) -> Conversation:
        changes: dict[str, Any] = {}
        if title is not None:
            changes["title"] = title.strip() or "Untitled"
        if system_prompt is not None:
            changes["system_prompt"] = system_prompt
        if sampling is not None:
            changes["sampling"] = json.dumps(dataclasses.asdict(sampling))
        if mode is not None:
            if mode not in MODES:
                raise SettingsError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
            changes["mode"] = mode
        if model is not None:
            changes["model"] = model
        if mcp_off is not None:
            changes["mcp_off"] = json.dumps(list(mcp_off))
        changes["updated"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in changes)
        self._writable()
        with self.atomic():
            cur = self._db.execute(
                f"UPDATE conversations SET {sets} WHERE id = ?", (*changes.values(), conversation_id)
            )
            if cur.rowcount == 0:
                raise KeyError(conversation_id)
            return self.get_conversation(conversation_id)

    def delete(self, conversation_id: int) -> None:
        self._writable()
        with self.atomic():
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ---- messages -----------------------------------------------------------------------------

    def _message(self, row: sqlite3.Row) -> Message:
        try:
            stats = json.loads(row["stats"] or "{}")
        except ValueError:
            stats = {}
        return Message(
            id=row["id"], conversation_id=row["conversation_id"], role=row["role"],
            content=row["content"], created=row["created"], status=row["status"], stats=stats,
        )

    def messages(self, conversation_id: int) -> list[Message]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
            ).fetchall()
        return [self._message(r) for r in rows]

    def get_message(self, message_id: int) -> Message:
        with self._lock:
            row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        return self._message(row)

    def add_message(
        self, conversation_id: int, role: str, content: str, *, status: str = "done",
        stats: dict[str, Any] | None = None, version: int = 0,
    ) -> Message:
        """Insert and commit at once (one transaction with the conversation's `updated`): a user
        message is on disk before generation starts, or nothing is. `version`: its ordinal among
        the versions at its place (keep_as_version gives it)."""
        if role not in ROLES:
            raise BugError(f"unknown role {role!r}")
        if status not in STATUSES:
            raise BugError(f"unknown status {status!r}")
        now = time.time()
        self._writable()
        with self.atomic():
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, role, content, created, status, stats, version)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, now, status, json.dumps(stats or {}), version),
            )
            self._db.execute(
                "UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id)
            )
            return self.get_message(int(cur.lastrowid or 0))

    def update_message(
        self, message_id: int, *, content: str | None = None, status: str | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        changes: dict[str, Any] = {}
        if content is not None:
            changes["content"] = content
        if status is not None:
            if status not in STATUSES:
                raise BugError(f"unknown status {status!r}")
            changes["status"] = status
        if stats is not None:
            changes["stats"] = json.dumps(stats)
        if not changes:
            return
        sets = ", ".join(f"{k} = ?" for k in changes)
        self._writable()
        with self.atomic():
            self._db.execute(f"UPDATE messages SET {sets} WHERE id = ?", (*changes.values(), message_id))

    def truncate_from(self, conversation_id: int, message_id: int) -> None:
        """Delete a message and everything after it (regenerate, edit-and-resend)."""
        self._writable()
        with self.atomic():
            self._db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                (conversation_id, message_id),
            )

    # ---- versions (regenerate / edit keep what they replace) -----------------------------------

    def _position(self, conversation_id: int, message_id: int) -> int:
        return int(self._db.execute(
            "SELECT COUNT(*) FROM messages WHERE conversation_id = ? AND id < ?",
            (conversation_id, message_id)).fetchone()[0])

    def _ordinals(self, conversation_id: int, position: int) -> list[int]:
        return [int(r[0]) for r in self._db.execute(
            "SELECT ordinal FROM message_versions WHERE conversation_id = ? AND position = ?",
            (conversation_id, position))]

    def _stash(self, conversation_id: int, message_id: int) -> tuple[int, int]:
        """Move the message and everything after it (with their own versions) into a version
        record; returns (position, its ordinal). Runs inside the caller's transaction."""
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? AND id >= ? ORDER BY id",
            (conversation_id, message_id)).fetchall()
        if not rows or rows[0]["id"] != message_id:
            raise KeyError(message_id)
        pos = self._position(conversation_id, message_id)
        nested = self._db.execute(
            "SELECT position, ordinal, turns FROM message_versions WHERE conversation_id = ? "
            "AND position > ?", (conversation_id, pos)).fetchall()
        record = {
            "turns": [{k: r[k] for k in ("role", "content", "created", "status", "stats", "version")}
                      for r in rows],
            "nested": [dict(n) for n in nested],
        }
        ordinal = int(rows[0]["version"])
        self._db.execute("INSERT INTO message_versions(conversation_id, position, ordinal, turns) "
                         "VALUES (?, ?, ?, ?)", (conversation_id, pos, ordinal, json.dumps(record)))
        self._db.execute("DELETE FROM message_versions WHERE conversation_id = ? AND position > ?",
                         (conversation_id, pos))
        self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                         (conversation_id, message_id))
        return pos, ordinal

    def _transaction(self, fn: Callable[[], _T]) -> _T:
        self._writable()
        with self.atomic():
            return fn()

    def keep_as_version(self, conversation_id: int, message_id: int) -> int:
        """Regenerate / edit: the message and the turns after it become an earlier version instead
        of being deleted. Returns the ordinal the replacing message gets (add_message's
        `version`); `replace_message` does both in one transaction."""
        def run() -> int:
            pos, ordinal = self._stash(conversation_id, message_id)
            return max([ordinal, *self._ordinals(conversation_id, pos)]) + 1

        return self._transaction(run)

    def replace_message(self, conversation_id: int, message_id: int, role: str, content: str, *,
                        status: str = "done", stats: dict[str, Any] | None = None) -> Message:
        """Regenerate / edit as one write: the message and what follows become an earlier version,
        and the new message takes its place, numbered as the next version."""
        with self.atomic():
            version = self.keep_as_version(conversation_id, message_id)
            return self.add_message(conversation_id, role, content, status=status, stats=stats,
                                    version=version)

    def set_version(self, message_id: int, ordinal: int) -> None:
        self._writable()
        with self.atomic():
            self._db.execute("UPDATE messages SET version = ? WHERE id = ?", (ordinal, message_id))

    def versions(self, conversation_id: int) -> dict[int, tuple[int, int]]:
        """{message id: (its version number, how many)} for messages that have earlier versions."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, version FROM messages WHERE conversation_id = ? ORDER BY id",
                (conversation_id,)).fetchall()
            out: dict[int, tuple[int, int]] = {}
            for pos, r in enumerate(rows):
                others = self._ordinals(conversation_id, pos)
                if others:
                    ordinals = sorted({*others, int(r["version"])})
                    out[int(r["id"])] = (ordinals.index(int(r["version"])) + 1, len(ordinals))
        return out

    def switch_version(self, conversation_id: int, message_id: int, step: int) -> list[Message]:
        """Show the previous (step -1) or next (+1) version of a message: the shown one and its
        later turns are kept as a version, the chosen one comes back with its own later turns."""
        def run() -> None:
            row = self._db.execute("SELECT version FROM messages WHERE id = ? AND conversation_id = ?",
                                   (message_id, conversation_id)).fetchone()
            if row is None:
                raise KeyError(message_id)
            pos, live = self._position(conversation_id, message_id), int(row["version"])
            ordinals = sorted({*self._ordinals(conversation_id, pos), live})
            i = ordinals.index(live) + step
            if not 0 <= i < len(ordinals) or step == 0:
                return
            target = ordinals[i]
            self._stash(conversation_id, message_id)
            rec = self._db.execute(
                "SELECT id, turns FROM message_versions WHERE conversation_id = ? AND position = ? "
                "AND ordinal = ? ORDER BY id DESC LIMIT 1", (conversation_id, pos, target)).fetchone()
            self._db.execute("DELETE FROM message_versions WHERE id = ?", (rec["id"],))
            record = json.loads(rec["turns"])
            for t in record["turns"]:
                self._db.execute(
                    "INSERT INTO messages(conversation_id, role, content, created, status, stats, "
                    "version) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (conversation_id, t["role"], t["content"], t["created"], t["status"],
                     t["stats"], t["version"]))
            for n in record["nested"]:
                self._db.execute("INSERT INTO message_versions(conversation_id, position, ordinal, "
                                 "turns) VALUES (?, ?, ?, ?)",
                                 (conversation_id, n["position"], n["ordinal"], n["turns"]))

        self._transaction(run)
        return self.messages(conversation_id)

    # ---- export -------------------------------------------------------------------------------

    def export_json(self, conversation_id: int) -> dict[str, Any]:
        """The conversation with its messages; the images they show as data: URLs under "images" (by sha256)."""
        conv = self.get_conversation(conversation_id)
        data = dataclasses.asdict(conv)
        msgs = self.messages(conversation_id)
        data["messages"] = [
            {k: v for k, v in dataclasses.asdict(m).items() if k != "conversation_id"}
            for m in msgs
        ]
        data["images"] = {}
        for key in dict.fromkeys(k for m in msgs for k in images_of(m.stats)):
            raw = self.images.get(key)
            data["images"][key] = to_data_url(raw) if raw is not None else None
        data["schema_version"] = SCHEMA_VERSION
        return data

    def _image_lines(self, m: Message, image_dir: Path | None) -> list[str]:
        """Markdown for a message's images: files written into image_dir (linked by relative path), or
        data: URLs when no folder is given; a missing image is said so."""
        lines = []
        for key in images_of(m.stats):
            raw = self.images.get(key)
            if raw is None:
                lines += [f"_(an image that is no longer in the history: {key[:12]}…)_", ""]
                continue
            if image_dir is None:
                lines += [f"![image]({to_data_url(raw)})", ""]
                continue
            src = self.images.path(key)
            name = src.name if src is not None else key + ".png"
            try:
                image_dir.mkdir(parents=True, exist_ok=True)
                (image_dir / name).write_bytes(raw)
            except OSError as e:
                raise KnownError(f"could not write the image into {image_dir}: {e.strerror or e}") from e
            lines += [f"![image]({image_dir.name}/{name})", ""]
        return lines

    def export_markdown(self, conversation_id: int, image_dir: Path | None = None) -> str:
        """The conversation as Markdown; images go into image_dir (a folder beside the file, linked
        relatively) or, without one, inline as data: URLs."""
        conv = self.get_conversation(conversation_id)
        lines = [f"# {conv.title}", ""]
        if conv.model:
            lines += [f"_Model: {Path(conv.model).name}_", ""]
        if conv.system_prompt:
            lines += ["**System:**", "", conv.system_prompt, ""]
        for m in self.messages(conversation_id):  # in the window's words (core/wording.py)
            note = state_note(m.status, str(m.stats.get("finish_reason") or ""))
            note = f" _({note})_" if note else ""
            if m.role == "tool":
                who = f"{m.stats.get('server', '')}/{m.stats.get('tool', '')}".strip("/")
                lines += [f"**Tool result ({who}):**{note}", "", "```", m.content, "```", ""]
                continue
            lines += [f"**{role_name(m.role, conv.mode)}:**{note}", "", *self._image_lines(m, image_dir), m.content, ""]
            for call in m.stats.get("tool_calls") or []:
                fn = (call.get("function") or {}) if isinstance(call, dict) else {}
                lines += [f"_Calls the tool {fn.get('name', '?')} with {fn.get('arguments', '{}')}_", ""]
        return "\n".join(lines).rstrip() + "\n"




def _move_aside(path: Path) -> Path | None:
    """Rename a damaged database (and its -wal/-shm files) to <name>.broken-<time>; never delete."""
    try:
        return move_aside(path, companions=("-wal", "-shm"))
    except OSError as e:
        log.warning("could not move the damaged history %s aside: %s", path, e)
        return None
