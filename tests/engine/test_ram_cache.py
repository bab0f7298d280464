"""Prompt states kept in RAM beyond the slots (engine/batching/ram_cache.py, engine/batching/prompt_states.py):
the store's rules on their own, then on the real engine: a prompt pushed out of its slot by another comes
back from memory with the logits of a fresh prefill; off, too small, refused by llama.cpp, nonsense settings;
Gemma 3's sliding window on the starter."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.batching.ram_cache import RamCache
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime import memlimit
from tests.engine.inproc import Live, one
from tests.engine.test_disk_cache import ALIGNED, LOAD

# ---- the store -----------------------------------------------------------------------------------


def state(n: int) -> bytearray:
    return bytearray(n)


def test_the_longest_shared_prefix_wins_and_a_tie_goes_to_the_shorter_entry():
    ram = RamCache(1000)
    ram.put([1, 2, 3, 4, 5, 6], state(10))
    ram.put([1, 2, 3, 9], state(10))
    ram.put([1, 2, 3, 4, 7, 7, 7], state(10))
    hit = ram.best([1, 2, 3, 4, 5, 6, 8], limit=6, at_least=2)
    assert hit is not None and hit[0].tokens == [1, 2, 3, 4, 5, 6] and hit[1] == 6
    hit = ram.best([1, 2, 3, 4, 0], limit=4, at_least=2)  # [1,2,3,4,...] twice: the shorter one
    assert hit is not None and hit[0].tokens == [1, 2, 3, 4, 5, 6] and hit[1] == 4
    assert ram.best([1, 2, 3, 4, 5, 6, 8], limit=6, at_least=7) is None  # (limit caps what counts)
    assert ram.best([5, 5], limit=1, at_least=1) is None


def test_the_least_recently_used_go_first_under_the_byte_cap():
    ram = RamCache(30)
    ram.put([1, 1], state(10))
    ram.put([2, 2], state(10))
    ram.put([3, 3], state(10))
    hit = ram.best([1, 1, 0], limit=2, at_least=2)
    assert hit is not None
    ram.touch(hit[0])  # restored: now the most recent
    ram.put([4, 4], state(10))
    assert sorted(e.tokens[0] for e in ram.entries) == [1, 3, 4] and ram.bytes == 30
    ram.put([5, 5], state(25))  # room for it alone with nothing else
    assert [e.tokens for e in ram.entries] == [[5, 5]]
    assert not ram.put([6, 6], state(31)) and [e.tokens for e in ram.entries] == [[5, 5]]  # larger than the cap


def test_a_longer_state_replaces_its_prefix_only_where_it_serves_it():
    ram = RamCache(1000)
    ram.put([1, 2, 3], state(10))
    ram.put([1, 2, 3, 4, 5], state(10))
    assert [e.tokens for e in ram.entries] == [[1, 2, 3, 4, 5]]
    assert ram.holds([1, 2, 3, 4], within=2) and not ram.holds([1, 2, 3, 4, 5, 6, 7, 8], within=2)
    window = RamCache(1000, window=4)  # a sliding window of 4: a 5-token state cannot be cut back to 3
    window.put([1, 2, 3], state(10))
    window.put([1, 2, 3, 4, 5], state(10))
    assert sorted(len(e.tokens) for e in window.entries) == [3, 5]
    window.put([1, 2, 3, 4], state(10))  # within the window: it serves [1, 2, 3]'s prefixes too
    assert sorted(len(e.tokens) for e in window.entries) == [4, 5]
    hit = window.best([1, 2, 3, 4, 5, 6], limit=5, at_least=1)  # the 5-token state where it ends: usable
    assert hit is not None and hit[0].n_tokens == 5 and hit[1] == 5
    hit = window.best([1, 2, 3, 9], limit=3, at_least=1)  # cut back to 3: only the 4-token one serves
    assert hit is not None and hit[0].n_tokens == 4 and hit[1] == 3
    window.remove(hit[0])
    assert window.best([1, 2, 3, 9], limit=3, at_least=1) is None


def test_nonsense_settings_are_refused_and_the_ceiling_counts_the_cache(tiny_model):
    with pytest.raises(SettingsError):
        LoadSettings(prompt_cache_ram_bytes=-1)
    with pytest.raises(SettingsError):
        LoadSettings(prompt_cache_ram_bytes="1G")  # type: ignore[arg-type]
    small = memlimit.limit_for(str(tiny_model), LoadSettings(prompt_cache_ram_bytes=0))
    large = memlimit.limit_for(str(tiny_model), LoadSettings(prompt_cache_ram_bytes=1 << 30))
    assert small is not None and large is not None and large - small >= (1 << 30) - (16 << 20)


# ---- on the engine -------------------------------------------------------------------------------

MEMORY_ONLY = {**LOAD, "prompt_cache_bytes": 0}  # one slot, the disk off: only the RAM can bring A back
OTHER = "hello " * 80


def answer(live: Live, rid: str, prompt: str = ALIGNED) -> tuple[P.Done, list[dict[str, Any]]]:
    events = live.run(rid, prompt=prompt, sampling={"temperature": 0.0, "max_tokens": 6}, logprobs=20)
    errors = [e for e in events if isinstance(e, P.Error)]
    assert not errors, errors
    return one(events, P.Done), [lp for e in events if isinstance(e, P.Token) for lp in (e.logprobs or [])]


def a_b_a(**load: Any) -> tuple[Live, P.Done, list[dict[str, Any]], P.Done, list[dict[str, Any]]]:
    """A, then B in A's only slot, then A again: (the live engine, A cold, A again)."""
    live = Live(Path(load.pop("model")), **{**MEMORY_ONLY, **load})
    cold, cold_lp = answer(live, "a")
    other, _ = answer(live, "b", OTHER)
    assert other.usage["cached_tokens"] <= 1  # (only the BOS was A's)
    warm, warm_lp = answer(live, "a2")
    return live, cold, cold_lp, warm, warm_lp


