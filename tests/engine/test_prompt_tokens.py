"""A chat prompt tokenized piece by piece (engine/runtime/prompt_tokens.py) is the whole prompt's tokens:
drawn chats through each kind of vocabulary we test with, turn after turn, and the markers a prompt may
not be cut before."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufdesk.engine.runtime import prompt_tokens as PT
from ggufdesk.engine.runtime.chat import ChatTemplate
from tests.fixtures import ggufs

CONTROL, USER, LSTRIP = 1 << 3, 1 << 4, 1 << 7

GEMMA_IT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
            "{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
            "{% endif %}")


# ---- which markers a prompt may be cut before -----------------------------------------------------

def test_the_template_s_turn_markers_are_cut_before():
    specials = {b"<|im_start|>": CONTROL, b"<|im_end|>": CONTROL, b"<unk>": 1, b"\n\n": USER}
    assert PT.safe_markers({b"<|im_start|>", b"<|im_end|>", b"\n\n"}, specials) == ["<|im_end|>", "<|im_start|>"]


@pytest.mark.parametrize("other", [b"<|im_start|>user", b"xx<|im_start", b"art|>more_text", b"_<|im_start|"])
def test_a_marker_a_special_token_as_long_could_overlap_is_not_cut_before(other):
    """llama.cpp searches longer special tokens first: one covering part of the marker takes its place."""
    specials = {b"<|im_start|>": CONTROL, other: CONTROL}
    assert PT.safe_markers({b"<|im_start|>"}, specials) == []


def test_a_shorter_special_token_cannot_break_a_marker():
    assert PT.safe_markers({b"<|im_start|>"}, {b"<|im_start|>": CONTROL, b"t|><": USER}) == ["<|im_start|>"]


@pytest.mark.parametrize("marker,attr", [(b"<mask>", CONTROL | LSTRIP), (b" <x>", CONTROL), (b"<", CONTROL),
                                         (b"<x>", 1 << 2)])
def test_markers_that_strip_whitespace_have_it_or_are_not_special_are_not_cut_before(marker, attr):
    assert PT.safe_markers({marker}, {marker: attr}) == []


# ---- pieces equal the whole, on real vocabularies --------------------------------------------------

class _Vocab:
    def __init__(self, path) -> None:
        from ggufdesk.core.settings import LoadSettings
        from ggufdesk.engine.batching.vocab import Vocab
        from ggufdesk.engine.runtime.native import LlamaLog, load_model

        self.lm = load_model(str(path), LoadSettings(n_ctx=256, n_threads=1, n_threads_batch=1), LlamaLog())
        self.vocab = Vocab(self.lm)


@pytest.fixture(scope="module")
def tiny_vocab(tiny_chatml):
    v = _Vocab(tiny_chatml)
    yield v.vocab, ggufs.CHATML_TEMPLATE, "<s>", "</s>", PT.PromptTokens(v.vocab, ggufs.CHATML_TEMPLATE)
    v.lm.close()


@pytest.fixture(scope="module")
def smol_vocab(chat_starter):
    from ggufdesk.core.gguf_meta import read_gguf

    v = _Vocab(chat_starter)
    template = read_gguf(chat_starter).chat_template
    yield v.vocab, template, "", "<|im_end|>", PT.PromptTokens(v.vocab, template)
    v.lm.close()


@pytest.fixture(scope="module")
def gemma_vocab(starter_model):
    v = _Vocab(starter_model)
    yield v.vocab, GEMMA_IT, "<bos>", "<eos>", PT.PromptTokens(v.vocab, GEMMA_IT)
    v.lm.close()


BITS = ["<|im_start|>", "<|im_end|>", "<|im_sta", "im_end|>", "<start_of_turn>", "<end_of_turn>", "<start_of",
        "<unk>", "<s>", "</s>", "<bos>", "<eos>", "<|endoftext|>", "<b>", "</td>", "<start_of_image>", "\n", "\n\n",
        "  ", "\t", " ", "<", ">", "|", "user", "model", "assistant", "system", "Hello", " world", "é", "日本", "🙂",
        "1234", "\r\n", "'s", "```py\n"]
MESSAGES = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]),
                              st.lists(st.sampled_from(BITS), max_size=12).map("".join)), min_size=1, max_size=8)


def _render(template: str, bos: str, eos: str, msgs: list[tuple[str, str]]) -> str:
    return ChatTemplate(template, bos=bos, eos=eos, probe=False).render(
        [{"role": r, "content": c} for r, c in msgs])


def _check(vocab, template: str, bos: str, eos: str, pt: PT.PromptTokens, turns: list[tuple[str, str]],
           add_bos: bool) -> None:
    """pt: one per vocabulary, its pieces remembered from example to example, as over a model's life."""
    assert pt._cutter() is not None, "the template's markers are cut before"
    for n in range(1, len(turns) + 1):  # turn after turn, as an agent sends them: earlier pieces are remembered
        text = _render(template, bos, eos, turns[:n])
        for _ in ("tokenized", "from memory"):
            assert pt.tokenize(text, add_bos=add_bos) == vocab.tokenize(text, add_bos=add_bos), text


