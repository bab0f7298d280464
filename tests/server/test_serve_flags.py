"""llama-server's serve flags ggufdesk takes: --alias, --tags, --chat-template(-file), --slots, --no-metrics,
--verbose, hosts."""
from __future__ import annotations

import socket

import httpx
import pytest

from tests.server.serving import ServeProcess


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def flagged(tiny_model, tmp_path_factory):
    hosts = "127.0.0.1,::1" if ipv6_loopback() else "127.0.0.1"
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "2", "--temperature", "0", "--host", hosts,
                          "--alias", "zeta,alpha", "--tags", "chat,small", "--chat-template", "chatml", "--slots",
                          "--no-metrics", "--verbose", home=tmp_path_factory.mktemp("flags-home"))
    yield server
    server.stop()


def test_aliases_name_the_model_and_tags_label_it(flagged):
    m = httpx.get(flagged.url + "/models").json()["data"][0]
    assert m["id"] == "alpha" and {"alpha", "zeta"} <= set(m["aliases"]) and set(m["tags"]) == {"chat", "small"}
    assert httpx.get(flagged.url + "/v1/models").json()["data"][0]["id"] == "alpha"
    r = httpx.post(flagged.url + "/api/chat", json={"model": "zeta", "messages": [{"role": "user", "content": "x"}],
                                                     "stream": False, "options": {"num_predict": 1}})
    assert r.status_code == 200  # an alias is a name Ollama's exact matching takes too


def test_the_chat_template_named_is_used(flagged):
    prompt = httpx.post(flagged.url + "/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert prompt["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_verbose_puts_the_native_answer_in_every_openai_answer(flagged):
    """llama-server's --verbose: `__verbose` without the request asking, its prompt as the model read it
    (BOS and template as text)."""
    r = httpx.post(flagged.url + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 2}).json()
    assert r["__verbose"]["prompt"] == "<s> <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert r["__verbose"]["content"] == r["choices"][0]["message"]["content"]


def test_slots_on_metrics_off(flagged):
    slots = httpx.get(flagged.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)
    r = httpx.get(flagged.url + "/metrics")
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_several_addresses(flagged):
    port = flagged.url.rsplit(":", 1)[1]
    assert httpx.get(f"http://[::1]:{port}/health").status_code == 200


def test_a_bad_template_file_or_ollama_port_is_refused(tiny_model, tmp_path):
    for args, why in ((["--chat-template-file", str(tmp_path / "missing.jinja")], "cannot read the chat template"),
                      (["--ollama-port", "99999"], "--ollama-port")):
        with pytest.raises(RuntimeError, match="exited") as err:
            ServeProcess(tiny_model, *args, home=tmp_path)
        assert why in str(err.value)