def test_a_prompt_pushed_out_of_its_slot_comes_back_from_memory_exactly(tiny_model):
    live, cold, cold_lp, warm, warm_lp = a_b_a(model=tiny_model)
    try:
        saved = live.engine.batch.saved
        assert saved is not None and saved.disk is None and saved.restored == {"ram": 1, "disk": 0}
    finally:
        live.close()
    assert warm.usage["cached_tokens"] == 128 and warm.usage["restored_tokens"] == 0  # (restored: the disk's)
    assert warm.tokens == cold.tokens and warm_lp == cold_lp  # every logprob of every token, exactly


def test_with_the_disk_on_too_the_memory_serves_what_it_holds(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("GGUFDESK_PROMPT_CACHE", str(tmp_path / "prompt-cache"))
    live, cold, cold_lp, warm, warm_lp = a_b_a(model=tiny_model, prompt_cache_bytes=1 << 30)
    try:
        saved = live.engine.batch.saved
        assert saved is not None and saved.disk is not None and saved.restored == {"ram": 1, "disk": 0}
    finally:
        live.close()
    assert warm.usage["cached_tokens"] == 128 and warm.tokens == cold.tokens and warm_lp == cold_lp
    assert len(list((tmp_path / "prompt-cache").glob("*.kv"))) == 2  # A and B written too (one copy each)


def test_a_state_is_copied_after_the_steps_events_went_out(tiny_model):
    # the copy of a big model's state takes a while: the Done (here; a sliding-window model's first
    # token) must not wait for it, and the slot is saved before another request can take it
    live = Live(tiny_model, **MEMORY_ONLY)
    try:
        batch, order = live.engine.batch, live.events
        saved = batch.saved
        assert saved is not None
        save = saved.save

        def marked(slot: Any) -> bool:
            order.append(("save", len(slot.tokens)))
            return save(slot)

        saved.save = marked  # type: ignore[method-assign]
        batch.flush = lambda: order.append("flush")
        first, _ = answer(live, "a")
        done = next(i for i, e in enumerate(order) if isinstance(e, P.Done))
        after = [e for e in order[done + 1:] if not isinstance(e, P.Status)]
        n = first.usage["prompt_tokens"] + len(first.tokens) - 1  # (the last token is not in the KV)
        assert after == ["flush", ("save", n)]
        assert saved.ram is not None and [e.n_tokens for e in saved.ram.entries] == [n] and not saved.pending
    finally:
        live.close()


def test_a_step_that_fails_saves_nothing_it_had_queued(tiny_model):
    # a bug in a step clears the KV: the slots it queued hold nothing worth keeping
    live = Live(tiny_model, **MEMORY_ONLY)
    try:
        batch = live.engine.batch
        saved = batch.saved
        assert saved is not None and saved.ram is not None
        answer(live, "a")
        for e in list(saved.ram.entries):
            saved.ram.remove(e)
        saved.finished(batch.slots.slots[0])
        assert len(saved.pending) == 1
        batch.fail_all("a bug")
        assert not saved.pending
        batch.step()
        assert not saved.ram.entries
    finally:
        live.close()


@pytest.mark.parametrize("cap", [0, 1000])
def test_off_or_too_small_the_prompt_is_prefilled_again(tiny_model, cap):
    live, cold, cold_lp, warm, warm_lp = a_b_a(model=tiny_model, prompt_cache_ram_bytes=cap)
    try:
        saved = live.engine.batch.saved
        assert saved is None if cap == 0 else (saved is not None and saved.ram is not None and not saved.ram.entries)
    finally:
        live.close()
    assert warm.usage["cached_tokens"] <= 1 and warm.tokens == cold.tokens
    # (prefilled after the BOS its slot kept, in other chunks than the cold prompt: the last bits differ)
    assert [e["logprob"] for e in warm_lp] == pytest.approx([e["logprob"] for e in cold_lp], abs=1e-4)


def test_a_state_llama_cpp_refuses_is_dropped_and_the_prompt_prefilled(tiny_model, monkeypatch):
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data", lambda *a: 0)
    live, cold, cold_lp, warm, warm_lp = a_b_a(model=tiny_model)
    try:
        saved = live.engine.batch.saved
        assert saved is not None and saved.ram is not None and saved.restored == {"ram": 0, "disk": 0}
        again, _ = answer(live, "a3")  # the refused entry went; A's second answer was kept again, and refused
    finally:
        live.close()
    assert warm.usage["cached_tokens"] == 0 and warm.tokens == cold.tokens and warm_lp == cold_lp
    assert again.tokens == cold.tokens and again.usage["cached_tokens"] == 128  # (its slot held it)


def test_no_memory_for_the_copy_keeps_nothing_and_the_answers_go_on(tiny_model, monkeypatch):
    from ggufdesk.engine.batching import prompt_states

    def full(size: int) -> bytearray:
        raise MemoryError

    monkeypatch.setattr(prompt_states, "bytearray", full, raising=False)
    live, cold, cold_lp, warm, warm_lp = a_b_a(model=tiny_model)
    try:
        saved = live.engine.batch.saved
        assert saved is not None and saved.ram is not None and not saved.ram.entries
    finally:
        live.close()
    assert warm.usage["cached_tokens"] <= 1 and warm.tokens == cold.tokens


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sliding_window_prompt_comes_back_from_memory_on_the_starter(starter_model):
    from tests.engine.test_context_starter import text

    prompt = text(700)  # longer than Gemma 3's 512-token window: kept as soon as it is prefilled
    load = {"n_ctx": 2048, "n_threads": 2, "n_threads_batch": 2, "prompt_cache_bytes": 0}
    live = Live(starter_model, **load)
    try:
        assert live.engine.batch.slots.n_swa == 512
        cold, _ = answer(live, "cold", prompt)
        again, again_lp = answer(live, "again", prompt)  # its slot serves it: the last token alone, as below
        answer(live, "other", text(300, 5))
        warm, warm_lp = answer(live, "warm", prompt)
        shorter, _ = answer(live, "short", text(300) + " and then the rain came")  # cut back before its window
    finally:
        live.close()
    assert warm.usage["cached_tokens"] == warm.usage["prompt_tokens"] - 1 and warm.usage["restored_tokens"] == 0
    assert warm.tokens == again.tokens == cold.tokens
    # as tests/engine/test_context_starter.py's disk restore: the window's cells are summed in another order
    # once read back (they sit in other cells)
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(warm_lp, again_lp)) < 0.01
    assert shorter.usage["cached_tokens"] <= 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sliding_window_conversation_comes_back_with_its_answer_on_the_starter(starter_model):
    # the next turn continues prompt + answer: kept when the answer ended (as llama-server keeps a slot),
    # not only when the prompt was read; a state longer than the window, used where it ends
    from tests.engine.test_context_starter import text

    load = {"n_ctx": 2048, "n_threads": 2, "n_threads_batch": 2, "prompt_cache_bytes": 0}
    sampling = {"temperature": 0.0, "max_tokens": 80}
    live = Live(starter_model, **load)
    try:
        first = one(live.run("turn1", prompt=text(600), sampling=sampling, ignore_eos=True), P.Done)
        kept = live.prompts["turn1"] + first.tokens[:-1]  # (its last token never went into the KV)
        assert len(kept) > live.engine.batch.slots.n_swa
        answer(live, "other", text(300, 5))  # takes the only slot
        follow = live.prompts["turn1"] + first.tokens + live.prompts["other"][1:9]  # (any next words will do)
        second = one(live.run("turn2", prompt_tokens=follow, sampling={"temperature": 0.0, "max_tokens": 4}), P.Done)
    finally:
        live.close()
    assert second.usage["cached_tokens"] == len(kept) and second.usage["restored_tokens"] == 0
