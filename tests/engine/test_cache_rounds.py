"""Drawn rounds of requests through the worker's engine, with its prefix cache, its RAM and disk prompt
caches and reloads: every answer is the one an engine with no cache gives the same prompt.

Each case draws a small context (256 or 512 cells), 1, 2 or 4 slots, the disk cache on or off (the
shortest prefix worth a file 8 or 32 tokens), the RAM cache off, small or large; then three to eight
rounds of one to four requests at once, their prompts drawn from three conversations that grow (a
later turn extends an earlier prompt), some with `cache_prompt` off, and now and then the model is
unloaded and loaded again (the disk cache outlives it). A tiny f32 model with an f32 KV cache: a
reused or restored prefix gives the same logits, to a few 1e-6, as a fresh prefill. A prompt rolled to
fit is left out: where the cut lands depends on what the caches hold (runtime/overflow.py).
"""
from __future__ import annotations

import random
from typing import Any

import pytest

from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P
from tests.engine import inproc

CASES = 16  # 177 requests: 108 reuse a cached prefix, 16 read one from disk, 14 reloads. By hand: cases 0-399, none differed
WORDS = ('the cat dog and was in house red tree by water one two three of people a man came back from world , . '
         '1 2 3 4 5 6 7 8 9 10').split()
BASE = dict(n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, flash_attn="off", type_k="f32", type_v="f32")


class Worker(inproc.Live):
    """The worker's Engine in this process (tests/engine/inproc.py); a round's requests are all queued
    before the first step, and the model can be loaded again with the same settings."""

    def __init__(self, model: Any, **load: Any) -> None:
        super().__init__(model, **load)
        self.model, self.load_settings = model, load

    def reload(self) -> None:
        self.engine.unload(quiet=True)
        self.engine.load(P.Load(id="load", model=str(self.model), settings=LoadSettings(**self.load_settings)))
        assert self.engine.batch is not None, [e for e in self.events if isinstance(e, P.Error)]

    def round(self, reqs: list[tuple[str, str, int, bool]]) -> dict[str, P.Done]:
        self.events.clear()
        for rid, prompt, n, reuse in reqs:
            self.engine.generate(P.Generate(id=rid, prompt=prompt, cache_prompt=reuse,
                                            sampling=SamplingSettings(temperature=0.0, max_tokens=n)))
        batch = self.engine.batch
        assert batch is not None
        while batch.busy:
            batch.step()
        done = {e.id: e for e in self.events if isinstance(e, P.Done)}
        assert set(done) == {r[0] for r in reqs}, [e for e in self.events if isinstance(e, P.Error)]
        return done


@pytest.fixture(scope="module")
def fresh(tiny_model):
    """Answers from engines with no cache of any kind, one request at a time, by context size."""
    engines: dict[int, Worker] = {}
    answers: dict[tuple[int, str, int], list[int]] = {}

    def answer(n_ctx: int, prompt: str, n: int) -> list[int]:
        if (n_ctx, prompt, n) not in answers:
            w = engines.get(n_ctx) or engines.setdefault(n_ctx, Worker(
                tiny_model, n_ctx=n_ctx, n_parallel=1, prompt_cache_bytes=0, prompt_cache_ram_bytes=0, **BASE))
            answers[n_ctx, prompt, n] = list(w.round([("fresh", prompt, n, False)])["fresh"].tokens)
        return answers[n_ctx, prompt, n]

    yield answer
    for w in engines.values():
        w.close()


@pytest.mark.parametrize("case", range(CASES))
def test_drawn_rounds_answer_as_an_engine_without_caches(tiny_model, fresh, case):
    rng = random.Random(case)
    n_ctx = rng.choice([256, 512])
    w = Worker(tiny_model, n_ctx=n_ctx, n_parallel=rng.choice([1, 2, 4]), prompt_cache_bytes=rng.choice([0, 64 << 20]),
               prompt_cache_min_tokens=rng.choice([8, 32]), prompt_cache_ram_bytes=rng.choice([0, 1 << 20, 64 << 20]),
               **BASE)
    talks = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60))) for _ in range(3)]
    compared = 0
    try:
        for rnd in range(rng.randint(3, 8)):
            if rng.random() < 0.15:
                w.reload()
            reqs = []
            for j in range(rng.randint(1, 4)):
                prompt = rng.choice(talks) + " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30)))
                if rng.random() < 0.3:  # the conversation's next turn
                    talks[rng.randrange(3)] = prompt
                reqs.append((f"r{rnd}.{j}", prompt, rng.randint(1, 30), rng.random() < 0.8))
            done = w.round(reqs)
            for rid, prompt, n, _ in reqs:
                if done[rid].usage["truncated_tokens"]:
                    continue
                assert list(done[rid].tokens) == fresh(n_ctx, prompt, n), (rid, done[rid].usage)
                compared += 1
    finally:
        w.close()
    assert compared
