"""Random settings against the live step loop: every stream's answer equals its plain answer alone.

The other live tests pick their cases; these draw them (fixed seeds, so a failure replays): one to four
streams with lookup, a draft model (the target itself, or another model) or none, greedy or sampled (the
same seed), a JSON schema, a repetition penalty, a stop string cut from the plain answer, logprobs,
max_tokens, K and adaptive or not, a cancel while a step computes (what the stream showed is then the
start of its answer), beside one another in 1, 2 or 4 slots with prompt chunks of 8 to 64 tokens and 5
to 17 logits rows, from an empty cache or after the references. A tiny f32 model with an f32 KV cache:
its kernels give a row the same logits, to a few 1e-6, whatever else is in the batch, while an f16 cache
rounds such a difference in a key or value to a whole last bit (~1e-3), enough to move a sampled draw
over a boundary now and then (seen once in 400 drawn cases: a sampled stream that reused its prompt from
the prefix cache, no speculation anywhere, parted from its answer alone after 52 tokens; with f32 cells
all 400 agreed).

At the context's edge (a 256-token context, the smallest llama.cpp makes): the same draws with longer
prompts and answers, half of the streams under the `shift` policy (engine/batching/shift.py; a stream
runs past the window, its oldest tokens dropped), the others ending where the context does. Drafts
stop short of the edge (DraftPlanner._room), so a stream shifts at the token where its plain answer
does and then writes what it writes.

Found this way: a sampled JSON answer that had written the first two bytes of a surrogate's UTF-8
had no token left that fitted (engine/structured/grammar.py; tests/engine/test_grammar_utf8.py).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest

from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.engine.batching.sequence import Sequence
from ggufdesk.engine.batching.shift import ContextUse
from ggufdesk.engine.runtime.native import LlamaLog
from ggufdesk.engine.speculation.draft_model import DraftModel, DraftModelDrafter
from ggufdesk.engine.speculation.drafter import Drafter
from tests.engine.live import Live, Result
from tests.engine.test_live_grammar_speculation import constraint
from tests.engine.test_live_speculation import misleading
from tests.fixtures import ggufs

WORDS = ('the cat dog and was in house red tree by water one two three of people a man came back from world , . " '
         '1 2 3 4 5 6 7 8 9 10').split()
CASES = 64
EDGE_CASES = 16  # by hand: cases 0-299, 502 shifts (their plain references included), all equal
EDGE_CTX = 256  # llama.cpp's smallest context (a smaller n_ctx is padded up to it)


@pytest.fixture(scope="module")
def models(model_dir):
    target = ggufs.write_tiny_llama(model_dir / "random-target.gguf", ggufs.TinySpec(seed=0))
    other = ggufs.write_tiny_llama(model_dir / "random-other.gguf", ggufs.TinySpec(seed=5, n_layer=1))
    return target, other


@dataclass
class Stream:
    prompt: str
    max_tokens: int
    logprobs: int
    repeat_penalty: float
    temperature: float
    seed: int
    grammar: bool
    drafter: str  # "lookup", "draft" (the case's draft model; lookup in a case without one) or "none"
    k: int
    adaptive: bool
    misled: bool  # lookup drafts from an earlier text that departs from the answer every few tokens
    stop_at: tuple[float, int] | None  # a stop string: where in the plain answer's text (0-1), how long
    stop: tuple[str, ...] = ()
    plain: Result | None = None
    shift: bool = False  # the `shift` overflow policy: runs past the context's end (the edge cases)

    @classmethod
    def draw(cls, rng: random.Random) -> Stream:
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
        text = " ".join(words * rng.randint(1, 5) + [rng.choice(WORDS) for _ in range(rng.randint(0, 20))])
        return cls(text, rng.randint(1, 80), rng.choice([0, 0, 2]), rng.choice([1.0, 1.0, 1.1, 1.3]),
                   rng.choice([0.0, 0.0, 0.8]), rng.randint(0, 99), rng.random() < 0.25,
                   rng.choice(["lookup", "lookup", "draft", "none"]), rng.choice([2, 4, 8, 16]),
                   rng.random() < 0.5, rng.random() < 0.5,
                   (rng.random(), rng.randint(1, 3)) if rng.random() < 0.4 else None)


@dataclass
class Case:
    n_parallel: int
    prefill_chunk: int
    n_outputs: int
    draft: str  # "self" (the target drafts for itself), "other" (another model), "none"
    draft_k: int
    p_min: float
    draft_adaptive: bool
    streams: list[Stream]
    forget: bool  # an empty cache before the streams run (else the references' prompts are in it)
    cancel: tuple[int, int] | None  # (a stream, the decode call after which it is cancelled)

    @classmethod
    def draw(cls, case: int) -> Case:
        rng = random.Random(case)
        return cls(rng.choice([1, 2, 4]), rng.choice([8, 16, 64]), rng.choice([5, 9, 17]),
                   rng.choice(["none", "self", "other"]), rng.choice([3, 5, 8]), rng.choice([0.0, 0.3]),
                   rng.random() < 0.5, streams := [Stream.draw(rng) for _ in range(rng.randint(1, 4))],
                   rng.random() < 0.5, (rng.randrange(len(streams)), rng.randint(1, 40)) if rng.random() < 0.3 else None)


def sequence(live: Live, st: Stream, drafter: Drafter | None) -> Sequence:
    s = live.sequence(st.prompt, st.max_tokens, drafter=drafter, temperature=st.temperature, seed=st.seed,
                      stop=st.stop, logprobs=st.logprobs)
    if st.shift:  # as the worker makes a `shift` request: BOS kept, no edge, the whole context reserved
        s.ctx = ContextUse(policy="shift", n_keep=1, cells=live.lm.n_ctx)
        s.max_gen = st.max_tokens
    s.sampling = dataclasses.replace(s.sampling, repeat_penalty=st.repeat_penalty)
    if st.grammar:
        s.constraint = constraint(live)
    return s


def make_drafter(live: Live, st: Stream, draft: tuple[DraftModel, SpeculationSettings] | None) -> Drafter | None:
    prompt = live.tokens(st.prompt)
    if st.drafter == "draft" and draft is not None:
        return DraftModelDrafter(draft[0], draft[1], prompt=prompt, max_tokens=st.max_tokens, target=live.lm)
    if st.drafter == "none":
        return None
    assert st.plain is not None
    history = misleading(st.plain.tokens) if st.misled and len(st.plain.tokens) > 9 else None
    return live.lookup(prompt, history=history, k_max=st.k, adaptive=st.adaptive)


def reference(live: Live, st: Stream) -> None:
    """The stream's plain answer, alone, from an empty cache (with its stop string, cut from the answer
    without one: it ends earlier)."""
    live.forget()
    st.plain = live.run(sequence(live, st, None))[0]
    text = st.plain.text
    if st.stop_at is not None and len(text) > 6:
        at = min(int(st.stop_at[0] * len(text)) + 1, len(text) - 3)
        st.stop = (text[at:at + st.stop_at[1]],)
        live.forget()
        st.plain = live.run(sequence(live, st, None))[0]


def check(live: Live, st: Stream, got: Result) -> None:
    want = st.plain
    assert want is not None and want.error is None and got.error is None, (want, got)
    assert want.done is not None and got.done is not None
    if got.done.finish_reason == "cancelled":  # what it showed before: the start of its answer
        if want.tokens[:len(got.tokens)] != got.tokens and not st.temperature:
            live.near_tie_at_divergence(live.tokens(st.prompt), want.tokens, got.tokens, 0.01)
            return
        assert want.tokens[:len(got.tokens)] == got.tokens and want.text.startswith(got.text), st
        return
    if got.text != want.text and not st.temperature:
        # greedy may flip at a near tie (a row's logits differ by ~1e-6 with the batch); a flip at a
        # clear margin fails here
        live.near_tie_at_divergence(live.tokens(st.prompt), want.tokens, got.tokens, 0.01)
        return
    assert (got.text, got.done.finish_reason) == (want.text, want.done.finish_reason), st


def cancel_after(live: Live, rid: str, calls: int) -> None:
    """Cancel `rid` while the loop's `calls`-th decode computes (what that step wrote is not shown)."""
    runner = live.engine.runner
    real, n = runner.decode, [0]

    def decode(ctx: object, batch: object) -> int:
        n[0] += 1
        if n[0] == calls:
            live.cancels.add(rid)
        return real(ctx, batch)

    runner.decode = decode


