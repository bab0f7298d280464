"""Speculative decoding: lossless output (greedy and seeded sampling), KV consistency, refusal, cancel, adaptation."""
from __future__ import annotations

import re

import pytest

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.native import LlamaLog
from ggufdesk.engine.speculation.adaptive import MIN_EVIDENCE, DraftLength, expected_tokens
from ggufdesk.engine.speculation.lookup import NgramCache, PromptLookup
from tests.engine.live import COSTS, PLAIN_S, Live, ModelClock
from tests.fixtures import ggufs

PROMPT = "hello the cat and the dog were in the house"
PASSAGE = ("The river town of Ashford sits where two valleys meet. Its market opens at dawn every Saturday, "
           "and farmers bring apples, cheese, honey and wool from the hills. The old stone bridge, built in "
           "1642, still carries carts across the water, although a newer bridge downstream now takes the "
           "heavy lorries. In winter the river often floods the lower meadows, and the children skate on "
           "the frozen ponds. The town library keeps a collection of maps that show how the streets have "
           "changed over three centuries.")
COPY_PROMPT = f"Text: {PASSAGE}\n\nThe same text, copied exactly:\n{PASSAGE[:60]}"
GREEDY = {"temperature": 0.0, "max_tokens": 120}


# ---- through the engine process ---------------------------------------------------------------

@pytest.fixture
def engine():
    from ggufdesk.engine.link.client import EngineClient

    with EngineClient(auto_restart=False) as client:
        yield client


def _generate(client, prompt: str, sampling: dict, speculation: dict | None = None) -> tuple[str, P.Stats, P.Done]:
    rid = client.generate(prompt=prompt, sampling=sampling, speculation=speculation)
    stats = done = None
    text = []
    for ev in client.stream(rid, timeout=600):
        if isinstance(ev, P.Token):
            text.append(ev.text)
        elif isinstance(ev, P.Stats):
            stats = ev
        elif isinstance(ev, P.Done):
            done = ev
        elif isinstance(ev, P.Error):
            raise AssertionError(f"engine error: {ev.message}")
    return "".join(text), stats, done


def _load_with_draft(client, model, draft, **spec):
    spec = {"mode": "draft", "draft_model": str(draft), "p_min": 0.0, "adaptive": False, **spec}
    return client.load(str(model), settings={"n_ctx": 2048}, speculation=spec)


def test_self_draft_is_identical_with_full_acceptance(engine, tiny_model):
    loaded = _load_with_draft(engine, tiny_model, tiny_model, k_max=8)
    assert loaded.draft == str(tiny_model)
    assert loaded.memory["draft"] > 0
    plain, pst, _ = _generate(engine, PROMPT, GREEDY, {"mode": "off"})
    spec, st, done = _generate(engine, PROMPT, GREEDY)
    assert spec == plain and pst.n_gen == st.n_gen == 120
    assert pst.drafted == 0 and pst.speculation == "off"
    assert st.drafted > 0 and st.accepted == st.drafted  # the model agrees with itself
    assert st.drafted >= 100  # nearly every token came from a draft
    assert st.draft_len == 8 and st.speculation == "draft"
    assert done.finish_reason == "length"


def test_different_draft_is_identical_with_low_acceptance(engine, tiny_model, tiny_draft):
    _load_with_draft(engine, tiny_model, tiny_draft, k_max=4)
    plain, _, _ = _generate(engine, PROMPT, GREEDY, {"mode": "off"})
    spec, st, _ = _generate(engine, PROMPT, GREEDY)
    assert spec == plain
    assert st.drafted > 50 and st.accepted < st.drafted / 2  # mostly rejected, still exact


def test_seeded_sampling_gives_the_same_tokens(engine, tiny_model, tiny_draft):
    """Sample-and-match draws one sample per emitted token, in order: same seed, same tokens."""
    _load_with_draft(engine, tiny_model, tiny_model, k_max=6)
    sampling = {"temperature": 0.8, "seed": 1234, "max_tokens": 150}
    plain, _, _ = _generate(engine, PROMPT, sampling, {"mode": "off"})
    spec, st, _ = _generate(engine, PROMPT, sampling)
    assert spec == plain
    assert 0 < st.accepted < st.drafted  # greedy drafts vs sampled target: some rejected
    other, _, _ = _generate(engine, PROMPT, {**sampling, "seed": 99}, {"mode": "off"})
    assert other != plain  # the seed matters, so the equality above means something


