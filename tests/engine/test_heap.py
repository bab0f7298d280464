"""engine/runtime/heap.py: what lives as long as a loaded model is frozen out of the collector; an unload gives it back."""
from __future__ import annotations

import gc
import weakref

import pytest

from ggufdesk.engine.runtime import heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture(autouse=True)
def _thawed():
    yield
    gc.unfreeze()  # other tests run in this process


def test_settle_collects_what_a_load_left_and_freezes_what_is_alive():
    kept = Node()
    left = Node()
    gone = weakref.ref(left)
    del left
    assert heap.settle() == gc.get_freeze_count() > 0
    assert gone() is None  # the cycle left behind was collected first
    assert gc.is_tracked(kept) and not any(o is kept for o in gc.get_objects())  # frozen: no collection sees it
    gc.collect()
    assert not any(o is kept for o in gc.get_objects()) and kept.me is kept


def test_what_an_unloaded_model_left_in_cycles_is_collected_at_the_unload():
    model = Node()  # alive at the load: frozen with it
    freed = weakref.ref(model)
    heap.settle()
    del model
    gc.collect()
    assert freed() is not None  # frozen garbage: a full collection does not look at it
    heap.release()
    assert freed() is None and gc.get_freeze_count() == 0


def test_the_worker_freezes_after_a_load_and_thaws_at_the_unload(tiny_chatml):
    from tests.engine.inproc import Live

    live = Live(tiny_chatml, n_ctx=256, n_threads=1, n_threads_batch=1)
    try:
        assert gc.get_freeze_count() > 0
        young = len(gc.get_objects())
        live.run("r", prompt="the cat", sampling={"temperature": 0.0, "max_tokens": 4})
        assert len(gc.get_objects()) < young + 2_000  # a request's objects, not the model's heap
    finally:
        live.close()
    assert gc.get_freeze_count() == 0
