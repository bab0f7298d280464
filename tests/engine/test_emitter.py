"""The engine's event writer: one flush per event, or one per engine step while held."""
from __future__ import annotations

import io
import threading

from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.worker import Emitter


class Counting(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0
        self.flushed_text: list[str] = []

    def flush(self) -> None:
        self.flushes += 1
        self.flushed_text.append(self.getvalue())


def test_each_event_is_flushed_at_once_outside_a_step():
    out = Counting()
    emit = Emitter(out)
    emit(P.Token(id="a", text="x"))
    emit(P.Token(id="a", text="y"))
    assert out.flushes == 2 and out.flushed_text[0].count("\n") == 1


def test_a_step_s_events_go_out_in_one_flush_in_order():
    out = Counting()
    emit = Emitter(out)
    with emit.held():
        for t in "abc":
            emit(P.Token(id=t, text=t))
        assert out.flushes == 0
    assert out.flushes == 1
    assert [P.decode(line).id for line in out.getvalue().splitlines()] == ["a", "b", "c"]
    emit(P.Pong(id="p"))  # after the step, flushing is immediate again
    assert out.flushes == 2


def test_another_thread_s_event_during_a_step_goes_out_at_once_with_what_is_held():
    out = Counting()
    emit = Emitter(out)
    with emit.held():
        emit(P.Token(id="a", text="x"))
        th = threading.Thread(target=emit, args=(P.Pong(id="p"),))  # the reader answering a Ping
        th.start()
        th.join()
        assert out.flushes == 1  # the watchdog hears the Pong while the step still computes
        assert [P.decode(line).id for line in out.flushed_text[-1].splitlines()] == ["a", "p"]
    assert out.flushes == 2


def test_a_failure_inside_a_step_still_flushes_what_was_emitted():
    out = Counting()
    emit = Emitter(out)
    try:
        with emit.held():
            emit(P.Token(id="a", text="x"))
            raise RuntimeError("a bug in the step")
    except RuntimeError:
        pass
    assert out.flushes == 1 and "x" in out.getvalue()


def test_flush_inside_a_step_sends_what_the_step_decided_before_computing():
    out = Counting()
    emit = Emitter(out)
    with emit.held():
        emit(P.Done(id="gone", finish_reason="cancelled"))
        emit.flush()  # the batch engine calls this before llama_decode
        assert out.flushes == 1 and "gone" in out.flushed_text[-1]
        emit(P.Token(id="a", text="x"))
    assert out.flushes == 2
