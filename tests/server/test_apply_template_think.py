"""/apply-template (and the other endpoints that render a chat prompt) with the think setting a
generation gets: the request's (chat_template_kwargs, reasoning_effort, think, Anthropic's thinking),
else the server's --think; what it shows is what /chat/completions feeds the model."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.fixtures.scripted import write_scripted
from tests.server.serving import ServeProcess

R1 = Path(__file__).resolve().parents[1] / "fixtures" / "templates" / "llamacpp" / \
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
USER = [{"role": "user", "content": "What is today?"}]
OPEN, CLOSED = "<｜Assistant｜><think>\n", "<｜Assistant｜><think>\n</think>"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_scripted(tmp_path_factory.mktemp("m") / "r1.gguf", "deepseek-r1", "Two and two.\n</think>\n\nFour.",
                          chat_template=R1.read_text(encoding="utf-8"))


def _serve(model: Path, tmp_path_factory, *args: str) -> ServeProcess:
    return ServeProcess(model, "--ctx", "1024", "--temperature", "0", *args, home=tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def auto(model, tmp_path_factory):
    srv = _serve(model, tmp_path_factory)
    yield srv
    srv.stop()


def _prompt(srv: ServeProcess, **body) -> str:
    r = httpx.post(srv.url + "/apply-template", json={"messages": USER, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def _as_read(srv: ServeProcess, prompt: str) -> str:
    """The prompt as the model reads it (its tokens' pieces joined), which is what llama-server's
    `__verbose.prompt` shows: "<｜User｜> What" where the text says "<｜User｜>What"."""
    t = httpx.post(srv.url + "/tokenize", json={"content": prompt, "with_pieces": True}, timeout=60).json()["tokens"]
    return b"".join(x["piece"].encode() if isinstance(x["piece"], str) else bytes(x["piece"]) for x in t).decode()


def test_apply_template_takes_the_requests_think_setting(auto):
    assert _prompt(auto).endswith(OPEN)  # --think auto: enable_thinking true, as llama-server
    assert _prompt(auto, chat_template_kwargs={"enable_thinking": False}).endswith(CLOSED)
    assert _prompt(auto, reasoning_effort="none").endswith(CLOSED)
    assert _prompt(auto, think=False).endswith(CLOSED)
    assert _prompt(auto, think=True, unknown_field=1).endswith(OPEN)
    assert _prompt(auto, add_generation_prompt=False).endswith("What is today?")


@pytest.mark.parametrize("body,param", [({"think": "very"}, "think"), ({"reasoning_effort": "max"}, "reasoning_effort"),
                                        ({"think": [1]}, "think"), ({"chat_template_kwargs": "x"}, None)])
def test_a_bad_think_setting_is_a_400(auto, body, param):
    r = httpx.post(auto.url + "/apply-template", json={"messages": USER, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]
    assert httpx.get(auto.url + "/health").status_code == 200


def test_the_prompt_shown_is_the_prompt_the_chat_runs_on(auto):
    for extra, prompt in (({}, _prompt(auto)), ({"reasoning_effort": "none"}, _prompt(auto, reasoning_effort="none"))):
        r = httpx.post(auto.url + "/chat/completions", json={"messages": USER, "max_tokens": 20, "verbose": True,
                                                             **extra}, timeout=60).json()
        assert r["__verbose"]["prompt"] == _as_read(auto, prompt)
        n = httpx.post(auto.url + "/tokenize", json={"content": prompt}, timeout=60).json()  # (the prompt has its BOS)
        assert r["usage"]["prompt_tokens"] == len(n["tokens"])  # the engine's own count of what it ran
        counted = httpx.post(auto.url + "/chat/completions/input_tokens", json={"messages": USER, **extra},
                             timeout=60).json()["input_tokens"]
        assert counted == r["usage"]["prompt_tokens"]
    thought = httpx.post(auto.url + "/chat/completions", json={"messages": USER, "max_tokens": 20}, timeout=60).json()
    msg = thought["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("Two and two.", "Four.")  # it began inside <think>


def test_anthropic_count_tokens_follows_thinking(auto):
    def count(**extra) -> int:
        r = httpx.post(auto.url + "/v1/messages/count_tokens", json={"model": "r1", "messages": USER, **extra},
                       timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    assert count(thinking={"type": "disabled"}) == count() + 1  # the closing </think>
    assert count(thinking={"type": "enabled", "budget_tokens": 100}) == count()


def test_the_servers_think_off_is_the_default_a_request_overrides(model, tmp_path_factory):
    srv = _serve(model, tmp_path_factory, "--think", "off")
    try:
        assert _prompt(srv).endswith(CLOSED)
        assert _prompt(srv, chat_template_kwargs={"enable_thinking": True}).endswith(OPEN)
        r = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "max_tokens": 20, "verbose": True},
                       timeout=60).json()
        assert r["__verbose"]["prompt"] == _as_read(srv, _prompt(srv))
    finally:
        srv.stop()
