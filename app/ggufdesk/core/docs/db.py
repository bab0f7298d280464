"""The SQLite module for document indexes: one that can load sqlite-vec, with FTS5.

Python's own sqlite3 is used when it can load extensions; many builds cannot (pyenv's and some
distributions' leave `enable_load_extension` out), and then `sqlean.py` (the same DB-API, its own
SQLite with extension loading) takes its place. Without either, or without sqlite-vec, indexes are
BM25-only and say so.
"""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger("ggufdesk.docs")


def _module() -> ModuleType:
    if hasattr(sqlite3.Connection, "enable_load_extension"):
        return sqlite3
    try:
        import sqlean

        return sqlean  # type: ignore[no-any-return]
    except ImportError:
        return sqlite3


sqlite: Any = _module()
Error: type[Exception] = sqlite.Error
OperationalError: type[Exception] = sqlite.OperationalError


def connect(path: Path | str, *, vectors: bool = True, timeout: float = 30.0) -> tuple[Any, str]:
    """A connection (autocommit: transactions are explicit) and why vectors are off ("" when on)."""
    conn = sqlite.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn, (load_vec(conn) if vectors else "vectors not requested")


def load_vec(conn: Any) -> str:
    """Load sqlite-vec into `conn`; returns "" on success, else the reason it is not available."""
    try:
        import sqlite_vec
    except ImportError:
        return "sqlite-vec is not installed"
    if not hasattr(conn, "enable_load_extension"):
        return "this Python's SQLite cannot load extensions (install sqlean.py)"
    try:
        conn.enable_load_extension(True)
        sqlite_vec.load(conn)
        conn.enable_load_extension(False)
    except (sqlite.Error, OSError, AttributeError) as e:
        log.warning("sqlite-vec could not be loaded: %s", e)
        return f"sqlite-vec could not be loaded ({e})"
    return ""


def is_full(e: BaseException) -> bool:
    """A write that failed because the disk (or the database's size limit) is full."""
    text = str(e).lower()
    return "full" in text or "no space" in text or getattr(e, "sqlite_errorname", "") == "SQLITE_FULL"
