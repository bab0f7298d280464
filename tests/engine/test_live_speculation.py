"""Speculation on the live step loop (engine/batching/batch.py): greedy output equal to plain decoding
alone and beside other streams, the KV cache after rejected drafts exactly as plain decoding leaves
it, and a stop, max_tokens or cancel that lands inside an accepted draft (tiny f32/f16 models, where
llama.cpp's kernels give a row the same logits whatever else is in the batch, to about 1e-6 with f32
weights: these prompts' answers have no near tie for that to flip; tests/engine/test_live_random.py
says what drawn cases met)."""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.engine.batching.sequence import SequenceStatus
from ggufdesk.engine.runtime.native import LlamaLog
from ggufdesk.engine.speculation.draft_model import DraftModel, DraftModelDrafter
from ggufdesk.engine.speculation.lookup import NgramCache
from tests.engine.live import Live, ModelClock
from tests.fixtures import ggufs

SETTINGS = LoadSettings(n_ctx=2048, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, n_parallel=4, flash_attn="off",
                        prefill_chunk=16)
PROMPTS = ["hello the cat and the dog were in the house", "the red tree was by the water and",
           "one two three of the people " * 6, "a man came back from the world"]
N = 80


@pytest.fixture(scope="module", params=["f32", "f16"])
def live(request, model_dir):
    model = ggufs.write_tiny_llama(model_dir / f"live-{request.param}.gguf",
                                   ggufs.TinySpec(seed=0, dtype=request.param))
    lv = Live(model, SETTINGS)
    lv.answers = [lv.plain(p, N).tokens for p in PROMPTS]  # plain decoding, alone
    yield lv
    lv.close()


@pytest.fixture(scope="module")
def draft(live):
    """The target as its own draft model (every draft right), made wrong at a varying place below."""
    spec = SpeculationSettings(mode="draft", draft_model=live.lm.path, k_max=5, p_min=0.0, adaptive=False)
    dm = DraftModel.load(spec, target=live.lm, llama_log=LlamaLog())
    yield dm, spec
    dm.close()


class Misled:
    """A draft model's drafter whose drafts go wrong at a place that moves from step to step (and
    sometimes nowhere), so that verification accepts part of a draft and rolls the rest back."""

    def __init__(self, inner: DraftModelDrafter) -> None:
        self.inner, self.n = inner, 0
        self.control = inner.control

    k = property(lambda self: self.inner.k)
    status = property(lambda self: self.inner.status)
    setup_s = property(lambda self: self.inner.setup_s)

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        draft = self.inner.propose(history, last, k)
        self.n += 1
        at = self.n % (len(draft) + 2)
        if at < len(draft):
            draft[at] = 3 + (draft[at] + 1) % 200  # another token
        return draft

    def feedback(self, n_drafted: int, n_accepted: int, cost: float, drafting: float = 0.0) -> None:
        self.inner.feedback(n_drafted, n_accepted, cost, drafting)

    def woke(self, tokens: int) -> None:
        self.inner.woke(tokens)

    def close(self) -> None:
        self.inner.close()


def misleading(answer: list[int]) -> NgramCache:
    """An earlier 'answer' that agrees with this one for a few tokens at a time, then departs: lookup
    drafts from it are accepted in part and rejected at the departure."""
    cache = NgramCache(3)
    text: list[int] = []
    for j in range(0, len(answer) - 8, 8):
        text += answer[j:j + 5] + [7, 8, 9]
    cache.feed(text)
    return cache


def drafter(live, kind: str, i: int, draft):
    prompt = live.tokens(PROMPTS[i])
    if kind == "lookup":
        return live.lookup(prompt, history=misleading(live.answers[i]))
    dm, spec = draft
    return Misled(DraftModelDrafter(dm, spec, prompt=prompt, max_tokens=N, target=live.lm))


