"""The lock-out scenario through the real decode loop on the tiny model, and lookup across requests in the engine.

Step costs come from the CPU cost model of tests/engine/test_adaptive_recovery.py rather than the
tiny model's microseconds (a wrapper reports them to the controller), so the decisions are those
the starter model would see and the test does not depend on the machine's load.
"""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.speculation.lookup import NgramCache, PromptLookup
from tests.engine.helpers import collect, greedy
from tests.engine.test_adaptive_recovery import FIXED_S, PLAIN_S, ROW_S, Counting

PROMPT = "hello the cat and the dog were in the house"


class CpuCosts(Counting):
    """Counting, but the drafter is told simulated CPU step costs, and where drafts were accepted is kept."""

    def __init__(self, inner: PromptLookup) -> None:
        super().__init__(inner)
        self.pos = 0  # tokens emitted before the current step (the first token comes before any step)
        self.steps: list[tuple[int, int, int]] = []  # (position, drafted, accepted)

    def feedback(self, n_drafted: int, n_accepted: int, seconds: float) -> None:
        self.steps.append((self.pos, n_drafted, n_accepted))
        self.pos += n_accepted + 1
        super().feedback(n_drafted, n_accepted, PLAIN_S if not n_drafted else FIXED_S + ROW_S * n_drafted)

    def accepted_from(self, start: int) -> int:
        return sum(a for p, d, a in self.steps if p >= start)

    def rejected_before(self, end: int) -> int:
        return sum(1 for p, d, a in self.steps if p < end and a < d)


@pytest.fixture(scope="module")
def gen(tiny_model):
    from ggufdesk.engine.batching.generate import Generator
    from ggufdesk.engine.runtime.native import LlamaLog, load_model

    lm = load_model(str(tiny_model), LoadSettings(n_ctx=2048), LlamaLog())
    yield Generator(lm)
    lm.close()


def _run(gen, prompt: list[int], n: int, drafter=None) -> list[int]:
    gen.truncate(0)
    _, st = gen.run(prompt, SamplingSettings(temperature=0.0, max_tokens=n), emit_text=lambda t: None,
                    drafter=drafter)
    return st.tokens


def test_lookup_recovers_when_the_first_drafts_fail_through_the_real_loop(gen):
    """An earlier request left misleading text (the answer's first tokens, then something else) and
    the answer's later part: the first drafts fail, the later part must still be drafted."""
    prompt = gen.tokenize(PROMPT)
    truth = _run(gen, prompt, 240)
    start = 80
    misleading: list[int] = []
    for j in range(8):
        misleading += truth[8 * j:8 * j + 3 + j] + [5 + j, 6 + j, 7 + j]
    runs = {}
    for adaptive in (False, True):
        cache = NgramCache(3)
        cache.feed(misleading)
        cache.feed(truth[start:])
        d = CpuCosts(PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=adaptive, history=cache))
        assert _run(gen, prompt, 240, d) == truth  # lossless either way
        runs[adaptive] = d
    fixed, adaptive = runs[False], runs[True]
    assert fixed.rejected_before(start) >= 4  # the first drafts do fail
    later = 240 - start - 16
    assert adaptive.accepted_from(start + 16) >= 0.7 * later, str(adaptive.steps)
    assert adaptive.accepted_from(start + 16) >= 0.85 * fixed.accepted_from(start + 16)
    assert adaptive.status == "lookup"


def test_a_draft_model_stops_where_its_own_confidence_makes_more_tokens_not_worth_it(gen, tiny_model):
    """The draft model's probability is evidence too: the draft ends where the chance that all of it
    is accepted (the product of its top probabilities) drops below q_min."""
    from ggufdesk.core.settings import SpeculationSettings
    from ggufdesk.engine.speculation import speculative as S
    from ggufdesk.engine.runtime.native import LlamaLog

    spec = SpeculationSettings(mode="draft", draft_model=str(tiny_model), k_max=8, p_min=0.0)
    dm = S.DraftModel.load(spec, target=gen.lm, llama_log=LlamaLog())
    try:
        seq = gen.tokenize(PROMPT)
        dm.sync(seq)
        full = dm.greedy(8, 0.0)
        dm.sync(seq)
        assert dm.greedy(8, 0.0, q_min=1.0) == full[:1]  # the first token is always proposed
        dm.sync(seq)
        assert dm.greedy(8, 0.0, q_min=1e-30) == full  # a bar no draft falls under
        assert len(full) == 8
    finally:
        dm.close()


# ---- through the engine process: the worker's conversation-wide cache ---------------------------

@pytest.fixture
def engine(tiny_model):
    from ggufdesk.engine.link.client import EngineClient

    with EngineClient(auto_restart=False) as client:
        client.load(str(tiny_model), settings={"n_ctx": 2048}, speculation={"k_max": 8})
        yield client


def _generate(client, prompt: str, speculation: dict) -> tuple[str, P.Stats]:
    rid = client.generate(prompt=prompt, sampling=greedy(150), speculation=speculation)
    r = collect(client, rid)
    assert r.error is None, f"engine error: {r.error.message}"
    assert r.stats is not None
    return r.text, r.stats


