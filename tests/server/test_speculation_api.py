"""Speculation through the HTTP API: `serve --lookup` and `serve --draft` answer what `serve` does.

The engine's live loop is checked token by token (tests/engine/test_live_random.py); here the same
drawn requests go to a server without speculation, one at a time, and to one with it, four at once:
OpenAI chat and completions, Anthropic messages, streamed or not, with logprobs, a JSON object, a stop
string cut from the plain answer, 1 to 80 tokens. Every answer (text, finish reason, logprobs' tokens)
must be the same. The tiny f32 ChatML model, greedy, one thread: where an answer differs, plain
decoding's own margin at the first differing token must be a near tie (its KV cache is f16: four
prompts read together round a key or value differently from one read alone, and the server without
speculation then differs from itself too, as seen at margins of 0.0001 and 0.0015).
"""
from __future__ import annotations

import random
import threading
from typing import Any

import httpx
import pytest

from tests.server.serving import ServeProcess
from tests.server.test_context_api import sse

WORDS = 'the cat dog and was in house red tree by water one two three of people a man came back from world , . " 1 2 3'.split()
N = 40
COMMON = ("--ctx", "2048", "--parallel", "4", "--temperature", "0", "--threads", "1", "--threads-batch", "1",
          "--flash-attn", "off")
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "anthropic": "/v1/messages"}
Answer = tuple[str, Any, Any]  # (text, finish reason, logprobs' tokens or None)


def drawn(seed: int) -> list[tuple[str, dict[str, Any], float | None]]:
    """(endpoint, body, where to cut a stop string from the plain answer or None) for N requests."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        w = [rng.choice(WORDS) for _ in range(rng.randint(3, 10))]
        return " ".join(w * rng.randint(1, 5) + [rng.choice(WORDS) for _ in range(rng.randint(0, n))])

    reqs = []
    for _ in range(N):
        kind = rng.choice(["chat", "chat", "completion", "anthropic"])
        body: dict[str, Any] = {"max_tokens": rng.randint(1, 80)}
        if kind == "completion":
            body["prompt"] = text(20)
            if rng.random() < 0.3:
                body["logprobs"] = 2
        else:
            body["messages"] = [{"role": "user", "content": text(20)}]
            if kind == "chat" and rng.random() < 0.4:
                body["messages"] += [{"role": "assistant", "content": text(10)}, {"role": "user", "content": text(10)}]
            if kind == "chat" and rng.random() < 0.3:
                body.update(logprobs=True, top_logprobs=2)
            if kind == "chat" and rng.random() < 0.2:
                body["response_format"] = {"type": "json_object"}
        body["stream"] = rng.random() < 0.5
        reqs.append((kind, body, rng.random() if rng.random() < 0.3 else None))
    return reqs


def answer(server: ServeProcess, kind: str, body: dict[str, Any]) -> Answer:
    b = dict(body, model="m")
    if not b.get("stream"):
        r = httpx.post(server.url + PATHS[kind], json=b, timeout=120)
        assert r.status_code == 200, r.text
        j = r.json()
        if kind == "anthropic":
            return "".join(c.get("text", "") for c in j["content"]), j["stop_reason"], None
        c = j["choices"][0]
        lp = c.get("logprobs")
        tokens = ([x["token"] for x in lp["content"]] if kind == "chat" else lp["tokens"]) if lp else None
        return (c["message"]["content"] if kind == "chat" else c["text"]), c["finish_reason"], tokens
    return streamed(sse(server, PATHS[kind], b), kind)


def streamed(events: list[dict[str, Any]], kind: str) -> Answer:
    """The answer a stream's events add up to."""
    out: list[str] = []
    lps: list[str] = []
    fin = None
    for j in events:
        if kind == "anthropic":
            if j.get("type") == "content_block_delta":
                out.append(j["delta"].get("text", ""))
            elif j.get("type") == "message_delta":
                fin = j["delta"].get("stop_reason")
            continue
        for c in j.get("choices", []):
            lp = c.get("logprobs") or {}
            if kind == "chat":
                out.append(c.get("delta", {}).get("content") or "")
                lps += [x["token"] for x in lp.get("content") or []]
            else:
                out.append(c.get("text") or "")
                lps += lp.get("tokens") or []
            fin = c.get("finish_reason") or fin
    return "".join(out), fin, lps or None


