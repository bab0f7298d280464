"""core/reasoning.py: detecting reasoning templates, the streaming split, the switches, and earlier
reasoning kept out of rendered prompts (unless the template asks for it)."""
from __future__ import annotations

import pytest

from ggufdesk.core import reasoning as R
from tests.fixtures import scripted


def test_detect_from_the_template():
    assert R.detect(scripted.template("qwen3")) is R.THINK
    assert R.detect(scripted.template("deepseek-r1")) is R.THINK
    assert R.detect(scripted.template("gpt-oss")) is R.HARMONY
    assert R.detect("{{ '[THINK]' }}") is R.MISTRAL
    assert R.detect(scripted.template("hermes")) is None and R.detect(None) is None


@pytest.mark.parametrize("text,inside,want", [
    ("<think>\nhmm\n</think>\n\nHi", False, ("hmm", "Hi")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("hmm\n</think>\n\nHi", True, ("hmm", "Hi")),
    ("Just an answer with </think> inside", False, ("", "Just an answer with </think> inside")),
    ("<think>never closed\n", False, ("never closed\n", "")),
    ("<thi", False, ("", "<thi")),  # a cut-off marker is text, not lost
    ("", False, ("", "")),
])
def test_think_split(text, inside, want):
    assert R.split_all(R.THINK, text, inside=inside) == want
    s = R.ReasoningSplit(R.THINK, inside=inside)  # one character at a time: the same
    pieces = [p for ch in text for p in s.push(ch)] + s.finish()
    assert ("".join(t for r, t in pieces if r), "".join(t for r, t in pieces if not r)) == want


def test_harmony_plain_text_and_a_cut_header_are_answers():
    assert R.split_all(R.HARMONY, "Hello there") == ("", "Hello there")
    assert R.split_all(R.HARMONY, "<|channel|>analysis<|message|>thinking, cut") == ("thinking, cut", "")
    assert R.split_all(R.HARMONY, "<|channel|>fin") == ("", "<|channel|>fin")


def test_switches():
    qwen, r1, oss, v3 = (scripted.template(f) for f in ("qwen3", "deepseek-r1", "gpt-oss", "deepseek-v3"))
    assert R.template_switches(qwen, None) == ({"enable_thinking": True}, True)  # auto: on, as llama-server
    assert R.template_switches(qwen, False) == ({"enable_thinking": False}, True)
    assert R.template_switches(v3, True) == ({"enable_thinking": True, "thinking": True}, True)
    assert R.template_switches(r1, False) == ({}, False)  # no switch: the engine ends it (budget 0)
    assert R.template_switches(oss, "high") == ({"reasoning_effort": "high"}, True)
    assert R.template_switches(oss, False)[1] is False


def test_earlier_reasoning_moves_out_of_the_content():
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nsecret\n</think>\n\nA"}]
    out = R.strip_reasoning(msgs, R.THINK)
    assert out[1]["content"] == "A" and out[1]["reasoning_content"] == "secret"
    assert R.strip_reasoning(msgs, None) is msgs and msgs[1]["content"].startswith("<think>")
