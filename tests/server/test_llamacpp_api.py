"""llama-server's own endpoints and request extensions against a live `ggufdesk serve` on the tiny model."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.server.serving import ServeProcess


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
    with httpx.stream("POST", served.url + "/completion", timeout=120, json={
            "prompt": "the cat", "n_predict": 3, "stream": True, "response_fields": ["content", "stop"]}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == {"content": "", "stop": True}  # the final chunk too: no prompt echoed, no timings
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
    ("/completion", {"prompt": 5}), ("/completion", {"prompt": [[1, ["a"]]]}), ("/completion", {"prompt": []}),
    ("/completion", {"prompt": [[True]]}), ("/completion", {"prompt": {"text": "x"}}),
    ("/completion", {"prompt": [{"prompt_string": 5}]}), ("/completion", {"prompt": [1, {"prompt_string": "x"}]}),
    ("/completion", {"prompt": [1] + ["a"] * 300}), ("/completion", {"prompt": "x", "logit_bias": {"1": None}}),
    ("/completion", {"prompt": "x", "logit_bias": [["a", True]]}), ("/completion", {"prompt": "x", "logit_bias":
                                                                                 [[1.5, 1]]}),
    ("/completion", {"prompt": "x", "logit_bias": [["x" * 5000, -1]]}),
    ("/completion", {"prompt": "x", "logit_bias": {str(i): 1 for i in range(70_000)}}),
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


def test_prompts_of_token_ids_with_text_among_them_and_prompt_objects(served):
    """llama-server's prompt forms: ids, [ids, "text", ids], {"prompt_string": ...}, lists of those; the
    answer's `prompt` is the prompt as the model read it, its BOS as text."""
    text = "the cat"
    ids = post(served, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    bos = post(served, "/tokenize", {"content": "", "add_special": True, "with_pieces": True}).json()["tokens"]
    by_text = post(served, "/completion", {"prompt": text, "n_predict": 4}).json()
    assert by_text["prompt"] == bos[0]["piece"] + post(served, "/detokenize", {"tokens": ids[1:]}).json()["content"]
    for prompt in (ids, {"prompt_string": text}, [text], {"prompt_string": [text]}):
        assert post(served, "/completion", {"prompt": prompt, "n_predict": 4}).json()["content"] == by_text["content"]
    several = post(served, "/completion", {"prompt": [ids, text, {"prompt_string": text}], "n_predict": 4}).json()
    assert [x["content"] for x in several] == [by_text["content"]] * 3
    # text among ids is read without a BOS of its own (only a first text gets one)
    mixed = post(served, "/completion", {"prompt": [ids[0], *ids[1:2], text, 5], "n_predict": 2,
                                         "return_tokens": True}).json()
    tail = post(served, "/tokenize", {"content": text}).json()["tokens"]
    assert mixed["tokens_evaluated"] == 2 + len(tail) + 1
    refused = post(served, "/completion", {"prompt": {"prompt_string": "x", "multimodal_data": ["aGk="]}})
    assert refused.status_code == 400 and "multimodal_data" in refused.json()["error"]["message"]
    # each text among ids is a round trip to the engine: at most 256 in a whole request, not per prompt
    many = post(served, "/completion", {"prompt": [[1, "a", "b", "c", "d", "e"]] * 60, "n_predict": 1})
    assert many.status_code == 400 and "256 texts" in many.json()["error"]["message"]
    one = post(served, "/completion", {"prompt": [1, *["a"] * 257], "n_predict": 1})
    assert one.status_code == 400 and "256 texts" in one.json()["error"]["message"]


def test_logit_bias_text_keys_and_the_bias_applied_in_the_answer(served):
    """A text key biases each of its tokens (llama.cpp's rule); generation_settings.logit_bias lists what
    the sampler applied: text keys as their tokens, ignore_eos's end tokens as null (never)."""
    first = post(served, "/completion", {"prompt": "the cat", "n_predict": 6, "return_tokens": True}).json()
    words = post(served, "/detokenize", {"tokens": first["tokens"][:2]}).json()["content"]
    toks = post(served, "/tokenize", {"content": words}).json()["tokens"]
    for bias in ([[words, False]], {words: False}):
        r = post(served, "/completion", {"prompt": "the cat", "n_predict": 6, "return_tokens": True,
                                         "logit_bias": bias}).json()
        assert not set(toks) & set(r["tokens"])
        assert sorted(e["token"] for e in r["generation_settings"]["logit_bias"]) == sorted(set(toks))
        assert all(e["bias"] is None for e in r["generation_settings"]["logit_bias"])
    # a key that is a whole number is a token id (in a map); in a list a string is always text
    by_id = post(served, "/completion", {"prompt": "x", "n_predict": 1, "logit_bias": {str(toks[0]): -3}}).json()
    assert by_id["generation_settings"]["logit_bias"] == [{"token": toks[0], "bias": -3.0}]
    eos = post(served, "/completion", {"prompt": "x", "n_predict": 2, "ignore_eos": True}).json()
    assert eos["generation_settings"]["logit_bias"] and all(
        e["bias"] is None for e in eos["generation_settings"]["logit_bias"])
    plain = post(served, "/completion", {"prompt": "x", "n_predict": 2}).json()
    assert plain["generation_settings"]["logit_bias"] == []


def test_verbose_answer_is_the_native_one_with_the_prompt_as_read(served):
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                              "verbose": True}).json()
    v = r["__verbose"]
    bos = post(served, "/tokenize", {"content": "", "add_special": True, "with_pieces": True}).json()["tokens"][0]
    assert v["prompt"].startswith(bos["piece"]) and v["prompt"].endswith("Assistant:")
    assert v["content"] == r["choices"][0]["message"]["content"] and v["tokens_predicted"] == 3
    assert v["generation_settings"]["n_predict"] == 3 and "timings" in v
    c = post(served, "/v1/completions", {"model": "x", "prompt": "the", "max_tokens": 2, "verbose": True}).json()
    assert c["__verbose"]["prompt"].startswith(bos["piece"]) and c["__verbose"]["content"] == c["choices"][0]["text"]
    assert "__verbose" not in post(served, "/v1/completions", {"model": "x", "prompt": "the", "max_tokens": 2}).json()