def margin_where_they_part(url: str, kind: str, body: dict[str, Any], a: str, b: str) -> float:
    """Plain decoding's top-2 logprob margin at the token where the texts a and b first differ."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    asked = {k: v for k, v in body.items() if k not in ("stream", "stop", "stop_sequences")}
    if kind == "completion":
        j = httpx.post(url + PATHS[kind], json=dict(asked, model="m", logprobs=2), timeout=120).json()
        lp = j["choices"][0]["logprobs"]
        steps = [(t, sorted(top.values(), reverse=True)) for t, top in zip(lp["tokens"], lp["top_logprobs"])]
    else:  # (Anthropic's messages are the same chat for the template)
        asked = {k: v for k, v in asked.items() if k in ("messages", "max_tokens", "response_format")}
        j = httpx.post(url + PATHS["chat"], json=dict(asked, model="m", logprobs=True, top_logprobs=2), timeout=120).json()
        steps = [(x["token"], [t["logprob"] for t in x["top_logprobs"]]) for x in j["choices"][0]["logprobs"]["content"]]
    written = 0
    for token, top in steps:
        written += len(token)
        if written > at:
            return top[0] - top[1]
    return 0.0  # one ended where the other went on: the end of generation was the near tie


@pytest.fixture(scope="module")
def plain(tiny_chatml, tmp_path_factory):
    server = ServeProcess(tiny_chatml, *COMMON, home=tmp_path_factory.mktemp("plain-home"))
    yield server
    server.stop()


@pytest.mark.parametrize("spec", ["lookup", "self-draft"])
def test_speculating_servers_answer_what_the_plain_one_does(plain, tiny_chatml, tmp_path, spec):
    args = ["--lookup"] if spec == "lookup" else ["--draft", str(tiny_chatml)]
    server = ServeProcess(tiny_chatml, *COMMON, *args, "--draft-max", "8", "--no-adaptive", home=tmp_path)
    try:
        reqs = drawn(0 if spec == "lookup" else 6)
        want = []
        for kind, body, cut in reqs:
            ref = answer(plain, kind, dict(body, stream=False))
            if cut is not None and len(ref[0]) > 6:  # a stop string from the answer: it ends there
                k = min(int(cut * len(ref[0])) + 1, len(ref[0]) - 3)
                body["stop_sequences" if kind == "anthropic" else "stop"] = [ref[0][k:k + 2]]
            want.append(answer(plain, kind, body))
        got: list[Answer | None] = [None] * N

        def client(mine: list[int]) -> None:
            for i in mine:
                got[i] = answer(server, reqs[i][0], reqs[i][1])

        threads = [threading.Thread(target=client, args=(list(range(j, N, 4)),)) for j in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for (kind, body, _), w, g in zip(reqs, want, got):
            assert g is not None
            if g != w:
                assert g[0] != w[0], (kind, body, w, g)  # the same text ending otherwise is no near tie
                m = margin_where_they_part(plain.url, kind, body, w[0], g[0])
                assert m < 0.01, (kind, body, w, g, m)
        metrics = httpx.get(server.url + "/metrics").text.splitlines()
        drafted, accepted = (next(float(line.split()[-1]) for line in metrics if line.startswith(f"ggufdesk_speculative_{n}"))
                             for n in ("drafted_tokens_total", "accepted_tokens_total"))
        assert drafted > accepted > 0 if spec == "lookup" else accepted > drafted / 2  # (the model as its own draft)
    finally:
        server.stop()
