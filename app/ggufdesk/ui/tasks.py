"""Background work that never blocks the event loop: run_in_background(task, on_done) and run_on_main."""
from __future__ import annotations

import logging
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, Qt, Signal

from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.ui.tasks")

T = TypeVar("T")


class _Main(QObject):
    """Lives on the GUI thread; a queued signal carries callables there from any thread."""

    call = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        # Always queued: a callback emitted on the GUI thread (a future that was already done)
        # must not run inside the caller that scheduled it.
        self.call.connect(self._run, Qt.ConnectionType.QueuedConnection)

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:
            log.exception("callback on the main thread failed")


class TaskManager:
    """One small thread pool for probe, downloads and database reads (Anki's taskman pattern)."""

    def __init__(self, max_workers: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ggufdesk-bg")
        self._main = _Main()
        self._lock = threading.Lock()
        self._pending = 0  # tasks whose on_done has not run yet
        self._closed = False
        app = QCoreApplication.instance()
        if app is not None:
            self._main.moveToThread(app.thread())

    def run_on_main(self, fn: Callable[[], object]) -> None:
        if self._closed:
            return  # the app is closing: nothing is left on the main thread to call into
        self._main.call.emit(fn)

    def run_in_background(
        self, task: Callable[[], T], on_done: Callable[[Future[T]], object] | None = None, *,
        owner: QObject | None = None,
    ) -> Future[T]:
        """Run `task` on a worker thread; `on_done(future)` runs on the GUI thread afterwards.

        With an `owner` (the widget the callback touches), the callback is dropped when the owner
        has been deleted meanwhile: a closed dialog's late result must not reach its dead widgets.
        """
        with self._lock:
            self._pending += 1

        def deliver(f: Future[T]) -> None:
            try:
                if on_done is None:
                    return
                if owner is not None and not alive(owner):
                    log.info("dropped a background result: its window is gone")
                    return
                on_done(f)
            finally:
                with self._lock:
                    self._pending -= 1

        fut = self._pool.submit(task)
        fut.add_done_callback(lambda f: self.run_on_main(lambda: deliver(f)))
        return fut

    @property
    def idle(self) -> bool:
        """No background task is running or waiting for its callback (tests wait on this)."""
        with self._lock:
            return self._pending == 0

    def shutdown(self) -> None:
        """At exit: queued tasks are dropped, and results of running ones are never delivered
        (their window and the QApplication are going away)."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def alive(obj: QObject) -> bool:
    """False once the C++ side of a Qt object has been deleted."""
    return shiboken6.isValid(obj)


def describe_failure(fut: Future[T]) -> str | None:
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


def run_in_background(task: Callable[[], T], on_done: Callable[[Future[T]], object] | None = None, *,
                      owner: QObject | None = None) -> Future[T]:
    return manager().run_in_background(task, on_done, owner=owner)


def run_on_main(fn: Callable[[], object]) -> None:
    manager().run_on_main(fn)