def progress_of(served, body: dict) -> list[dict]:
    with httpx.stream("POST", served.url + "/chat/completions", timeout=120, json={
            **body, "max_tokens": 2, "stream": True, "return_progress": True}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    return [c["prompt_progress"] for c in chunks if "prompt_progress" in c]


@pytest.fixture(scope="module")
def own(tiny_model, tmp_path_factory):
    """A server of its own: where a prompt lands in the KV cache moves the tiny model's near-tie greedy
    answers that other modules' tests compare (tests/server/test_openai_api.py says how)."""
    server = ServeProcess(tiny_model, "--ctx", "1024", "--parallel", "2", "--temperature", "0",
                          home=tmp_path_factory.mktemp("serve-own"))
    yield server
    server.stop()


def test_progress_starts_at_the_cached_part_and_cache_prompt_false_reads_it_all(own):
    """llama-server's first report says what the cache held (processed == cache) before any batch is read;
    `cache_prompt: false` reuses no cached prefix."""
    body = {"messages": [{"role": "user", "content": "a prompt for progress " * 6}]}
    cold = progress_of(own, body)
    assert cold[0]["processed"] == cold[0]["cache"] and cold[-1]["processed"] == cold[-1]["total"]
    warm = progress_of(own, body)
    assert warm[0]["cache"] == warm[0]["processed"] == warm[0]["total"] - 1 and len(warm) == 2
    fresh = progress_of(own, {**body, "cache_prompt": False})
    assert fresh[0]["cache"] == 0 and fresh[-1]["processed"] == fresh[-1]["total"] == cold[-1]["total"]


def test_chat_logprob_tokens_join_into_the_answer(served):
    """The answer drops the leading space of its first token (" the" -> "the"): so does that token's
    logprob entry, so that the tokens joined are the answer, as OpenAI's are (a grammar makes the model
    start with a space)."""
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                              "logprobs": True, "top_logprobs": 2, "grammar": 'root ::= " the cat"'})
    choice = r.json()["choices"][0]
    tokens = [t["token"] for t in choice["logprobs"]["content"]]
    assert choice["message"]["content"] == "the cat" == "".join(tokens) and len(tokens) > 1
