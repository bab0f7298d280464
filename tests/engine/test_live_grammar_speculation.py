"""Speculation under a grammar on the live step loop (tiny f32/f16 models, kernels exact but for ~1e-6): the answer
equals plain constrained decoding's, alone and beside three other speculating streams, with drafts
accepted and rejected. Verification samples row by row under the grammar and each sample advances it
as plain decoding's would; a rejected draft token never reaches it, so nothing is taken back out."""
from __future__ import annotations

import llama_cpp
import pytest

from ggufdesk.engine.structured.grammar import GrammarConstraint, schema_to_gbnf
from tests.engine.live import Live
from tests.engine.test_live_speculation import PROMPTS, SETTINGS, Misled, misleading
from tests.fixtures import ggufs

N = 60
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "string"}}}, "required": ["name", "tags"]}


@pytest.fixture(scope="module", params=["f32", "f16"])
def live(request, model_dir):
    model = ggufs.write_tiny_llama(model_dir / f"live-grammar-{request.param}.gguf",
                                   ggufs.TinySpec(seed=0, dtype=request.param))
    lv = Live(model, SETTINGS)
    yield lv
    lv.close()


def constraint(live: Live, marker: int | None = None) -> GrammarConstraint:
    """The schema's grammar; with a marker token, lazy: free text until the model writes that token,
    then the marker's text and the schema (llama.cpp feeds the grammar the triggering token's text, as
    a tool call's grammar begins with its marker)."""
    lm = live.lm
    gbnf = schema_to_gbnf(SCHEMA)
    if marker is not None:
        gbnf = gbnf.replace("root ::=", "obj ::=", 1) + f'\nroot ::= "{live.vocab.text(marker)}" obj\n'
    return GrammarConstraint(lm.vocab, lm.n_vocab, gbnf, piece=live.vocab.piece,
                             marker=None if marker is None else live.vocab.text(marker),
                             marker_tokens=None if marker is None else [marker])


def constrained(live: Live, i: int, *, drafter=None, marker: int | None = None, temperature: float = 0.0):
    seq = live.sequence(PROMPTS[i], N, drafter=drafter, temperature=temperature, seed=11 + i)
    seq.constraint = constraint(live, marker)
    return seq


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_lookup_under_a_json_schema_equals_plain_alone_and_beside_others(live, temperature):
    plain = [live.run(constrained(live, i, temperature=temperature))[0] for i in range(len(PROMPTS))]
    assert all(r.error is None and r.text.startswith("{") for r in plain), [r.text for r in plain]
    answers = [r.tokens for r in plain]

    def spec(i):
        return constrained(live, i, temperature=temperature,
                           drafter=live.lookup(live.tokens(PROMPTS[i]), history=misleading(answers[i])))

    alone = live.run(spec(2), on_step=Live.check_kv)
    assert alone[0].tokens == answers[2]
    beside = live.run(*[spec(i) for i in range(len(PROMPTS))], on_step=Live.check_kv)
    assert [r.tokens for r in beside] == answers
    assert [r.text for r in beside] == [r.text for r in plain]
    drafted = sum(r.stats.drafted for r in alone + beside)
    accepted = sum(r.stats.accepted for r in alone + beside)
    assert drafted > accepted > 0, (drafted, accepted)  # drafts taken and rolled back under the grammar


def test_a_draft_model_under_a_lazy_grammar_that_triggers_mid_answer(live, draft_model):
    """Free text until a marker the model writes on its own, then the schema: with drafts accepted and
    rejected around it, the grammar takes over where plain decoding's does."""
    free = live.plain(PROMPTS[1], N)
    at = next(j for j in range(4, N) if live.vocab.text(free.tokens[j]).isascii()
              and live.vocab.text(free.tokens[j]).strip().isalpha())  # a plain word the free answer writes early
    marker = free.tokens[at]
    plain = live.run(constrained(live, 1, marker=marker))[0]
    assert plain.error is None and plain.tokens[:at + 1] == free.tokens[:at + 1], plain.text
    after = b"".join(live.vocab.piece(t) for t in plain.tokens[at + 1:]).decode(errors="replace")
    assert after.lstrip().startswith("{"), after  # the schema from the marker on
    (r,) = live.run(constrained(live, 1, marker=marker, drafter=draft_model(PROMPTS[1])), on_step=Live.check_kv)
    assert (r.tokens, r.text) == (plain.tokens, plain.text)
    assert r.stats.drafted > r.stats.accepted > 0, r.stats


@pytest.fixture
def draft_model(live):
    from ggufdesk.core.settings import SpeculationSettings
    from ggufdesk.engine.runtime.native import LlamaLog
    from ggufdesk.engine.speculation.draft_model import DraftModel, DraftModelDrafter

    spec = SpeculationSettings(mode="draft", draft_model=live.lm.path, k_max=5, p_min=0.0, adaptive=False)
    dm = DraftModel.load(spec, target=live.lm, llama_log=LlamaLog())
    yield lambda prompt: Misled(DraftModelDrafter(dm, spec, prompt=live.tokens(prompt), max_tokens=N,
                                                  target=live.lm))
    dm.close()


def bare(live: Live, text: str) -> list[int]:
    """text's tokens without the space the tokenizer puts first."""
    toks = live.vocab.tokenize(text, add_bos=False)
    return toks[1:] if live.vocab.text(toks[0]) == " " else toks


def test_a_draft_is_cut_before_the_first_token_the_grammar_refuses(live):
    c = constraint(live)
    whole, x = bare(live, '{"name": "ab", "tags": ["c"]}'), bare(live, "x")
    try:
        assert c.fitting(whole) == len(whole)
        assert c.fitting(x + whole) == 0  # an object starts with {
        assert c.fitting(whole + x) == len(whole)  # nothing after it is closed
        for t in whole:  # the copy it judged on left the grammar where it was
            assert c.allows(t)
            c.accept(t)
        assert c.allows(llama_cpp.llama_vocab_eos(live.lm.vocab)) and c.fitting(x) == 0
    finally:
        c.close()


class Refused(Misled):
    """Every draft begins with a token JSON has no place for (a raw control character)."""

    def __init__(self, inner, bad: int) -> None:
        super().__init__(inner)
        self.bad = bad

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        return [self.bad, *self.inner.propose(history, last, k)][:k]


def test_drafts_the_grammar_refuses_are_not_verified(live, draft_model):
    plain = live.run(constrained(live, 3))[0]
    (bad,) = bare(live, "\x01")
    (r,) = live.run(constrained(live, 3, drafter=Refused(draft_model(PROMPTS[3]).inner, bad)), on_step=Live.check_kv)
    assert r.tokens == plain.tokens
    assert r.stats.drafted == 0, r.stats  # cut to nothing before verification: plain steps