def test_incompatible_draft_is_refused_and_the_engine_carries_on(engine, tiny_model, tiny_chatml):
    engine.load(str(tiny_model), settings={"n_ctx": 2048},
                speculation={"mode": "draft", "draft_model": str(tiny_chatml)})
    errors = [ev for ev in engine.events(timeout=0.5) if isinstance(ev, P.Error)]
    assert engine.loaded.draft is None and "draft" not in engine.loaded.memory
    assert len(errors) == 1 and errors[0].kind == "draft"
    assert "does not match" in errors[0].message and "token 5" in errors[0].message
    text, st, _ = _generate(engine, PROMPT, GREEDY)
    assert st.n_gen == 120 and st.drafted == 0 and st.speculation == "off"


def test_incompatible_vocab_size_is_named(engine, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(ggufs, "WORDS", list(ggufs.WORDS) + [f"w{i}" for i in range(200)])
    big = ggufs.write_tiny_llama(tmp_path / "big.gguf", ggufs.TinySpec(seed=3))
    engine.load(str(tiny_model), settings={"n_ctx": 512}, speculation={"mode": "draft", "draft_model": str(big)})
    errors = [ev for ev in engine.events(timeout=0.5) if isinstance(ev, P.Error)]
    assert [e.kind for e in errors] == ["draft"] and engine.loaded.draft is None
    assert re.search(r"vocab size \d+ vs \d+ \(more than 128 apart\)", errors[0].message)


def test_cancel_mid_speculation(engine, tiny_model):
    _load_with_draft(engine, tiny_model, tiny_model, k_max=8)
    plain, _, _ = _generate(engine, PROMPT, GREEDY, {"mode": "off"})
    rid = engine.generate(prompt=PROMPT, sampling={"temperature": 0.0, "max_tokens": 1900})
    n_tokens, done = 0, None
    for ev in engine.stream(rid, timeout=600):  # (a hang guard: 1900 tokens take seconds when not cancelled)
        if isinstance(ev, P.Token):
            n_tokens += 1
            if n_tokens == 3:
                engine.cancel(rid)
        elif isinstance(ev, P.Done):
            done = ev
    assert done is not None and done.finish_reason == "cancelled" and len(done.tokens) < 1900
    # the KV caches of target and draft are still consistent: same output as before
    again, st, _ = _generate(engine, PROMPT, GREEDY)
    assert again == plain and st.accepted == st.drafted > 0


# ---- on the live step loop, in this process (tests/engine/live.py) ----------------------------

@pytest.fixture(scope="module")
def live(tiny_model):
    lv = Live(tiny_model, LoadSettings(n_ctx=2048, n_threads=1, n_threads_batch=1, flash_attn="off"),
              clock=ModelClock(lambda rows, logits: PLAIN_S * rows))  # every row costs a whole plain step
    yield lv
    lv.close()


def test_adaptive_switches_off_when_speculation_is_slower(live, tiny_draft):
    """Where every verified row costs a plain step and the draft is mostly wrong, drafting can only
    lose: the controller sees it from the steps' costs and pauses, while fixed K drafts on."""
    from ggufdesk.engine.speculation.draft_model import DraftModel, DraftModelDrafter

    spec = SpeculationSettings(mode="draft", draft_model=str(tiny_draft), k_max=8, p_min=0.0)
    fixed = SpeculationSettings(mode="draft", draft_model=str(tiny_draft), k_max=8, p_min=0.0, adaptive=False)
    dm = DraftModel.load(spec, target=live.lm, llama_log=LlamaLog())
    try:
        prompt = live.tokens(PROMPT)
        runs = {}
        for s in (spec, fixed):
            live.forget()
            d = DraftModelDrafter(dm, s, prompt=prompt, max_tokens=300, target=live.lm)
            (runs[s.adaptive],) = live.run(live.sequence(prompt, 300, drafter=d))
    finally:
        dm.close()
    adaptive, fixed_k = runs[True].stats, runs[False].stats
    assert runs[True].tokens == runs[False].tokens
    assert adaptive.speculation.startswith("disabled: slower than plain")
    assert fixed_k.speculation == "draft" and 0 < adaptive.drafted < fixed_k.drafted / 2


def test_draft_mode_without_draft_model_is_a_clear_error(live):
    from ggufdesk.engine.speculation.speculative import make_drafter

    with pytest.raises(KnownError, match="needs a loaded draft model"):
        make_drafter(SpeculationSettings(mode="draft", draft_model="x.gguf"), prompt=[1], draft=None,
                     target=live.lm)


# ---- pure pieces -------------------------------------------------------------------------------

def test_ngram_index_prefers_the_longest_latest_match():
    ix = NgramCache(3)
    ix.feed([1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3])
    n, c, m = ix.match()
    assert (n, ix.continuation(c, 3), m) == (3, [4, 5, 9], 3)
    ix.feed([1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3, 8, 2])  # grows: incremental
    n, c, _ = ix.match()
    assert n == 1 and ix.continuation(c, 2) == [3, 8]  # latest '2' is followed by 3, 8
    ix.feed([50, 60, 70])  # a different history: a new document, no match inside it or across
    assert ix.match() == (0, -1, 0)


def test_lookup_stops_drafting_a_match_class_that_keeps_failing():
    lk = PromptLookup(ngram=3, k_min=1, k_max=8, adaptive=True)
    lk.control.feedback(0, 0, 0.010)  # plain probe: 10 ms
    lk.control.samples.extend([(8, 0.030), (4, 0.020)])
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    first = lk.propose(seq, 10, 8)
    assert len(first) >= 4 and first == [11, 12, 13, 14, 15, 16, 17, 1][:len(first)]  # a 10-token match: worth it
    for _ in range(6):
        lk.feedback(8, 0, 0.030)
    assert lk.propose(seq, 10, 8) == []  # learned: these drafts fail here
    assert lk.propose([1, 2, 3, 9], 1, 8) == []  # 1-token matches are not worth a verify batch


def test_controller_grows_k_with_high_acceptance_and_cheap_verification():
    c = DraftLength(k_min=1, k_max=16, adaptive=True, label="lookup", k_start=2)
    assert c.k == 0  # the first step is a plain probe
    c.feedback(0, 0, 0.010)
    for _ in range(6):
        c.feedback(c.k, c.k, 0.012 + 0.002 * c.k)  # verification nearly free per token
    assert c.k >= 8 and not c.disabled  # grew from 2 towards the longest cheap draft


def test_controller_disables_when_measured_slower_and_fixed_k_never_does():
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="draft")
    c.feedback(0, 0, 0.010)
    for _ in range(MIN_EVIDENCE - 1):
        c.feedback(c.k or 8, 1, 0.060)
    assert c.k > 0  # not on thinner evidence than MIN_EVIDENCE steps
    c.feedback(c.k or 8, 1, 0.060)
    assert c.k == 0 and c.status.startswith("disabled: slower than plain")


