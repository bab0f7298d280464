"""The disk prompt cache on the real engine (tiny f32 models): a prompt's KV survives a restart and gives the
same logits; another model, KV type or a changed file is never used; damaged files, a full disk and a
read-only folder leave every answer as it would be without the cache."""
from __future__ import annotations

import errno
import os
import string
from pathlib import Path
from typing import Any

import pytest

from ggufdesk.core import prompt_cache as pc
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.engine.inproc import Live, one
from tests.fixtures import ggufs

N_BATCH = 64
LOAD = dict(n_ctx=512, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=1, n_threads_batch=1, type_k="f32",
            type_v="f32", flash_attn="off", prompt_cache_min_tokens=32)
# One token per letter (" x" is a piece of the tiny vocabulary) after the BOS: 1 + 128 tokens, so a
# fresh prefill evaluates the last token alone (chunks of 64, 64, 1), as a restored prompt does;
# llama.cpp's batched matmul rounds the last bits differently from a single row.
ALIGNED = " ".join(string.ascii_lowercase[i * 7 % 26] for i in range(128))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "prompt-cache"
    monkeypatch.setenv("GGUFDESK_PROMPT_CACHE", str(root))
    return root


def entries(root: Path) -> list[Path]:
    return sorted(root.glob("*.kv")) if root.exists() else []


def answer(model: Path, prompt: str = ALIGNED, *, speculation: dict[str, Any] | None = None, max_tokens: int = 6,
           draft: Path | None = None, stats: list[P.Stats] | None = None,
           **load: Any) -> tuple[P.Done, list[dict[str, Any]]]:
    """One greedy answer from a fresh engine process (its pending saves land before it stops); its
    Stats events are appended to `stats` when given."""
    with EngineClient(auto_restart=False) as client:
        client.load(str(model), settings=LoadSettings(**{**LOAD, **load}), speculation=speculation,
                    draft=None if draft is None else str(draft))
        rid = client.generate(prompt=prompt, sampling={"temperature": 0.0, "max_tokens": max_tokens}, logprobs=20,
                              speculation=speculation)
        events = list(client.stream(rid, timeout=120))
    errors = [e for e in events if isinstance(e, P.Error)]
    assert not errors, errors
    lps = [lp for e in events if isinstance(e, P.Token) for lp in (e.logprobs or [])]
    if stats is not None:
        stats.extend(e for e in events if isinstance(e, P.Stats))
    return one(events, P.Done), lps


def test_a_prompt_saved_before_a_restart_is_restored_with_the_same_logits(tiny_model, cache):
    cold, cold_lp = answer(tiny_model)
    assert cold.usage["prompt_tokens"] == 129 and cold.usage["restored_tokens"] == 0
    (saved,) = entries(cache)
    warm, warm_lp = answer(tiny_model)  # a new engine process: only the disk can know the prompt
    assert warm.usage["restored_tokens"] == warm.usage["cached_tokens"] == 128
    assert warm_lp == cold_lp and warm.tokens == cold.tokens  # every logprob of every token, exactly
    assert entries(cache) == [saved]  # nothing new to save: the entry already holds all of it


