"""The engine process's heap after a load: what lives for the model's whole life is frozen out of the garbage collector.

CPython's collector traverses every tracked object in a collection of its oldest generation: in the
engine process, after llama_cpp, numpy and a model are loaded, about 47,000 objects (modules,
functions, the vocabulary's readers), 10-20 ms a collection on the 2-core CPU, paid in the middle of
a decode step: on a GPU, ten to twenty one-millisecond steps of a small model. Nearly all of them live
until the model is unloaded. Frozen (`gc.freeze`: moved to a permanent generation that collections
skip), a full collection traverses only what requests made since (bench/graph_clock.py --split counts
the collections and what they cost). vLLM freezes its heap the same way after warming up
(`freeze_gc_heap`); SGLang offers it (`freeze_gc`).
"""
from __future__ import annotations

import gc


def settle() -> int:
    """After a model is loaded: collect what loading (and any model before it) left in cycles, then
    freeze what is alive. Returns how many objects were frozen. Unfrozen first, so that what an
    unloaded model's objects left in cycles is collected now rather than kept for good."""
    release()
    gc.freeze()
    return gc.get_freeze_count()


def release() -> None:
    """A model was unloaded: what was frozen with it goes back to the collector, and what it left in
    cycles is collected (its native memory is freed explicitly; this is its Python objects')."""
    gc.unfreeze()
    gc.collect()
