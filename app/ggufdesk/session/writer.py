"""The history write path: writes leave the caller's thread through one queue and are retried
until the database takes them (a lock held by another process, a backup tool, a full disk)."""
from __future__ import annotations

import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Final, Hashable, Literal

from ggufdesk.core.errors import KnownError
from ggufdesk.core.history import History

log = logging.getLogger("ggufdesk.session.writer")

SaveStatus = Literal["saved", "saving", "retrying"]
RETRY_DELAYS_S: Final = (0.1, 0.25, 0.5, 1.0, 2.0)  # then every 2 s until it works
SLOW_SAVE_S: Final = 0.3  # a write that takes longer than this shows "saving…"
_NOT_WRITTEN: Final = object()


@dataclass(frozen=True, slots=True)
class SaveState:
    """What the user is told about saving: nothing, "saving…" or why it is being retried."""

    status: SaveStatus = "saved"
    pending: int = 0
    reason: str = ""

    @property
    def text(self) -> str:
        if self.status == "retrying":
            return f"could not save ({self.reason}), retrying"
        return "saving…" if self.status == "saving" else ""


@dataclass(slots=True)
class _Op:
    run: Callable[[History], Any]
    then: Callable[[Any], None] | None
    key: Hashable | None
    undo: Callable[[], None] | None = None  # forgets what `run` noted (a row id) if it rolled back


def _run_undoing(ops: list[_Op], history: History) -> list[Any]:
    """Run ops (several: in one transaction); if that fails, each op that ran forgets what it
    noted. (A History method is a transaction of its own.)"""
    done: list[_Op] = []
    try:
        if len(ops) == 1:
            done.append(ops[0])
            return [ops[0].run(history)]
        with history.atomic():
            results = []
            for op in ops:
                done.append(op)
                results.append(op.run(history))
            return results
    except BaseException:
        for op in done:
            if op.undo is not None:
                op.undo()
        raise


class HistoryWriter:
    """One thread that applies writes to a History in order.

    `submit(op)` never blocks. An op that fails with a database or disk error is retried (with
    backoff, for ever) and everything behind it waits, so the order of writes holds. A newer op
    with the same `key` replaces a pending one in place (partial answers: only the latest text is
    written). `then(result)` runs on the writer thread after the op committed; `on_state` is told
    whenever the SaveState changes (also on the writer thread).
    """

    def __init__(self, history: History, *, on_state: Callable[[SaveState], None] | None = None,
                 retry_delays: tuple[float, ...] = RETRY_DELAYS_S, slow_after: float = SLOW_SAVE_S) -> None:
        self.history = history
        self.on_state = on_state
        self._delays = retry_delays
        self._slow_after = slow_after
        self._ops: deque[_Op] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self.state = SaveState()
        self._batch: list[_Op] | None = None
        self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[History], Any], *, then: Callable[[Any], None] | None = None,
               key: Hashable | None = None, undo: Callable[[], None] | None = None) -> None:
        """Queue `run(history)`; `then(result)` after it committed. `undo()` runs when the write
        rolled back (to forget a row id `run` noted): it may be retried, or dropped."""
        op = _Op(run, then, key, undo)
        if self._batch is not None:
            self._batch.append(op)
            return
        self._queue(op)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Writes submitted inside (on this, the submitting thread) go to the database as one
        transaction: a user action is saved whole or not at all. Nested: part of the outer one."""
        if self._batch is not None:
            yield
            return
        batch: list[_Op] = []
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None
            if len(batch) == 1:
                self._queue(batch[0])
            elif batch:
                def then(results: list[Any]) -> None:
                    for op, result in zip(batch, results):
                        if op.then is not None:
                            op.then(result)

                self._queue(_Op(lambda h: _run_undoing(batch, h), then, None))

    def _queue(self, op: _Op) -> None:
        with self._cond:
            if self._closed:
                log.error("a history write after close was dropped")
                return
            if op.key is not None:
                for queued in self._ops:
                    if queued.key == op.key:
                        queued.run, queued.then, queued.undo = op.run, op.then, op.undo
                        return
            self._ops.append(op)
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._ops)  # the one being written stays first until it is done

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted write is on disk; False if some are still pending."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._ops and not self._busy, timeout)

    def close(self, timeout: float = 5.0) -> bool:
        """Write what is pending (up to `timeout` s), then stop. False: some writes were not saved
        (their rows stay 'streaming' and the next start turns them into 'partial' answers)."""
        flushed = self.flush(timeout)
        with self._cond:
            self._closed = True
            left = len(self._ops)
            self._ops.clear()
            self._cond.notify_all()
        if not flushed:
            log.error("closing with %d unsaved history writes (%s)", left, self.state.reason)
        return flushed

    # ---- the writer thread ----------------------------------------------------------------------

    def _set_state(self, state: SaveState) -> None:
        if state == self.state:
            return
        self.state = state
        if self.on_state is not None:
            try:
                self.on_state(state)
            except Exception:
                log.exception("save-state listener failed")

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ops or self._closed)
                if self._closed:
                    return
                op = self._ops[0]
                self._busy = True
            result = self._apply(op)
            with self._cond:
                if self._ops and self._ops[0] is op:
                    self._ops.popleft()
                self._busy = False
                left = len(self._ops)
                self._cond.notify_all()
            if left == 0:
                self._set_state(SaveState())
            if op.then is not None and result is not _NOT_WRITTEN:
                try:
                    op.then(result)
                except Exception:
                    log.exception("history write callback failed")

    def _apply(self, op: _Op) -> Any:
        attempt = 0
        while True:
            with self._cond:
                if self._closed:
                    return _NOT_WRITTEN
            slow = threading.Timer(self._slow_after, lambda: self._set_state(
                SaveState("saving", self.pending)) if self.state.status == "saved" else None)
            slow.daemon = True
            slow.start()
            try:
                return _run_undoing([op], self.history)[0]
            except (sqlite3.OperationalError, sqlite3.DatabaseError, OSError) as e:
                reason = str(e) or type(e).__name__
            except KnownError as e:
                reason = str(e)
            except Exception:
                log.exception("history write failed for good; dropped")
                return _NOT_WRITTEN
            finally:
                slow.cancel()
            self._set_state(SaveState("retrying", self.pending, reason))
            delay = self._delays[min(attempt, len(self._delays) - 1)]
            attempt += 1
            log.warning("history write failed (%s); retrying in %.2f s", reason, delay)
            with self._cond:
                self._cond.wait_for(lambda: self._closed, delay)