@pytest.mark.parametrize("kind", ["lookup", "self-draft"])
def test_a_prompt_saved_with_a_speculative_answer_is_restored_exactly(tiny_model, cache, kind):
    # a speculative answer's slot (drafts verified in multi-row batches; lookup's mostly rejected here and
    # rolled back, the model drafting for itself all accepted) is saved with its prompt; a later request
    # of the prompt starts from that file and writes plain decoding's answer: a plain request with every
    # logprob exact (issue 29: the held-out copy-ja prompt, 305 tokens, runs this way in bench/speculative.py)
    spec_kw: dict[str, Any] = {"speculation": {"mode": "lookup", "k_max": 8, "adaptive": False,
                                               "lookup_history": False}}
    if kind == "self-draft":
        spec_kw = {"speculation": {"mode": "draft", "k_max": 4, "adaptive": False, "draft_model": str(tiny_model)},
                   "draft": tiny_model}
    plain, plain_lp = answer(tiny_model, prompt_cache_bytes=0, max_tokens=24)
    st: list[P.Stats] = []
    spec, _ = answer(tiny_model, max_tokens=24, stats=st, **spec_kw)
    assert spec.tokens == plain.tokens and spec.usage["restored_tokens"] == 0
    drafted, accepted = st[-1].drafted, st[-1].accepted
    assert drafted >= 8 and (accepted < drafted if kind == "lookup" else accepted == drafted), (drafted, accepted)
    (saved,) = entries(cache)
    warm, warm_lp = answer(tiny_model, max_tokens=24)  # plain, in a new engine process: from the file
    assert warm.usage["restored_tokens"] == 128
    assert warm.tokens == plain.tokens and warm_lp == plain_lp  # the prompt's KV is prefill's, exactly
    warm, warm_lp = answer(tiny_model, max_tokens=24, **spec_kw)  # and speculating again from it
    assert warm.usage["restored_tokens"] == 128 and warm.tokens == plain.tokens
    # (verification rows are batched: their logprobs round their last bits differently from one row's)
    assert [e["logprob"] for e in warm_lp] == pytest.approx([e["logprob"] for e in plain_lp], abs=1e-4)
    assert entries(cache) == [saved]


def test_a_longer_prompt_restores_the_shared_prefix_and_prefills_the_rest(tiny_model, cache):
    answer(tiny_model)
    longer = ALIGNED + " hello cat dog red blue green"
    cold, _ = answer(tiny_model, longer, prompt_cache_bytes=0)
    warm, _ = answer(tiny_model, longer)
    assert warm.usage["restored_tokens"] >= 128 and warm.tokens == cold.tokens


@pytest.mark.parametrize("change", ["other model", "kv type", "flash attention"])
def test_an_entry_of_another_key_is_not_used(tiny_model, tiny_draft, cache, change):
    answer(tiny_model)
    (saved,) = entries(cache)
    if change == "other model":
        done, _ = answer(tiny_draft)
    elif change == "kv type":
        done, _ = answer(tiny_model, type_k="f16", type_v="f16")
    else:
        done, _ = answer(tiny_model, flash_attn="on")
    assert done.usage["restored_tokens"] == 0
    assert saved in entries(cache)  # still good for its own model and settings


def test_a_changed_model_file_is_never_used_and_its_entries_go(tmp_path, cache):
    model = ggufs.write_tiny_llama(tmp_path / "m.gguf", ggufs.TinySpec(seed=11))
    answer(model)
    assert len(entries(cache)) == 1
    ggufs.write_tiny_llama(model, ggufs.TinySpec(seed=12))  # new weights under the same name
    fresh, _ = answer(model, prompt_cache_bytes=0)
    done, _ = answer(model)
    assert done.usage["restored_tokens"] == 0 and done.tokens == fresh.tokens
    assert [pc.read_entry(p).model_sha256 for p in entries(cache)] == [pc.known_sha256(str(model), cache)]


