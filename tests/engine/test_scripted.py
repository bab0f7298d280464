"""Scripted models (tests/fixtures/scripted.py) answer with their script through the real engine."""
from __future__ import annotations

import pytest

from ggufdesk.core import reasoning as R
from ggufdesk.core.settings import LoadSettings
from tests.engine.helpers import collect, greedy
from tests.fixtures.ggufs import CHATML_TEMPLATE
from tests.fixtures.scripted import FAMILIES, pieces, positions, template, write_scripted

LOAD = LoadSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)
SCRIPTS = {
    "qwen3": "<think>\nThe user says hi. I say hello.\n</think>\n\nHello there! Hello again.",
    "gpt-oss": ("<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>final"
                "<|message|>Hi! How can I help?"),
    "deepseek-r1": "Okay, greet back.\n</think>\n\nHello!",
    "llama3": "Hi. Hi. Hi.",
}


@pytest.mark.parametrize("family", sorted(SCRIPTS))
def test_greedy_output_is_the_script(client, tmp_path, family):
    """Under a plain template (no reasoning split) the text is the script, markers included."""
    path = write_scripted(tmp_path / f"{family}.gguf", family, SCRIPTS[family], chat_template=CHATML_TEMPLATE)
    client.load(str(path), settings=LOAD)
    for prompt in ("Hi there", "Something else entirely, with\nnew lines"):
        r = collect(client, client.generate(messages=[{"role": "user", "content": prompt}],
                                            sampling=greedy(200)))
        assert r.error is None
        assert (r.text, r.done.finish_reason) == (SCRIPTS[family], "stop")


@pytest.mark.parametrize("family", sorted(SCRIPTS))
def test_with_its_own_template_the_script_comes_split(client, tmp_path, family):
    path = write_scripted(tmp_path / f"{family}.gguf", family, SCRIPTS[family])
    client.load(str(path), settings=LOAD)
    r = collect(client, client.generate(messages=[{"role": "user", "content": "Hi"}], sampling=greedy(200)))
    fmt = R.detect(template(family))
    want = R.split_all(fmt, SCRIPTS[family], inside=family == "deepseek-r1") if fmt else (None, SCRIPTS[family])
    assert (r.done.reasoning, r.done.text) == want


def test_sampling_at_temperature_one_still_follows_the_script(client, tmp_path):
    path = write_scripted(tmp_path / "s.gguf", "qwen3", SCRIPTS["qwen3"], chat_template=CHATML_TEMPLATE)
    client.load(str(path), settings=LOAD)
    r = collect(client, client.generate(messages=[{"role": "user", "content": "x"}],
                                        sampling={"temperature": 1.0, "max_tokens": 200, "seed": 3}))
    assert r.text == SCRIPTS["qwen3"]


def test_repeated_text_gets_tokens_of_its_own():
    specials = [s for s, _ in FAMILIES["gpt-oss"].specials]
    pos = positions(SCRIPTS["gpt-oss"], specials, set())
    assert "".join(t for t, _ in pos) == SCRIPTS["gpt-oss"]
    texts = [t for t, _ in pos]
    assert len(texts) == len(set(texts))
    assert [t for t, special in pos if special].count("<|channel|>") == 1  # the last one is the real token
    assert pieces("a  b\n", []) == ["a", "  b\n"]
