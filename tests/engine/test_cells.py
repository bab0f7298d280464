"""Which KV cells a prompt takes (engine/batching/batch.py `_take_cells`): the cells a new prompt will need
are freed from idle slots before its first chunk, not one chunk at a time (llama.cpp attends over every cell
up to the highest in use, so chunks read above an idle slot's cells cost more), and idle slots are kept
where there is room (tiny model, a 256-cell context, 64-token chunks)."""
from __future__ import annotations

from typing import Any

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from tests.engine.helpers import greedy
from tests.engine.inproc import Live, one
from tests.fixtures import ggufs

N_CTX = 256
LOAD = {"n_ctx": N_CTX, "n_batch": 64, "n_ubatch": 64, "n_parallel": 2, "n_threads": 1, "n_threads_batch": 1,
        "type_k": "f32", "type_v": "f32", "flash_attn": "off", "prompt_cache_bytes": 0}


def text(n: int, start: int) -> list[dict[str, Any]]:
    w = ggufs.WORDS
    return [{"role": "user", "content": " ".join(w[(start + 3 * i) % len(w)] for i in range(n))}]


def idle_tokens(live: Live) -> int:
    batch = live.engine.batch
    assert batch is not None
    return sum(len(s.tokens) for s in batch.slots.slots if not s.busy)


def test_a_prompt_that_needs_an_idle_slots_cells_takes_them_before_its_first_chunk(tiny_chatml):
    live = Live(tiny_chatml, **LOAD)
    try:
        live.run("a", messages=text(40, 0), sampling=greedy(4))
        held = idle_tokens(live)
        b = live.render(text(40, 1))
        assert held + len(b) > N_CTX > len(b) + 4 and len(b) > 64  # B needs A's cells, over several chunks
        batch = live.engine.batch
        assert batch is not None
        live.engine.generate(P.Generate(id="b", messages=text(40, 1), sampling=SamplingSettings(**greedy(4))))
        batch.step()  # B's first chunk: 64 tokens would still fit beside A
        assert idle_tokens(live) == 0  # A was evicted before it, not when the free cells ran out
        while batch.busy:
            batch.step()
        done = one([e for e in live.events if getattr(e, "id", None) == "b"], P.Done)
        assert done.finish_reason == "length" and len(done.tokens) == 4
    finally:
        live.close()


def test_idle_slots_stay_where_the_prompt_fits_beside_them(tiny_chatml):
    live = Live(tiny_chatml, **LOAD)
    try:
        live.run("a", messages=text(40, 0), sampling=greedy(4))
        held = idle_tokens(live)
        live.run("b", messages=text(10, 1), sampling=greedy(4))
        batch = live.engine.batch
        assert batch is not None
        assert held in [len(s.tokens) for s in batch.slots.slots]  # A's conversation is still there
        again = live.run("a2", messages=text(40, 0), sampling=greedy(4))
        assert one(again, P.Done).usage["cached_tokens"] > 100  # and its prompt is reused
    finally:
        live.close()