def test_a_regenerated_answer_is_drafted_from_the_earlier_one(engine):
    """The worker keeps every prompt and answer: asking again drafts from the first answer."""
    lookup = {"mode": "lookup", "k_max": 8, "adaptive": False}
    first, _ = _generate(engine, PROMPT, {"mode": "off"})  # a plain request feeds the cache too
    _generate(engine, "the dog", {"mode": "off", "lookup_history": False})  # another conversation between
    alone, st_alone = _generate(engine, PROMPT, {**lookup, "lookup_history": False})
    again, st = _generate(engine, PROMPT, lookup)
    assert first == alone == again
    assert st.accepted > st_alone.accepted and st.accepted >= 120, (st.accepted, st_alone.accepted)


def test_reloading_forgets_the_conversation(engine, tiny_model):
    lookup = {"mode": "lookup", "k_max": 8, "adaptive": False}
    _generate(engine, PROMPT, {"mode": "off"})
    engine.load(str(tiny_model), settings={"n_ctx": 2048}, speculation={"k_max": 8})
    alone, st_alone = _generate(engine, PROMPT, {**lookup, "lookup_history": False})
    after, st = _generate(engine, PROMPT, lookup)
    assert after == alone and st.accepted == st_alone.accepted  # nothing left from before the reload


def test_sentence_ends_are_read_from_the_vocabulary(gen):
    from ggufdesk.engine.speculation.speculative import SentenceEnds

    ends = SentenceEnds(gen.lm)
    by_text = {gen.piece(t).decode("utf-8", "replace"): t for t in gen.tokenize("the cat. the dog! why? so,\n",
                                                                                   add_bos=False)}
    assert {p for p, t in by_text.items() if ends(t)} == {".", "!", "?", "\n"}
    assert not ends(by_text[","]) and not any(ends(t) for p, t in by_text.items() if p.strip(" ,").isalpha())
    assert ends(by_text["."])  # read once, then remembered
    assert len(ends._known) == len(by_text)


def test_quote_marks_are_read_from_the_vocabulary(gen):
    from ggufdesk.engine.speculation.speculative import QuoteMarks

    marks = QuoteMarks(gen.lm)
    text = 'He said "stay." and so.\nok "'
    tokens = gen.tokenize(text, add_bos=False)
    assert b"".join(gen.piece(t) for t in tokens).decode().lstrip() == text  # (a leading space, SPM-style)
    read = [marks(t) for t in tokens]
    assert "".join(m for _, m in read) == '"""'
    assert [gen.piece(t) for t, (starts, _) in zip(tokens, read) if starts] == [b"\n"]
    assert marks(tokens[0]) == (False, "")
    # curly ones by direction, and only those after a piece's last newline count for its line
    # (the tiny model's vocabulary spells them in bytes; the starter's has them whole: ' \u201c', ',\u201d')
    piece = QuoteMarks.__new__(QuoteMarks)._read
    assert piece(" \u201c".encode()) == (False, "(") and piece(",\u201d".encode()) == (False, ")")
    assert piece(b'."\n"') == (True, '"')


def test_numbers_are_read_from_the_vocabulary(gen):
    from ggufdesk.engine.speculation.speculative import Numbers

    nums = Numbers(gen.lm)
    tokens = gen.tokenize("1. a\n2. b 10 x 7", add_bos=False)
    read = {gen.piece(t): nums(t) for t in tokens}
    assert read[b"1"] == ("", 1) and read[b"2"] == ("", 2) and read[b"7"] == ("", 7) and read[b"0"] == ("", 0)
    assert read[b"."] is None and read[b" a"] is None and read[b"\n"] is None
    three = nums.token("", 3)
    assert three is not None and gen.piece(three) == b"3" and nums(three) == ("", 3)
    assert nums.token("", 12) is None  # this vocabulary writes 12 with two tokens: not counted on
    assert nums.token("", 3) == three and len(nums._tokens) == 2  # looked up once


def test_the_vocabulary_is_read_once_per_loaded_model(tiny_model):
    """Sentence ends, quote marks and numbers are facts of the model: the worker keeps them across
    requests, and a reload reads the new model's."""
    from ggufdesk.core.settings import SpeculationSettings
    from ggufdesk.engine.runtime.worker import CancelBook, Engine

    engine = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings={"n_ctx": 256}))
    spec = SpeculationSettings(mode="lookup", k_max=8)
    first, second = engine._drafter(spec, [1, 2, 3], 8), engine._drafter(spec, [4, 5, 6], 8)
    assert first is not second  # a drafter per request...
    assert first.ends_sentence is second.ends_sentence and first.quote_marks is second.quote_marks
    assert first.numbers is second.numbers  # ... reading one model's vocabulary
    engine.load(P.Load(id="m", model=str(tiny_model), settings={"n_ctx": 256}))
    assert engine._drafter(spec, [1, 2, 3], 8).numbers is not first.numbers
    engine.unload(quiet=True)
    assert engine._token_text is None


def test_a_piece_longer_than_the_scratch_buffer_is_read_whole(gen):
    import ctypes

    from ggufdesk.engine.runtime.native import token_piece

    for t in gen.tokenize("the cat. the dog! why? so,\n", add_bos=False):
        assert token_piece(gen.lm.vocab, t, ctypes.create_string_buffer(1)) == gen.piece(t) != b""
