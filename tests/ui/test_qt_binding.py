"""Guards against a Qt binding that leaks references (PySide6 6.12.0 on Python 3.11 does).

With PySide6 6.12.0 every Python-side `Signal.emit()` drops a reference to True/False and every
`processEvents()` one to None; on Python < 3.12 (no immortal objects) the app dies with
"Fatal Python error: bool_dealloc" after a few thousand streamed token batches.
"""
from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal


class _Emitter(QObject):
    obj = Signal(object)
    void = Signal()


def _delta(fn, n: int = 500) -> tuple[int, int, int]:
    before = (sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False))
    for _ in range(n):
        fn()
    after = (sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False))
    return tuple(b - a for a, b in zip(before, after))


def test_signal_emit_and_process_events_do_not_leak_references(qapp):
    e = _Emitter()
    e.obj.connect(lambda ev: None)
    e.void.connect(lambda: None)
    for name, fn in (("emit(object)", lambda: e.obj.emit(1)), ("emit()", e.void.emit),
                     ("processEvents()", qapp.processEvents)):
        d = _delta(fn)
        assert all(abs(x) < 50 for x in d), (
            f"{name} changes the refcounts of None/True/False by {d} per 500 calls: this Qt "
            "binding corrupts reference counts (PySide6 6.12.0?); use PySide6-Essentials 6.11.x")