@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_greedy_speculation_equals_plain_alone_and_beside_others(live, draft, kind):
    seqs = lambda spec: [live.sequence(p, N, drafter=drafter(live, kind, i, draft) if i in spec else None)  # noqa: E731
                         for i, p in enumerate(PROMPTS)]
    alone = live.run(seqs({2})[2], on_step=Live.check_kv)
    assert alone[0].tokens == live.answers[2]
    beside_plain = live.run(*seqs({2}), on_step=Live.check_kv)
    beside_spec = live.run(*seqs({0, 1, 2, 3}), on_step=Live.check_kv)
    for rs in (beside_plain, beside_spec):
        assert [r.tokens for r in rs] == live.answers
    for r in alone + [beside_plain[2]] + beside_spec:
        st = r.stats
        assert st.drafted > st.accepted > 0, (kind, st)  # drafts accepted and rejected: rollback exercised
    assert all(r.stats.llama_perf == {} for r in beside_spec)  # they shared steps


def test_rollback_leaves_the_kv_cache_as_plain_decoding_does(live, draft):
    """Hundreds of rejected draft rows; then the cache holds exactly the prompt and the answer's tokens
    but the last (llama.cpp's positions), and what it holds computes what a fresh cache computes."""
    prompt = live.tokens(PROMPTS[0])
    live.forget()
    (spec,) = live.run(live.sequence(prompt, 300, drafter=drafter(live, "draft", 0, draft)), on_step=Live.check_kv)
    assert spec.stats.drafted - spec.stats.accepted > 100
    slot = last_slot(live)
    assert slot.tokens == prompt + spec.tokens[:-1]
    assert live.positions(slot.seq) == (0, len(prompt) + len(spec.tokens) - 2)
    used = live.engine.slots.used
    live.forget()
    plain = live.plain(prompt, 300)
    assert plain.tokens == spec.tokens and live.engine.slots.used == used
    # the next turn continues on the speculative run's cells: the same as from an empty cache
    follow = prompt + spec.tokens + live.tokens(" and the tree")[1:]
    live.forget()
    live.run(live.sequence(prompt, 300, drafter=drafter(live, "draft", 0, draft)))
    reused = live.plain(follow, 40)
    assert reused.stats.n_reused == len(prompt) + len(spec.tokens) - 1
    live.forget()
    assert live.plain(follow, 40).tokens == reused.tokens


@pytest.fixture
def self_draft(live):
    """The target as its own draft: every draft is accepted (9 tokens a step with K = 8)."""
    spec = SpeculationSettings(mode="draft", draft_model=live.lm.path, k_max=8, p_min=0.0, adaptive=False)
    dm = DraftModel.load(spec, target=live.lm, llama_log=LlamaLog())
    yield lambda prompt: DraftModelDrafter(dm, spec, prompt=prompt, max_tokens=N, target=live.lm)
    dm.close()


def last_slot(live):
    return max(live.engine.slots.slots, key=lambda s: s.last_used)


def test_max_tokens_inside_a_draft(live, self_draft):
    """A draft is planned no longer than max_tokens leaves room for (1 + 9 + 4 tokens)."""
    prompt = live.tokens(PROMPTS[1])
    live.forget()
    (r,) = live.run(live.sequence(prompt, 14, drafter=self_draft(prompt)))
    assert r.tokens == live.answers[1][:14] and r.done.finish_reason == "length"
    assert r.stats.accepted == r.stats.drafted == 8 + 3
    assert last_slot(live).tokens == prompt + r.tokens[:-1]
    live.check_kv()


def test_forced_tokens_are_taken_like_sampled_ones_and_max_tokens_cuts_them(live):
    """Sequence.force (the hook a reasoning budget uses): forcing what the model would have written
    gives plain decoding's answer and cache; forcing past max_tokens ends inside them, cut there."""
    prompt = live.tokens(PROMPTS[0])
    answer = live.answers[0]

    def hook(s, t):
        if s.stats.n_gen == 5:
            s.force(answer[5:12])

    live.engine.update.token_hooks.append(hook)
    try:
        live.forget()
        (r,) = live.run(live.sequence(prompt, N), on_step=Live.check_kv)
        assert r.tokens == answer
        live.forget()
        (short,) = live.run(live.sequence(prompt, 9))
    finally:
        live.engine.update.token_hooks.clear()
    assert short.tokens == answer[:9] and short.done.finish_reason == "length"
    assert last_slot(live).tokens == prompt + answer[:8]  # forced rows after the end are not kept
    live.check_kv()


