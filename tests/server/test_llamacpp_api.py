"""llama-server's own endpoints and request extensions against a live `ggufdesk serve` on the tiny model."""
from __future__ import annotations

import json

import httpx
import pytest


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=120)


def test_native_completion_plain_streamed_and_by_tokens(served):
    r = post(served, "/completion", {"prompt": "the cat", "n_predict": 6, "return_tokens": True}).json()
    assert r["stop"] is True and r["stop_type"] == "limit" and r["tokens_predicted"] == 6 and len(r["tokens"]) == 6
    assert r["timings"]["predicted_n"] == 6 and r["timings"]["prompt_n"] + r["timings"]["cache_n"] == r["tokens_evaluated"]
    assert isinstance(r["has_new_line"], bool) and r["generation_settings"]["n_predict"] == 6
    with httpx.stream("POST", served.url + "/completions", json={"prompt": "the cat", "n_predict": 6, "stream": True},
                      timeout=120) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert "".join(c["content"] for c in chunks) == r["content"] and chunks[-1]["stop"] is True
    ids = post(served, "/tokenize", {"content": "the cat", "add_special": True}).json()["tokens"]
    by_ids = post(served, "/completion", {"prompt": ids, "n_predict": 6}).json()
    assert by_ids["content"] == r["content"]
    several = post(served, "/completion", {"prompt": ["the cat", ids], "n_predict": 6}).json()
    assert [x["content"] for x in several] == [r["content"]] * 2 and [x["index"] for x in several] == [0, 1]


def test_response_fields_n_probs_and_progress(served):
    r = post(served, "/completion", {"prompt": "the cat", "n_predict": 3,
                                     "response_fields": ["content", "generation_settings/n_predict"]}).json()
    assert set(r) == {"content", "generation_settings/n_predict"} and r["generation_settings/n_predict"] == 3
    p = post(served, "/completion", {"prompt": "the cat", "n_predict": 3, "n_probs": 4}).json()
    probs = p["completion_probabilities"]
    assert len(probs) == 3 and all(len(t["top_logprobs"]) == 4 and t["id"] >= 0 and t["logprob"] <= 0 for t in probs)
    with httpx.stream("POST", served.url + "/completion", timeout=120, json={
            "prompt": "the dog " * 40, "n_predict": 2, "stream": True, "return_progress": True,
            "timings_per_token": True}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert progress and progress[-1]["processed"] == progress[-1]["total"]
    assert all("timings" in c for c in chunks if c.get("content"))


def test_logit_bias_and_ignore_eos(served):
    first = post(served, "/completion", {"prompt": "the cat", "n_predict": 6, "return_tokens": True}).json()["tokens"]
    banned = post(served, "/completion", {"prompt": "the cat", "n_predict": 6, "return_tokens": True,
                                          "logit_bias": [[t, False] for t in first]}).json()["tokens"]
    assert not set(first) & set(banned)
    forced = post(served, "/v1/completions", {"model": "x", "prompt": "the cat", "max_tokens": 4,
                                              "logit_bias": {str(first[0]): 100}}).json()
    assert forced["choices"][0]["finish_reason"] == "length"
    r = post(served, "/completion", {"prompt": "x", "n_predict": 5, "ignore_eos": True}).json()
    assert r["tokens_predicted"] == 5 and r["generation_settings"]["ignore_eos"] is True


def test_grammar_json_schema_and_response_format_with_schema(served):
    r = post(served, "/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 6,
                                           "grammar": 'root ::= "a"{5,5}'}).json()
    assert r["choices"][0]["message"]["content"] == "aaaaa"
    r = post(served, "/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 6,
                                           "json_schema": {"const": "42"}}).json()
    assert r["choices"][0]["message"]["content"] == '"42"'
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 6,
                                              "response_format": {"type": "json_object", "schema": {"const": "7"}}})
    assert r.json()["choices"][0]["message"]["content"] == '"7"'
    bad = post(served, "/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                             "grammar": "root ::= this is (not valid GBNF"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    both = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                 "grammar": 'root ::= "a"', "json_schema": {"const": 1}})
    assert both.status_code == 400


def test_tokenize_detokenize_apply_template_props_models(served):
    t = post(served, "/tokenize", {"content": "the cat", "with_pieces": True}).json()["tokens"]
    assert all(set(x) == {"id", "piece"} for x in t)
    assert post(served, "/detokenize", {"tokens": [x["id"] for x in t]}).json()["content"].strip() == "the cat"
    prompt = post(served, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
    assert prompt.endswith("Assistant:")
    bare = post(served, "/apply-template", {"messages": [{"role": "user", "content": "hi"}],
                                            "add_generation_prompt": False}).json()["prompt"]
    assert not bare.endswith("Assistant:")
    props = httpx.get(served.url + "/props").json()
    assert props["total_slots"] == 4 and props["model_path"].endswith(".gguf")
    assert props["default_generation_settings"]["n_ctx"] == 2048
    models = httpx.get(served.url + "/models").json()
    assert models["data"][0]["id"] == "tiny-target" and models["models"][0]["name"] == "tiny-target"
    assert httpx.get(served.url + "/slots").status_code == 501
    n = post(served, "/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert n["input_tokens"] > 1


def test_openai_answers_carry_timings_fingerprint_and_the_prompt_on_request(served):
    r = post(served, "/chat/completions", {"messages": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "the dog"}],
                                           "max_tokens": 2, "verbose": True}).json()
    assert r["system_fingerprint"].startswith("b") and r["timings"]["predicted_n"] == 2
    assert r["__verbose"]["prompt"].endswith("Assistant: the dog")  # a final assistant turn is continued
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    conflict = post(served, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                  "continue_final_message": True, "add_generation_prompt": True})
    assert conflict.status_code == 400


@pytest.mark.parametrize("field,value", [
    ("mirostat", 2), ("typical_p", 0.5), ("dry_multiplier", 0.8), ("xtc_probability", 0.5), ("samplers", ["top_k"]),
    ("lora", [{"id": 0, "scale": 1}]), ("post_sampling_probs", True), ("t_max_predict_ms", 100),
    ("image_data", [{"data": "x", "id": 1}]),
])
def test_extensions_we_cannot_honour_are_refused_never_dropped(served, field, value):
    for path, body in (("/completion", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = post(served, path, {**body, field: value})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (path, r.text)


@pytest.mark.parametrize("path,body", [
    ("/completion", {"prompt": 5}), ("/completion", {"prompt": [[1, "a"]]}), ("/completion", {"prompt": []}),
    ("/completion", {"prompt": "x", "n_probs": 500}), ("/completion", {"prompt": "x", "logit_bias": {"1": "x"}}),
    ("/completion", {"prompt": "x", "logit_bias": [[1, 2, 3]]}), ("/completion", {"prompt": [10**9]}),
    ("/completion", {"prompt": [[1]] * 100_000}), ("/tokenize", {"content": 5}), ("/detokenize", {"tokens": "x"}),
    ("/detokenize", {"tokens": [-5]}), ("/apply-template", {"messages": "x"}), ("/apply-template", {"messages": []}),
    ("/chat/completions/input_tokens", {"messages": 5}), ("/completion", {"prompt": "x", "stream": True,
                                                                        "n_predict": "many"}),
])
def test_hostile_bodies_are_400_in_llama_servers_shape(served, path, body):
    r = post(served, path, body)
    assert r.status_code in (400, 413), (path, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["code"] == r.status_code and err["type"] and err["message"]
    assert httpx.get(served.url + "/health").status_code == 200
