"""The engine process's log lines, carried over its stderr into the log of the process that runs it.

The engine is a process of its own (engine/runtime/worker.py) whose stderr the client reads
(engine/link/client.py), mostly llama.cpp's own output, kept for crash reports and logged at debug.
Without this the engine's `logging` calls had no handler: its info lines (why speculation paused,
the verification cost table, waiting for a quiet machine) printed nowhere, and its warnings (a
context past the model's training length, the prompt cache off) reached only that debug log. Now
the engine writes them with a prefix, at the level the client asks for (`ggufdesk -v`: info), and the
client logs each under its own level and name, so they show where the client's own lines do.
"""
from __future__ import annotations

import logging
import os
import re
import sys

ENV = "GGUFDESK_ENGINE_LOG"  # the level the engine logs at: what the client's log would show
PREFIX = "ggufdesk-log"
LINE = re.compile(rf"^{PREFIX} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (ggufdesk(?:\.[\w.]+)?): (.*)$")
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
          "CRITICAL": logging.CRITICAL}


class _OneLine(logging.Formatter):
    """Each record on one line: a message (a token's text, a file's name) or a traceback holding a line
    break would otherwise start lines the client could take for another record, or for llama.cpp's."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\r", "\\r").replace("\n", "\\n")


def configure() -> None:
    """In the engine process: our loggers ("ggufdesk.*") write prefixed lines to stderr at the level
    in ENV (WARNING when unset or nonsense). Other libraries' loggers are left as they were."""
    level = os.environ.get(ENV, "WARNING").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine(f"{PREFIX} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("ggufdesk")
    root.handlers[:] = [handler]
    root.setLevel(LEVELS.get(level, logging.WARNING))
    root.propagate = False


def level_for_engine(logger: str = "ggufdesk.engine") -> str:
    """In the client: the level its log shows for the engine's logger, handed on through ENV."""
    log = logging.getLogger(logger)
    return next((name for name, n in LEVELS.items() if log.isEnabledFor(n)), "CRITICAL")


def relay(line: str) -> bool:
    """In the client: log one of the engine's prefixed lines under its level and name; False for any
    other line (llama.cpp's output, a traceback's continuation)."""
    m = LINE.match(line)
    if m is None:
        return False
    level, name, message = m.groups()
    logging.getLogger(name).log(LEVELS[level], "%s", message)
    return True


def is_chatter(line: str) -> bool:
    """An engine log line below WARNING: never what explains a crash."""
    m = LINE.match(line.strip())
    return m is not None and m.group(1) in ("DEBUG", "INFO")
