"""The overflow policies on the real engine (tiny models, a 256-token context): the prompt the engine runs
is exactly what the policy keeps, what it dropped is reported, and a shifted context generates on."""
from __future__ import annotations

from typing import Any

import pytest

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from tests.engine.inproc import Live, one
from tests.fixtures import ggufs

N_CTX = 256
LOAD = {"n_ctx": N_CTX, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, "n_threads_batch": 1,
        "type_k": "f32", "type_v": "f32", "flash_attn": "off", "prompt_cache_bytes": 0}


def greedy(max_tokens: int, policy: str) -> dict[str, Any]:
    return {"temperature": 0.0, "max_tokens": max_tokens, "context_overflow": policy}


def conversation(turns: int) -> list[dict[str, str]]:
    w = ggufs.WORDS
    msgs = [{"role": "system", "content": "you are the cat"}]
    for i in range(turns):
        msgs.append({"role": "user", "content": " ".join(w[(7 * i + j) % len(w)] for j in range(10))})
        msgs.append({"role": "assistant", "content": " ".join(w[(5 * i + j) % len(w)] for j in range(6))})
    return msgs + [{"role": "user", "content": "and the last question"}]


@pytest.fixture
def live(tiny_chatml):
    engine = Live(tiny_chatml, **LOAD)
    yield engine
    engine.close()


def test_error_refuses_a_conversation_that_does_not_fit(live):
    events = live.run("r", messages=conversation(12), sampling=greedy(40, "error"))
    err = one(events, P.Error)
    assert err.kind == "context" and "r" not in live.prompts


def test_rolling_runs_the_system_prompt_and_the_newest_whole_turns(live, monkeypatch):
    from ggufdesk.engine.runtime import overflow

    monkeypatch.setattr(overflow, "ROLL_SLACK", 0.0)  # exactly the newest turns that fit
    msgs = conversation(12)
    budget = N_CTX - 40
    events = live.run("r", messages=msgs, sampling=greedy(40, "rolling"))
    # the longest tail of whole turns (starting at a question) that fits beside the system prompt
    starts = [i for i in range(1, len(msgs)) if msgs[i]["role"] == "user"]
    first = next(i for i in starts if len(live.render([msgs[0]] + msgs[i:])) <= budget)
    kept = [msgs[0]] + msgs[first:]
    assert live.prompts["r"] == live.render(kept)
    over, done = one(events, P.Overflow), one(events, P.Done)
    assert over.policy == "rolling" and over.dropped_messages == first - 1 and over.n_ctx == N_CTX
    truncated = len(live.render(msgs)) - len(live.render(kept))
    assert over.truncated_tokens == done.usage["truncated_tokens"] == truncated
    assert done.overflow == "rolling" and done.usage["prompt_tokens"] == len(live.render(kept))
    assert events.index(over) < min(events.index(e) for e in events if isinstance(e, (P.Token, P.Done)))


def test_truncate_middle_runs_the_start_and_the_end_of_a_long_message(live):
    body = " ".join(ggufs.WORDS[i % len(ggufs.WORDS)] for i in range(400))
    msgs = [{"role": "system", "content": "you are the cat"}, {"role": "user", "content": body}]
    events = live.run("r", messages=msgs, sampling=greedy(40, "truncate-middle"))
    full, ran = live.render(msgs), live.prompts["r"]
    assert len(ran) <= N_CTX - 40
    assert ran[:60] == full[:60] and ran[-60:] == full[-60:]  # the system prompt and the message's start, its end
    over, done = one(events, P.Overflow), one(events, P.Done)
    assert over.policy == "truncate-middle" and over.dropped_messages == 0
    assert over.truncated_tokens == done.usage["truncated_tokens"] == len(full) - len(ran)


def test_a_raw_prompt_rolls_to_its_newest_tokens(live):
    from ggufdesk.engine.runtime.overflow import ROLL_SLACK

    budget = N_CTX - 40
    text = " ".join(ggufs.WORDS[i % len(ggufs.WORDS)] for i in range(300))
    events = live.run("r", prompt=text, sampling=greedy(40, "rolling"))
    full = live.engine.vocab.tokenize(text)
    ran = live.prompts["r"]
    assert ran == full[:1] + full[len(full) - (budget - 1) + int(budget * ROLL_SLACK):]
    assert one(events, P.Done).usage["truncated_tokens"] == len(full) - len(ran)


def test_the_next_turn_of_a_rolled_conversation_keeps_the_cut_and_its_cache(live):
    msgs = conversation(12)
    first = live.run("r1", messages=msgs, sampling=greedy(8, "rolling"))
    done = one(first, P.Done)
    grown = msgs + [{"role": "assistant", "content": done.text}, {"role": "user", "content": "and the cat"}]
    second = live.run("r2", messages=grown, sampling=greedy(8, "rolling"))
    assert one(second, P.Overflow).dropped_messages == one(first, P.Overflow).dropped_messages
    assert one(second, P.Done).usage["cached_tokens"] >= len(live.prompts["r1"]) - 8  # not prefilled again


def test_a_policy_the_api_does_not_know_is_refused():
    with pytest.raises(Exception, match="context overflow policy"):
        SamplingSettings(context_overflow="wrap")