@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_a_damaged_entry_is_deleted_and_the_answer_is_unaffected(tiny_model, cache, damage):
    cold, cold_lp = answer(tiny_model)
    (saved,) = entries(cache)
    data = saved.read_bytes()
    saved.write_bytes(data[:len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    done, lp = answer(tiny_model)
    assert done.usage["restored_tokens"] == 0
    assert done.tokens == cold.tokens and lp == cold_lp
    assert [pc.read_entry(p).n_tokens for p in entries(cache)] == [len(cold.tokens) + 128]  # saved again, whole


def test_a_full_disk_while_saving_leaves_the_answer_and_no_file(tiny_model, cache, monkeypatch):
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pc.os, "fsync", full)
    live = Live(tiny_model, **LOAD)
    try:
        events = live.run("r", prompt=ALIGNED, sampling={"temperature": 0.0, "max_tokens": 6})
        live.engine.batch.saved.close()  # the writer has tried (and failed)
        again = live.run("s", prompt=ALIGNED, sampling={"temperature": 0.0, "max_tokens": 6})
    finally:
        live.close()
    assert one(events, P.Done).tokens == one(again, P.Done).tokens
    assert entries(cache) == [] and [p for p in cache.iterdir() if p.name.endswith(".tmp")] == []


def test_a_read_only_cache_folder_still_restores_and_saves_nothing(tiny_model, cache, monkeypatch):
    cold, _ = answer(tiny_model)
    (saved,) = entries(cache)

    def refuse(path: Path, parts: list) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(pc, "write_atomic", refuse)
    live = Live(tiny_model, **LOAD)
    try:
        warm = one(live.run("r", prompt=ALIGNED, sampling={"temperature": 0.0, "max_tokens": 6}), P.Done)
        other = one(live.run("s", prompt="hello " * 80, sampling={"temperature": 0.0, "max_tokens": 6}), P.Done)
        live.engine.batch.saved.close()
        assert live.engine.batch.saved.disk.store.read_only
    finally:
        live.close()
    assert warm.usage["restored_tokens"] == 128 and warm.tokens == cold.tokens
    assert other.usage["completion_tokens"] == 6
    assert entries(cache) == [saved]


def test_llama_cpp_refusing_a_state_is_a_plain_prefill(tiny_model, cache, monkeypatch):
    """A state that passes our checks but not llama.cpp's (another build writing the same format)."""
    import llama_cpp

    cold, _ = answer(tiny_model)
    monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data", lambda *a: 0)
    live = Live(tiny_model, **LOAD)
    try:
        done = one(live.run("r", prompt=ALIGNED, sampling={"temperature": 0.0, "max_tokens": 6}), P.Done)
    finally:
        live.close()
    assert done.usage["restored_tokens"] == 0 and done.tokens == cold.tokens
    assert len(entries(cache)) == 1  # the refused entry went; this answer's own KV was saved again


def test_the_cache_is_off_with_a_zero_cap(tiny_model, cache):
    answer(tiny_model, prompt_cache_bytes=0)
    assert entries(cache) == []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice values are Linux's")
def test_the_writer_runs_only_where_decoding_leaves_a_core(tiny_model, cache):
    import threading

    mine = os.getpriority(os.PRIO_PROCESS, 0)  # (this thread's)
    live = Live(tiny_model, **LOAD)
    try:
        writer = next(t for t in threading.enumerate() if t.name == "prompt-cache-writer" and t.is_alive())
        stat = Path(f"/proc/self/task/{writer.native_id}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[16]) == 19  # (field 19 of stat: nice)
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the loop's thread as it was
    finally:
        live.close()


def test_a_state_still_waiting_for_the_writer_counts_as_saved(tmp_path):
    # a sliding-window model saves its prompt, then prompt + a short answer: while the writer (at the
    # lowest priority) has not written the first, the second is no more worth a file than after it
    import threading
    from types import SimpleNamespace

    from ggufdesk.engine.batching.disk_cache import DiskCache
    from tests.core.test_prompt_cache import key

    store = pc.PromptStore(tmp_path / "cache", max_bytes=1 << 20)
    gate, save = threading.Event(), store.save

    def held(*args: Any, **kw: Any) -> Any:
        gate.wait(60)
        return save(*args, **kw)

    store.save = held  # type: ignore[method-assign]
    cache = DiskCache(SimpleNamespace(path=str(tmp_path / "m.gguf")), store, min_tokens=4,  # type: ignore[arg-type]
                      window=8)
    cache.key = key()
    prompt = list(range(1, 11))  # longer than the window
    assert cache.wants(prompt) and cache.put(prompt, bytearray(100))
    assert not cache.wants(prompt + [11, 12])  # (2 more than the state waiting: under min_tokens)
    assert cache.wants(prompt[:6] + [99] * 6)  # cut back inside the window: the waiting state cannot serve it
    gate.set()
    cache.close()
    assert [e.n_tokens for e in store.entries()] == [10] and not cache._inflight
    assert not cache.wants(prompt + [11, 12])