def at_the_edge(case: int) -> Case:
    """Case.draw's case with longer prompts and answers, half of the streams shifting."""
    c, rng = Case.draw(case), random.Random(1_000_000 + case)
    if c.draft == "none" and rng.random() < 0.5:
        c.draft = rng.choice(["self", "other"])
    for st in c.streams:
        st.shift = rng.random() < 0.5
        st.max_tokens = rng.randint(100, 500) if rng.random() < 0.7 else st.max_tokens
        if rng.random() < 0.5:
            st.prompt = " ".join((st.prompt.split() * 20)[:rng.randint(20, 70)])
    return c


@pytest.mark.parametrize("case", range(CASES))
def test_random_streams_with_speculation_equal_their_plain_answers(models, case):
    run_case(models, Case.draw(case), n_ctx=2048)


@pytest.mark.parametrize("case", range(EDGE_CASES))
def test_random_streams_at_the_context_edge_equal_their_plain_answers(models, case):
    run_case(models, at_the_edge(case), n_ctx=EDGE_CTX)


def run_case(models, c: Case, *, n_ctx: int) -> None:
    settings = LoadSettings(n_ctx=n_ctx, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, flash_attn="off",
                            n_parallel=c.n_parallel, prefill_chunk=c.prefill_chunk, type_k="f32", type_v="f32")
    live = Live(models[0], settings, n_outputs=c.n_outputs)
    draft: tuple[DraftModel, SpeculationSettings] | None = None
    for st in c.streams:  # (a prompt leaves room for an answer)
        while len(live.tokens(st.prompt)) > n_ctx - 56:
            st.prompt = " ".join(st.prompt.split()[:-3])
    try:
        if c.draft != "none":
            spec = SpeculationSettings(mode="draft", draft_model=str(models[0] if c.draft == "self" else models[1]),
                                       k_max=c.draft_k, p_min=c.p_min, adaptive=c.draft_adaptive)
            draft = DraftModel.load(spec, target=live.lm, llama_log=LlamaLog()), spec
        for st in c.streams:
            reference(live, st)
        if c.forget:
            live.forget()
        seqs = [sequence(live, st, make_drafter(live, st, draft)) for st in c.streams]
        if c.cancel is not None:
            cancel_after(live, seqs[c.cancel[0]].rid, c.cancel[1])
        got = live.run(*seqs, on_step=Live.check_kv)
        for st, r in zip(c.streams, got):
            check(live, st, r)
    finally:
        if draft is not None:
            draft[0].close()
        live.close()