# ---- context shift -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_layer(model_dir):
    """One layer: a token's keys and values depend on the token and its position only, so a shifted
    cache holds what a fresh prefill of the kept tokens would (up to RoPE's rounding)."""
    return ggufs.write_tiny_llama(model_dir / "tiny-1layer.gguf", ggufs.TinySpec(seed=8, n_layer=1))


def test_shift_generates_past_the_window_and_equals_a_run_on_the_kept_tokens(one_layer, monkeypatch):
    from ggufdesk.engine.batching import prefix_cache

    shifts: list[tuple[int, list[int]]] = []
    real = prefix_cache.Slots.shift

    def recorded(self: Any, slot: Any, n_keep: int, n_discard: int) -> None:
        before = len(slot.tokens)
        real(self, slot, n_keep, n_discard)
        shifts.append((before, list(slot.tokens)))

    monkeypatch.setattr(prefix_cache.Slots, "shift", recorded)
    live = Live(one_layer, **LOAD)
    try:
        events = live.run("long", prompt="from " * 10, sampling=greedy(400, "shift"))  # no end of text before 400
        done = one(events, P.Done)
        generated, n_prompt = done.tokens, done.usage["prompt_tokens"]
        assert done.finish_reason == "length" and len(generated) == 400 > N_CTX  # past the window
        overs = [e for e in events if isinstance(e, P.Overflow)]
        assert len(overs) == len(shifts) >= 2 and all(o.policy == "shift" for o in overs)
        assert overs[-1].truncated_tokens == done.usage["truncated_tokens"] == sum(b - len(t) for b, t in shifts)
        before, kept = shifts[0]
        assert kept[0] == live.prompts["long"][0] and len(kept) == 1 + (before - 1) - (before - 1) // 2  # BOS kept
        k = before - n_prompt  # generated tokens in the cache at the shift; generated[k] was fed next
        until = shifts[1][0] - len(kept)  # tokens generated after the first shift, before the second
        ref = _run_tokens(live, "ref", kept + [generated[k]], until)
        assert ref == generated[k + 1:k + 1 + until]
    finally:
        live.close()


def _run_tokens(live: Live, rid: str, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens for a prompt given as token ids (a fresh prefill: the engine holds nothing of it)."""
    from ggufdesk.engine.batching.sequence import RunStats, Sequence

    batch = live.engine.batch
    batch.slots.evict(N_CTX)
    seq = Sequence(rid=rid, prompt=prompt, sampling=SamplingSettings(temperature=0.0, max_tokens=n), max_gen=n,
                   stats=RunStats(n_prompt=len(prompt)))
    batch.submit(seq)
    while batch.busy:
        batch.step()
    done = one([e for e in live.events if getattr(e, "id", None) == rid], P.Done)
    assert done.usage["cached_tokens"] == 0
    return done.tokens


def test_a_model_that_cannot_shift_rolls_and_says_so(one_layer, monkeypatch):
    live = Live(one_layer, **LOAD)
    try:
        monkeypatch.setattr(type(live.engine.batch.mem), "can_shift", lambda self: False)
        text = " ".join(ggufs.WORDS[i % len(ggufs.WORDS)] for i in range(300))
        events = live.run("r", prompt=text, sampling=greedy(400, "shift"))
        over, done = one(events, P.Overflow), one(events, P.Done)
        assert over.policy == "rolling" and "cannot shift" in over.note and over.truncated_tokens > 0
        assert done.usage["prompt_tokens"] + done.usage["completion_tokens"] <= N_CTX  # never past the window
    finally:
        live.close()


def test_lookup_drafts_through_a_shift_and_writes_what_plain_decoding_writes(one_layer, monkeypatch):
    """Lookup's n-gram cache grows by the tokens written since its last look (engine/speculation/lookup.py:
    NgramCache.grow); a context shift rewrites the request's text, which the cache must see: it starts a
    new document at every shift, and the answer is plain decoding's, token for token."""
    from ggufdesk.engine.speculation import lookup

    docs: list[int] = []
    real = lookup.NgramCache._new_doc

    def counted(self: Any, tokens: list[int]) -> None:
        docs.append(len(tokens))
        real(self, tokens)

    monkeypatch.setattr(lookup.NgramCache, "_new_doc", counted)
    live = Live(one_layer, **LOAD)
    try:
        plain = one(live.run("plain", prompt="from " * 10, sampling=greedy(400, "shift")), P.Done)
        docs.clear()
        events = live.run("spec", prompt="from " * 10, sampling=greedy(400, "shift"),
                          speculation={"mode": "lookup", "k_max": 8, "adaptive": False})
        done = one(events, P.Done)
        shifts = [e for e in events if isinstance(e, P.Overflow)]
        assert len(shifts) >= 2 and done.tokens == plain.tokens
        final = [e for e in events if isinstance(e, P.Stats) and e.final][-1]
        assert final.drafted > 0 and final.accepted > 0
        assert len(docs) == 1 + len(shifts)  # the first look's document, then one after each shift
        assert all(n < N_CTX for n in docs)  # each the shifted text, not the old one grown on
    finally:
        live.close()