def test_a_stop_string_inside_an_accepted_draft(live, self_draft):
    prompt = live.tokens(PROMPTS[1])
    answer = live.answers[1]
    pieces = [live.vocab.text(t) for t in answer]
    text = "".join(pieces)
    # tokens 1-9 come from the first verified step: a stop made of two of them, first seen there
    j = next(j for j in range(3, 8) if text.find(pieces[j] + pieces[j + 1]) == len("".join(pieces[:j])))
    stop = pieces[j] + pieces[j + 1]
    live.forget()
    plain = live.plain(prompt, N, stop=(stop,))
    plain_kv = list(last_slot(live).tokens)
    live.forget()
    (r,) = live.run(live.sequence(prompt, N, drafter=self_draft(prompt), stop=(stop,)))
    assert r.done.finish_reason == plain.done.finish_reason == "stop" and r.done.stop == stop
    assert (r.text, r.tokens) == (plain.text, plain.tokens) and r.tokens == answer[:j + 2]
    assert r.stats.drafted == 8 and last_slot(live).tokens == plain_kv
    live.check_kv()


def test_a_cancel_during_a_step_with_an_accepted_draft(live, self_draft):
    """The cancel arrives while the step computes: nothing of that step is shown, and the cache keeps
    what was shown."""
    prompt = live.tokens(PROMPTS[1])
    live.forget()
    seq = live.sequence(prompt, N, drafter=self_draft(prompt))
    runner = live.engine.runner
    real = runner.decode
    steps = []

    def decode(ctx, batch):
        rc = real(ctx, batch)
        steps.append(batch.n_tokens)
        if len(steps) == 3:  # the second step with a draft (after prefill and one verified step)
            live.cancels.add(seq.rid)
        return rc

    runner.decode = decode
    try:
        (r,) = live.run(seq)
    finally:
        runner.decode = real
        live.cancels.clear()
    assert steps[1:] == [9, 9] and r.done.finish_reason == "cancelled"
    assert r.tokens == live.answers[1][:10]  # the prefill's token and the first step's 9
    assert seq.status is SequenceStatus.FINISHED_CANCELLED and seq.status.finished
    assert last_slot(live).tokens == prompt + r.tokens  # all it showed (it had been decoded); not the second draft
    live.check_kv()


class GraphCost:
    """A GPU-like clock (tests/engine/live.py ModelClock's cost): llama.cpp's CUDA graph is replayed
    only for a step shaped like the two before it; replayed, eight rows cost what one does."""

    def __init__(self) -> None:
        self.shapes = [(0, 0), (0, 0)]

    def __call__(self, rows: int, logits: int) -> float:
        shape = (rows, logits)
        before, last = self.shapes[-2:]
        self.shapes.append(shape)
        ratio = 1.0 if rows <= 8 else 1.6
        return 0.001 * ratio if shape == last == before else 0.0018 * ratio + 0.0004 * (shape == last)


def test_steps_padded_to_keep_their_shape_decode_as_plain_decoding_does(live):
    """Where a replayed shape costs no more with more rows, the planner pads steps to the shape of the
    steps before (filler rows, verified like drafts): the answers stay plain decoding's, the cache too."""
    gpu = Live(live.lm.path, SETTINGS, costs={k: 1.0 if k <= 7 else 1.6 for k in range(1, 17)},
               clock=ModelClock(GraphCost()))
    try:
        pads: list[int] = []
        planner = gpu.engine.drafts
        pad = planner._pad
        planner._pad = lambda order, n, budget: (pad(order, n, budget), pads.append(sum(r.pad for r in order)))
        lookups = [gpu.lookup(gpu.tokens(p), history=misleading(live.answers[i]), adaptive=True, k_max=16)
                   for i, p in enumerate(PROMPTS)]
        rs = gpu.run(*[gpu.sequence(p, N, drafter=lookups[i]) for i, p in enumerate(PROMPTS)], on_step=Live.check_kv)
        assert [r.tokens for r in rs] == live.answers
        assert sum(pads) > 0, pads  # filler rows were verified (and rolled back, or kept where they matched)
    finally:
        gpu.close()