def test_one_stalled_step_does_not_switch_speculation_off():
    """A step stalled by another process (a busy shared machine) must not end speculation."""
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="lookup")
    c.feedback(0, 0, 0.010)
    c.feedback(8, 8, 0.500)  # one stall: 9 tokens in half a second
    for _ in range(MIN_EVIDENCE + 3):
        c.feedback(c.k or 8, c.k or 8, 0.015)  # then full acceptance at 1.5 plain steps
    assert c.k > 0 and c.status == "lookup"
    fixed = DraftLength(k_min=1, k_max=8, adaptive=False, label="draft")
    for _ in range(10):
        fixed.feedback(8, 0, 0.060)
    assert fixed.k == 8 and fixed.status == "draft"


def test_expected_tokens():
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.0, 4) == 1
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-9


# ---- the real starter model (slow tier) --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang guard: on a loaded 2-core machine the starter takes minutes here
def test_starter_lookup_on_a_copy_prompt_is_identical(starter_model):
    """Prompt lookup on the real model, on the live loop, fixed K (4, 8) and adaptive (modelled step
    costs; one thread, which suffers least from a busy machine)."""
    live = Live(starter_model, LoadSettings(n_ctx=2048, n_threads=1, n_threads_batch=1), costs=COSTS,
                clock=ModelClock())
    try:
        prompt = live.tokens(COPY_PROMPT)
        plain = live.plain(prompt, 120).tokens
        flips = []
        for k, adaptive in ((4, False), (8, False), (16, True)):
            live.forget()
            d = live.lookup(prompt, k_max=k, adaptive=adaptive, costs=COSTS)
            (r,) = live.run(live.sequence(prompt, 120, drafter=d))
            st = r.stats
            assert st.accepted > 60 and st.accepted / st.drafted > 0.5, (k, st.drafted, st.accepted)
            flips.append(live.near_tie_at_divergence(prompt, plain, r.tokens, tol=0.5))
        assert flips.count(None) >= 2, f"flips at margins {flips}"
    finally:
        live.close()
