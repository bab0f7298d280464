"""Conversations in SQLite (WAL, schema version in PRAGMA user_version): the chat history."""
from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ggufdesk.core.errors import BugError, KnownError, SettingsError
from ggufdesk.core.settings import SamplingSettings

log = logging.getLogger("ggufdesk.history")

MODES = ("chat", "completion")
ROLES = ("system", "user", "assistant")
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


def _sampling_from_json(text: str) -> SamplingSettings:
    try:
        return SamplingSettings(**json.loads(text or "{}"))
    except (ValueError, TypeError, SettingsError) as e:  # an old or hand-edited row
        log.warning("ignoring stored sampling settings (%s); using defaults", e)
        return SamplingSettings()


class History:
    """All conversations. Thread-safe: one connection guarded by a lock (reads run off the GUI thread)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path else history_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise KnownError(f"the chat history {self.path} cannot be opened: {e}") from e
        self._recover_interrupted()

    # ---- schema -------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise KnownError(
                f"the chat history {self.path} was written by a newer ggufdesk "
                f"(schema {version}, this version knows {SCHEMA_VERSION}); update ggufdesk"
            )
        if version == SCHEMA_VERSION:
            return
        log.info("migrating %s from schema %d to %d", self.path, version, SCHEMA_VERSION)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for i in range(version, SCHEMA_VERSION):
                    for statement in MIGRATIONS[i].split(";"):
                        if statement.strip():
                            self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

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
            mode=row["mode"], model=row["model"],
        )

    def new_conversation(
        self, title: str = "New chat", *, system_prompt: str = "",
        sampling: SamplingSettings | None = None, mode: str = "chat", model: str = "",
    ) -> Conversation:
        if mode not in MODES:
            raise SettingsError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        now = time.time()
        sampling = sampling or SamplingSettings()
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO conversations(title, created, updated, system_prompt, sampling, mode, model)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, json.dumps(dataclasses.asdict(sampling)), mode, model),
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
        changes["updated"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in changes)
        with self._lock:
            cur = self._db.execute(
                f"UPDATE conversations SET {sets} WHERE id = ?", (*changes.values(), conversation_id)
            )
            if cur.rowcount == 0:
                raise KeyError(conversation_id)
        return self.get_conversation(conversation_id)

    def delete(self, conversation_id: int) -> None:
        with self._lock:
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
        self, conversation_id: int, role: str, content: str, *, status: str = "done"
    ) -> Message:
        """Insert and commit at once (autocommit): a user message is on disk before generation starts."""
        if role not in ROLES:
            raise BugError(f"unknown role {role!r}")
        if status not in STATUSES:
            raise BugError(f"unknown status {status!r}")
        now = time.time()
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, role, content, created, status)"
                " VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, now, status),
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
        with self._lock:
            self._db.execute(f"UPDATE messages SET {sets} WHERE id = ?", (*changes.values(), message_id))

    def truncate_from(self, conversation_id: int, message_id: int) -> None:
        """Delete a message and everything after it (regenerate, edit-and-resend)."""
        with self._lock:
            self._db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                (conversation_id, message_id),
            )

    # ---- export -------------------------------------------------------------------------------

    def export_json(self, conversation_id: int) -> dict[str, Any]:
        conv = self.get_conversation(conversation_id)
        data = dataclasses.asdict(conv)
        data["messages"] = [
            {k: v for k, v in dataclasses.asdict(m).items() if k != "conversation_id"}
            for m in self.messages(conversation_id)
        ]
        data["schema_version"] = SCHEMA_VERSION
        return data

    def export_markdown(self, conversation_id: int) -> str:
        conv = self.get_conversation(conversation_id)
        lines = [f"# {conv.title}", ""]
        if conv.system_prompt:
            lines += ["**System:**", "", conv.system_prompt, ""]
        for m in self.messages(conversation_id):
            note = "" if m.status == "done" else f" _({m.status})_"
            lines += [f"**{m.role.capitalize()}:**{note}", "", m.content, ""]
        return "\n".join(lines).rstrip() + "\n"

