"""Several prompts read in one step (engine/batching/scheduler.py): the step's prompt budget goes to the
prompts in admission order, one that ends within it leaving the rest to the next; answers are what each
prompt gives alone; a prompt with images is never packed beside another."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ggufdesk.engine.batching.batch import BatchEngine
from ggufdesk.engine.batching.scheduler import Plan, Prefill
from ggufdesk.engine.batching.sequence import SequenceStatus
from ggufdesk.engine.link import protocol as P
from ggufdesk.core.settings import SamplingSettings
from tests.engine import helpers
from tests.engine.inproc import Live, one

LOAD = dict(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, n_parallel=4, type_k="f32",
            type_v="f32", flash_attn="off", prompt_cache_bytes=0, prompt_cache_ram_bytes=0)
PROMPTS = ["hello the cat and the dog", "the red tree was by the water", "one two three of the people",
           "a man came back from the world"]


def greedy(n: int) -> SamplingSettings:
    return SamplingSettings(**helpers.greedy(n))  # (the protocol carries settings dataclasses)


def test_four_short_prompts_sent_at_once_are_read_in_one_step_and_answer_as_alone(tiny_model):
    live = Live(tiny_model, **{**LOAD, "n_batch": 256, "n_ubatch": 256})  # (the tiny vocabulary: ~25 tokens each)
    try:
        alone = [one(live.run(f"alone{i}", prompt=p, sampling={"temperature": 0.0, "max_tokens": 12}), P.Done)
                 for i, p in enumerate(PROMPTS)]
        for i in range(1, 4):  # (a slot holding another prompt: nothing of theirs is reused below)
            live.run(f"pad{i}", prompt="water " * (5 + i), sampling={"temperature": 0.0, "max_tokens": 1})
        batch = live.engine.batch
        assert batch is not None
        for i, p in enumerate(PROMPTS):
            live.engine.generate(P.Generate(id=f"t{i}", prompt=p, sampling=greedy(12)))
        plan = batch.schedule()
        assert [p.seq.rid for p in plan.prefills] == ["t0", "t1", "t2", "t3"]
        assert all(p.completes for p in plan.prefills) and plan.chunk == sum(p.seq.prompt_left for p in plan.prefills)
        calls = batch.runner.n_decode
        # the positions the chunk sizer prices them at (engine/batching/chunking.py): each from where its slot ends
        at = [len(p.seq.slot.tokens) for p in plan.prefills if p.seq.slot is not None]
        result = batch.runner.run(plan)
        assert result is not None and batch.runner.n_decode == calls + 1  # one llama_decode for all four
        assert result.prompt_pos == sum(sum(range(a, a + p.n)) for a, p in zip(at, plan.prefills, strict=True))
        batch.update.apply(result)
        assert all(s.status is SequenceStatus.DECODING for s in batch.sched.running)  # each has its first token
        while batch.busy:
            batch.step()
        together = [one([e for e in live.events if getattr(e, "id", None) == f"t{i}"], P.Done) for i in range(4)]
    finally:
        live.close()
    assert [d.tokens for d in together] == [d.tokens for d in alone]


def test_a_long_prompt_takes_the_budget_and_the_next_waits_its_turn(tiny_model):
    live = Live(tiny_model, **LOAD)
    try:
        batch = live.engine.batch
        assert batch is not None
        long_prompt, short = "the cat and the dog " * 20, "hello the cat"
        live.engine.generate(P.Generate(id="long", prompt=long_prompt, sampling=greedy(4)))
        live.engine.generate(P.Generate(id="short", prompt=short, sampling=greedy(4)))
        plan = batch.schedule()
        assert [(p.seq.rid, p.n) for p in plan.prefills] == [("long", 64)] and not plan.prefills[0].completes
        while batch.busy:
            batch.step()
        done = {rid: one([e for e in live.events if getattr(e, "id", None) == rid], P.Done) for rid in ("long", "short")}
    finally:
        live.close()
    assert all(d.finish_reason == "length" for d in done.values())


@dataclass
class Span:
    start: int
    end: int


@dataclass
class Media:
    spans: list[Span] = field(default_factory=list)

    def span_at(self, pos: int) -> Span | None:
        return next((s for s in self.spans if s.start == pos), None)

    def text_room(self, pos: int, chunk: int) -> int:
        nxt = min((s.start for s in self.spans if s.start >= pos), default=None)
        return chunk if nxt is None else max(0, min(chunk, nxt - pos))


@dataclass(eq=False)
class Seq:
    media: Any = None
    n_done: int = 0
    prompt_left: int = 30


def test_a_prompt_with_images_is_never_read_beside_another():
    text, pictured, after = Seq(), Seq(Media([Span(5, 20)])), Seq()
    plan: Plan[Any] = Plan(decode=[], prefills=[Prefill(text, 30), Prefill(pictured, 30), Prefill(after, 4)])
    BatchEngine._images(plan)
    assert [(p.seq, p.n) for p in plan.prefills] == [(text, 30), (pictured, 5)]  # its text, up to its image
    pictured.n_done = 5
    plan = Plan(decode=[], prefills=[Prefill(text, 30), Prefill(pictured, 30)])
    BatchEngine._images(plan)
    assert [p.seq for p in plan.prefills] == [text] and plan.image is None  # its image waits for its own step
    plan = Plan(decode=[], prefills=[Prefill(pictured, 30), Prefill(after, 4)])
    BatchEngine._images(plan)
    assert [(p.seq, p.n) for p in plan.prefills] == [(pictured, 0)] and plan.image == Span(5, 20)


def test_beside_an_answer_nobody_streams_a_prompt_gets_the_whole_batch(tiny_model):
    live = Live(tiny_model, **{**LOAD, "prefill_chunk": 16})
    try:
        batch = live.engine.batch
        assert batch is not None
        chunks = {}
        for streamed in (True, False):
            first, second = f"first{streamed}", f"second{streamed}"
            live.engine.generate(P.Generate(id=first, prompt=PROMPTS[0], sampling=greedy(40), stream=streamed))
            while not any(s.status is SequenceStatus.DECODING for s in batch.sched.running):
                batch.step()
            words = "the cat and the dog " if streamed else "a man came back from the world "  # (nothing cached)
            live.engine.generate(P.Generate(id=second, prompt=words * 20, sampling=greedy(4)))
            plan = batch.schedule()
            chunks[streamed] = [(p.seq.rid, p.n) for p in plan.prefills]
            while batch.busy:
                batch.step()
            assert all(one([e for e in live.events if getattr(e, "id", None) == rid], P.Done).finish_reason == "length"
                       for rid in (first, second))
    finally:
        live.close()
    assert chunks == {True: [("secondTrue", 16)], False: [("secondFalse", 63)]}  # 64 rows, one of them decoding
