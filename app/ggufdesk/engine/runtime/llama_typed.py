"""Typed calls into the parts of llama-cpp-python's _internals that upstream leaves unannotated."""
from __future__ import annotations

from typing import Protocol

from llama_cpp import _internals as internals


class Closable(Protocol):
    """LlamaModel, LlamaContext, LlamaBatch, LlamaSampler: `close()` frees the native object."""

    def close(self) -> None: ...


class _Greedy(Protocol):
    def add_greedy(self) -> None: ...


def close(obj: Closable) -> None:
    """Free one of llama-cpp-python's native wrappers (its `close` takes no argument, returns None)."""
    obj.close()


def new_sampler() -> internals.LlamaSampler:
    """An empty sampler chain (LlamaSampler's constructor takes no argument)."""
    make: type[internals.LlamaSampler] = internals.LlamaSampler
    return make()


def add_greedy(smp: internals.LlamaSampler) -> None:
    """Append llama.cpp's greedy sampler to the chain."""
    chain: _Greedy = smp
    chain.add_greedy()
