"""Background work that never blocks the event loop: run_in_background(task, on_done) and run_on_main."""
from __future__ import annotations

import logging
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from PySide6.QtCore import QCoreApplication, QObject, Signal

from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.ui.tasks")


class _Main(QObject):
    """Lives on the GUI thread; a queued signal carries callables there from any thread."""

    call = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.call.connect(self._run)

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:
            log.exception("callback on the main thread failed")


class TaskManager:
    """One small thread pool for probe, downloads and database reads (Anki's taskman pattern)."""

    def __init__(self, max_workers: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ggufdesk-bg")
        self._main = _Main()
        app = QCoreApplication.instance()
        if app is not None:
            self._main.moveToThread(app.thread())

    def run_on_main(self, fn: Callable[[], Any]) -> None:
        self._main.call.emit(fn)

    def run_in_background(
        self, task: Callable[[], Any], on_done: Callable[[Future], Any] | None = None
    ) -> Future:
        """Run `task` on a worker thread; `on_done(future)` runs on the GUI thread afterwards."""
        fut = self._pool.submit(task)
        if on_done is not None:
            fut.add_done_callback(lambda f: self.run_on_main(lambda: on_done(f)))
        return fut

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def describe_failure(fut: Future) -> str | None:
    """The user-readable message of a failed future (KnownError as it is, bugs with a trace logged)."""
    exc = fut.exception()
    if exc is None:
        return None
    if isinstance(exc, KnownError):
        return str(exc)
    log.error("background task failed:\n%s", "".join(traceback.format_exception(exc)))
    return f"internal error: {type(exc).__name__}: {exc} (details in the log)"


_manager: TaskManager | None = None


def manager() -> TaskManager:
    global _manager
    if _manager is None:
        _manager = TaskManager()
    return _manager


def run_in_background(task: Callable[[], Any], on_done: Callable[[Future], Any] | None = None) -> Future:
    return manager().run_in_background(task, on_done)


def run_on_main(fn: Callable[[], Any]) -> None:
    manager().run_on_main(fn)