@pytest.mark.parametrize("which", ["tiny_vocab", pytest.param("smol_vocab", marks=pytest.mark.slow),
                                   pytest.param("gemma_vocab", marks=pytest.mark.slow)])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=MESSAGES, add_bos=st.booleans())
def test_pieces_equal_the_whole(which, request, monkeypatch, turns, add_bos):
    """On a tiny SPM vocabulary, SmolLM2's BPE one and Gemma's SPM one with its chat template (Gemma's holds
    6,000 special tokens, whitespace runs and HTML tags among them)."""
    monkeypatch.setattr(PT, "MIN_CHARS", 0)
    _check(*request.getfixturevalue(which), turns, add_bos)


def test_a_long_prompt_is_tokenized_once_per_piece_and_a_short_one_whole(tiny_vocab, monkeypatch):
    vocab, template, bos, eos, _ = tiny_vocab
    calls: list[str] = []
    real = vocab.tokenize

    class Counting:
        lm = vocab.lm

        def tokenize(self, text, *, add_bos=True):
            calls.append(text)
            return real(text, add_bos=add_bos)

    pt = PT.PromptTokens(Counting(), template)
    system = ("system", "hello world " * 1000)
    turns = [system, ("user", "hello"), ("assistant", "world"), ("user", "again")]
    first = _render(template, bos, eos, turns[:2])
    assert len(first) >= PT.MIN_CHARS
    assert pt.tokenize(first, add_bos=True) == real(first, add_bos=True)
    calls.clear()
    second = _render(template, bos, eos, turns)
    assert pt.tokenize(second, add_bos=True) == real(second, add_bos=True)
    assert all(len(c) < 100 for c in calls) and calls, "the system prompt's piece came from memory"
    calls.clear()
    short = _render(template, bos, eos, turns[1:])
    assert pt.tokenize(short, add_bos=True) == real(short, add_bos=True) and calls == [short]


def test_a_vocabulary_whose_special_token_overlaps_the_marker_is_tokenized_whole(tmp_path, monkeypatch):
    """`rt|><|im_end|>!` is searched before `<|im_start|>` and covers its end: cut before <|im_start|>,
    the pieces would not be llama.cpp's tokens (checked below), so that vocabulary is not cut."""
    from ggufdesk.engine.batching.vocab import Vocab
    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.runtime.native import LlamaLog, load_model

    odd = "rt|><|im_end|>!"
    path = ggufs.write_tiny_llama(tmp_path / "odd.gguf", ggufs.TinySpec(
        seed=1, chat_template=ggufs.CHATML_TEMPLATE, extra_tokens=(odd,)))
    lm = load_model(str(path), LoadSettings(n_ctx=256, n_threads=1, n_threads_batch=1), LlamaLog())
    try:
        vocab = Vocab(lm)
        monkeypatch.setattr(PT, "MIN_CHARS", 0)
        pt = PT.PromptTokens(vocab, ggufs.CHATML_TEMPLATE)
        assert pt._markers() == []  # (it holds <|im_end|> too)
        text = "<|im_start|>user\nhi<|im_sta" + odd + "\n<|im_start|>assistant\n"
        assert pt.tokenize(text, add_bos=True) == vocab.tokenize(text, add_bos=True)
        cut = text.index("<|im_start|>", 1)
        assert vocab.tokenize(text[:cut], add_bos=True) + vocab.tokenize(text[cut:], add_bos=False) \
            != vocab.tokenize(text, add_bos=True), "(the cut the rule refuses would have been wrong)"
    finally:
        lm.close()


@pytest.mark.slow
def test_an_agent_s_turns_run_the_whole_prompt_s_tokens(chat_starter):
    """Claude Code's recorded request (25 tools, its system prompt) on SmolLM2, turn after turn through the
    engine: the prompt each turn runs is what tokenizing its whole text gives."""
    import json
    from pathlib import Path

    from ggufdesk.core.settings import SamplingSettings
    from ggufdesk.engine.link import protocol as P
    from ggufdesk.server.anthropic import MessagesRequest, messages_of, request_structured
    from tests.engine.inproc import Live

    body = json.loads((Path(__file__).parents[1] / "fixtures" / "clients" / "claude_code_2.1.197_main.json").read_text())
    live = Live(chat_starter, n_ctx=32768, n_threads=1, n_threads_batch=1)
    try:
        engine = live.engine
        for turn in range(3):
            req = MessagesRequest.model_validate(body)
            rid = f"turn{turn}"
            engine.generate(P.Generate(id=rid, messages=messages_of(req), sampling=SamplingSettings(max_tokens=1),
                                       **request_structured(req)))
            assert not [e for e in live.events if isinstance(e, P.Error)], live.events
            text = engine._prompt_text
            assert len(text) > PT.MIN_CHARS and text.count("<|im_start|>") >= 3
            assert live.prompts[rid] == engine.vocab.tokenize(text, add_bos=True)
            engine.book.cancel(rid)
            while engine.batch.busy:
                engine.batch.step()
            body["messages"] += [{"role": "assistant", "content": f"Step {turn} done."},
                                 {"role": "user", "content": f"Now step {turn + 1}."}]
    finally:
        live.close()