def test_the_draws_cover_what_they_are_for():
    """The seeds in use draw every kind of case this file is about (a change to the draws must not
    quietly drop one): each drafter beside others, sampled and greedy, a schema, a stop string, a cancel."""
    cases = [Case.draw(i) for i in range(CASES)]
    streams = [(c, st) for c in cases for st in c.streams]
    drafted = {st.drafter if st.drafter != "draft" else f"draft-{c.draft}" for c, st in streams}
    assert {"lookup", "none", "draft-self", "draft-other"} <= drafted
    assert {st.temperature for _, st in streams} == {0.0, 0.8}
    assert any(st.grammar and st.drafter != "none" for _, st in streams)
    assert any(st.stop_at and st.drafter != "none" for _, st in streams)
    assert any(len(c.streams) == 4 and c.n_parallel == 4 for c in cases)
    assert {c.prefill_chunk for c in cases} == {8, 16, 64} and {c.n_outputs for c in cases} == {5, 9, 17}
    assert any(c.cancel and c.streams[c.cancel[0]].drafter != "none" and len(c.streams) > 1 for c in cases)


def test_the_edge_draws_shift_and_end_at_the_edge_while_drafting():
    """The edge seeds hold streams that must run past the window (an answer longer than the context)
    drafting by lookup and by a draft model, and streams that end where the context does, drafting."""
    streams = [(c, st) for c in map(at_the_edge, range(EDGE_CASES)) for st in c.streams]
    long = [(c, st) for c, st in streams if st.max_tokens > EDGE_CTX and st.stop_at is None]
    assert any(st.shift and st.drafter == "lookup" for _, st in long)
    assert any(st.shift and st.drafter == "draft" and c.draft != "none" for c, st in long)
    assert any(not st.shift and st.drafter != "none" for _, st in long)
