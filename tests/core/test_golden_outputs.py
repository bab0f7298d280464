"""Golden model outputs (tests/fixtures/golden_outputs.py): every one is read 100%, and read the same
whether it comes whole or streamed in pieces of any size; broken calls stay text with a warning."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core import reasoning as R
from ggufdesk.core import tools as T
from ggufdesk.core.toolcalls import CallStream, parse
from tests.fixtures.golden_outputs import BROKEN, GOLDEN

REASONING = {"think": R.THINK, "harmony": R.HARMONY, "mistral": R.MISTRAL}


def whole(fmt: str, rfmt: str | None, inside: bool, text: str) -> tuple[str, str, list]:
    reasoning, answer = R.split_all(REASONING[rfmt], text, inside=inside) if rfmt else ("", text)
    p = parse(answer, T.FORMATS[fmt])
    return reasoning, p.content, p.calls


def streamed(fmt: str, rfmt: str | None, inside: bool, text: str, size: int) -> tuple[str, str, list]:
    split = R.ReasoningSplit(REASONING[rfmt], inside=inside) if rfmt else None
    calls = CallStream(T.FORMATS[fmt])
    reasoning, shown = "", ""
    chunks = [text[i:i + size] for i in range(0, len(text), size)]
    for chunk in chunks + [None]:
        if split is None:
            pieces = [(False, chunk)] if chunk is not None else []
        else:
            pieces = split.push(chunk) if chunk is not None else split.finish()
        for is_reasoning, piece in pieces:
            if is_reasoning:
                reasoning += piece
            else:
                shown += calls.push(piece)
    answer = calls.text
    p = parse(answer, T.FORMATS[fmt])  # what the engine does with the whole answer at the end
    shown += calls.finish(p.content if p.calls else None)
    return reasoning, shown, p.calls


def _named(calls: list) -> list:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("case", GOLDEN, ids=[f"{c[0]}-{i}" for i, c in enumerate(GOLDEN)])
def test_golden_output_is_read_whole(case):
    fmt, rfmt, inside, text, reasoning, content, calls = case
    got_reasoning, got_content, got_calls = whole(fmt, rfmt, inside, text)
    assert (got_reasoning, got_content, _named(got_calls)) == (reasoning, content, calls)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 10_000])
@pytest.mark.parametrize("case", GOLDEN, ids=[f"{c[0]}-{i}" for i, c in enumerate(GOLDEN)])
def test_streaming_reads_the_same_as_whole(case, size):
    fmt, rfmt, inside, text = case[:4]
    w = whole(fmt, rfmt, inside, text)
    s = streamed(fmt, rfmt, inside, text, size)
    assert (s[0], s[1], _named(s[2])) == (w[0], w[1], _named(w[2]))


def test_every_format_has_golden_outputs_and_all_parse():
    formats = {c[0] for c in GOLDEN}
    assert formats == set(T.FORMATS) - {"generic"}
    read = sum(1 for c in GOLDEN if _named(whole(*c[:4])[2]) == c[6])
    assert read == len(GOLDEN)


@pytest.mark.parametrize("fmt,text", BROKEN, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BROKEN)])
def test_a_broken_call_stays_text_with_a_warning(fmt, text):
    p = parse(text, T.FORMATS[fmt])
    assert p.calls == [] and p.content == text
    assert p.warnings and "could not be read" in p.warnings[0]
    for size in (1, 5):  # streamed, nothing is lost either
        s = CallStream(T.FORMATS[fmt])
        shown = "".join(s.push(text[i:i + size]) for i in range(0, len(text), size))
        assert shown + s.finish(None) == text


def test_tool_choice_none_streams_the_call_text_as_it_is():
    """Issue 34 finding 8: tools present, no call parsed -> the stream is the whole text."""
    text = 'Let me see. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    s = CallStream(T.HERMES)
    shown = "".join(s.push(text[i:i + 4]) for i in range(0, len(text), 4))
    assert shown == "Let me see."
    assert shown + s.finish(None) == text


def test_the_detected_format_of_each_family_template():
    from tests.fixtures import scripted

    want = {"qwen3": "hermes", "qwen3-coder": "qwen3_coder", "hermes": "hermes", "gpt-oss": "harmony",
            "deepseek-r1": "deepseek_r1", "deepseek-v3": "deepseek_v3", "llama3": "llama3", "mistral": "mistral"}
    for family, fmt in want.items():
        assert T.detect_format(scripted.template(family)).name == fmt, family
    reasons = {f: (R.detect(scripted.template(f)) or R.THINK).name if R.detect(scripted.template(f)) else None
               for f in want}
    assert reasons == {"qwen3": "think", "qwen3-coder": None, "hermes": None, "gpt-oss": "harmony",
                       "deepseek-r1": "think", "deepseek-v3": "think", "llama3": None, "mistral": None}
