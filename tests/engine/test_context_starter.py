"""The prompt cache and the context shift on the real starters (slow tier): Gemma 3's sliding window, and a
chat model's conversation carried across a restart."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ggufdesk.engine.link import protocol as P
from tests.engine.inproc import Live, one

# several prefills of a 700-token prompt on the starter: minutes on a busy 2-core machine, not a hang
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORDS = ("river town woke slowly fishermen pulled their boats onto the gravel baker opened his shutters thin "
         "smoke rose from chimneys along water children ran to school on hill").split()
LOAD = {"n_ctx": 2048, "n_threads": 2, "n_threads_batch": 2}


def text(n: int, seed: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(n))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "prompt-cache"
    monkeypatch.setenv("GGUFDESK_PROMPT_CACHE", str(root))
    return root


def answer(live: Live, rid: str, **fields: Any) -> tuple[P.Done, list[dict[str, Any]]]:
    events = live.run(rid, sampling={"temperature": 0.0, "max_tokens": 8}, logprobs=5, **fields)
    errors = [e for e in events if isinstance(e, P.Error)]
    assert not errors, errors
    return one(events, P.Done), [lp for e in events if isinstance(e, P.Token) for lp in (e.logprobs or [])]


def test_a_sliding_window_prompt_is_saved_when_prefilled_and_restored_exactly(starter_model, cache):
    prompt = text(700)  # longer than Gemma 3's 512-token window
    live = Live(starter_model, **LOAD)
    try:
        assert live.engine.batch.slots.n_swa == 512
        cold, _ = answer(live, "cold", prompt=prompt)
        again, again_lp = answer(live, "again", prompt=prompt)  # the same engine: its memory serves it
    finally:
        live.close()
    assert again.usage["cached_tokens"] == again.usage["prompt_tokens"] - 1
    (entry,) = cache.glob("*.kv")
    live = Live(starter_model, **LOAD)
    try:
        warm, warm_lp = answer(live, "warm", prompt=prompt)
        # cut back before its window ends: the saved state cannot serve this one
        shorter, _ = answer(live, "short", prompt=text(300) + " and then the rain came")
    finally:
        live.close()
    assert warm.usage["restored_tokens"] == warm.usage["prompt_tokens"] - 1
    # as the memory cache: the same tokens; the logprobs to rounding (the window's cells are summed in
    # another order once read back: they sit in other cells)
    assert warm.tokens == again.tokens == cold.tokens
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(warm_lp, again_lp)) < 0.01
    assert shorter.usage["restored_tokens"] == 0
    live = Live(starter_model, **{**LOAD, "prompt_cache_bytes": 0})
    try:
        fresh, fresh_lp = answer(live, "fresh", prompt=text(300) + " and then the rain came")
    finally:
        live.close()
    assert shorter.tokens == fresh.tokens


def test_a_conversation_goes_on_after_a_restart_from_its_saved_turn(chat_starter, cache):
    system = {"role": "system", "content": "You are a guide to a river town. " + text(400, 3)}
    first = [system, {"role": "user", "content": "What do the fishermen do?"}]
    live = Live(chat_starter, **LOAD)
    try:
        done, _ = answer(live, "t1", messages=first)
    finally:
        live.close()
    second = first + [{"role": "assistant", "content": done.text}, {"role": "user", "content": "And the baker?"}]
    live = Live(chat_starter, **LOAD)
    try:
        turn, _ = answer(live, "t2", messages=second)
    finally:
        live.close()
    assert turn.usage["restored_tokens"] > done.usage["prompt_tokens"]  # the first turn's answer too


def test_gemma_shifts_its_context_and_goes_on(starter_model, cache):
    live = Live(starter_model, **{**LOAD, "n_ctx": 256, "prompt_cache_bytes": 0})
    try:
        events = live.run("r", prompt=text(100), sampling={"temperature": 0.0, "max_tokens": 350,
                                                           "context_overflow": "shift", "stop": ["never"]})
    finally:
        live.close()
    done = one(events, P.Done)
    overs = [e for e in events if isinstance(e, P.Overflow)]
    if done.finish_reason == "length":  # a base model may also end its text by itself
        assert done.usage["completion_tokens"] == 350 and overs and overs[-1].policy == "shift"
    assert done.usage["prompt_tokens"] + done.usage["completion_tokens"] - done.usage["truncated_tokens"] <= 256
