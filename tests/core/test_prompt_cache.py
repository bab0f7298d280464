"""The disk prompt cache's files without llama.cpp: keys, the longest prefix, checks, atomic writes, the cap."""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from ggufdesk.core import prompt_cache as pc


def key(**kw) -> pc.CacheKey:
    fields = dict(model_sha256="a" * 64, runtime="llama-cpp-python 0.3.36", type_k="f16", type_v="f16",
                  flash_attn="auto", n_ctx_class=4096)
    fields.update(kw)
    return pc.CacheKey(**fields)


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


@pytest.fixture
def store(tmp_path) -> pc.PromptStore:
    return pc.PromptStore(tmp_path / "cache", max_bytes=1 << 20)


def test_an_entry_round_trips_and_the_longest_shared_prefix_wins(store):
    k = key()
    short = store.save(k, [1, 2, 3, 4], payload(100), model_path="/m.gguf")
    other = store.save(k, [1, 2, 9, 9, 9, 9], payload(120, 1), model_path="/m.gguf")
    assert short is not None and other is not None
    hit = store.best(k, [1, 2, 3, 4, 5, 6], limit=5, at_least=1)
    assert hit is not None and hit[0].tokens == [1, 2, 3, 4] and hit[1] == 4
    assert store.load(hit[0], k) == payload(100)
    hit = store.best(k, [1, 2, 9, 9, 7], limit=4, at_least=1)  # shares 4 of other's 6: the rest is cut later
    assert hit is not None and hit[0].n_tokens == 6 and hit[1] == 4
    assert store.best(k, [1, 2, 3, 4, 5], limit=4, at_least=5) is None  # too little to be worth a read
    assert store.best(k, [7, 7], limit=1, at_least=1) is None


def test_another_key_is_never_offered(store):
    store.save(key(), [1, 2, 3], payload(50))
    for other in (key(model_sha256="b" * 64), key(type_k="q8_0"), key(type_v="q8_0"), key(flash_attn="on"),
                  key(n_ctx_class=8192), key(runtime="llama-cpp-python 0.3.37"), key(lora=("c" * 64,))):
        assert other.digest != key().digest
        assert store.best(other, [1, 2, 3, 4], limit=3, at_least=1) is None


def test_a_longer_entry_of_the_same_line_replaces_its_prefixes(store):
    k = key()
    store.save(k, [1, 2, 3], payload(30))
    store.save(k, [5, 6], payload(30))
    store.save(k, [1, 2, 3, 4, 5], payload(40))
    assert sorted(e.tokens for e in store.entries()) == [[1, 2, 3, 4, 5], [5, 6]]



def test_with_a_sliding_window_a_longer_entry_serves_only_where_it_ends_and_keeps_its_prefixes(store):
    # a sliding-window model's state keeps the window's layers only for its last positions: one longer
    # than the window cannot be cut back far (engine/batching/prefix_cache.py), so it neither serves a
    # shorter prompt nor replaces the prompt's own entry (a conversation's turn saved after its prompt)
    k = key()
    store.save(k, [1, 2, 3, 4], payload(40), window=4)
    store.save(k, [1, 2, 3, 4, 5, 6, 7], payload(70), window=4)
    assert sorted(e.n_tokens for e in store.entries()) == [4, 7]
    hit = store.best(k, [1, 2, 3, 4, 5, 6, 7, 8], limit=7, at_least=1, window=4)  # the next turn: where it ends
    assert hit is not None and hit[0].n_tokens == 7 and hit[1] == 7
    hit = store.best(k, [1, 2, 3, 4, 5, 9], limit=5, at_least=1, window=4)  # cut back to 5: the prompt's entry
    assert hit is not None and hit[0].n_tokens == 4 and hit[1] == 4
    hit = store.best(k, [1, 2, 3, 4, 5, 6, 9], limit=6, at_least=5, window=4)  # one token before its end
    assert hit is not None and hit[0].n_tokens == 7 and hit[1] == 6
    assert store.best(k, [1, 2, 3, 4, 5, 9], limit=5, at_least=5, window=4) is None
    assert store.best(k, [1, 2, 3, 4, 5, 9], limit=5, at_least=5)[1] == 5  # (without a window: cut back)
    store.save(k, [1, 2, 3, 4, 5], payload(50), window=8)  # within the window: it replaces its prefixes
    assert sorted(e.n_tokens for e in store.entries()) == [5, 7]

@pytest.mark.parametrize("damage", ["truncated", "random", "flipped", "longer", "renamed"])
def test_a_damaged_file_is_deleted_and_never_used(store, damage):
    k = key()
    entry = store.save(k, [1, 2, 3, 4], payload(200))
    assert entry is not None
    data = entry.path.read_bytes()
    if damage == "truncated":
        entry.path.write_bytes(data[:-50])
    elif damage == "random":
        entry.path.write_bytes(os.urandom(len(data)))
    elif damage == "flipped":  # same size, one byte of the KV state changed: only the checksum sees it
        entry.path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "longer":
        entry.path.write_bytes(data + b"x")
    else:  # an entry of one key under another key's name
        entry.path.rename(entry.path.with_name(key(type_k="q8_0").digest + "-" + entry.path.name.split("-")[1]))
    hit = store.best(k, [1, 2, 3, 4, 5], limit=4, at_least=1)
    if hit is not None:  # the header still reads: the state's checks catch it
        assert store.load(hit[0], k) is None
    assert store.entries() == [] and list((store.root).glob("*.kv")) == []


def test_files_that_are_not_entries_are_dropped(store):
    store.root.mkdir(parents=True)
    (store.root / f"{key().digest}-junk.kv").write_bytes(b"GGDKVC1\n\xff\xff\xff\xff")
    (store.root / f"{key().digest}-empty.kv").write_bytes(b"")
    (store.root / "notes.txt").write_text("kept: not ours")
    assert store.entries() == []
    assert sorted(p.name for p in store.root.iterdir()) == ["notes.txt"]


def test_the_cap_evicts_the_least_recently_used_first(tmp_path):
    store = pc.PromptStore(tmp_path, max_bytes=1 << 20)
    k = key()
    a = store.save(k, [1] * 10, payload(900))
    b = store.save(k, [2] * 10, payload(900))
    assert a is not None and b is not None
    store.max_bytes = 3 * a.size + 10  # room for three entries of this size
    old = time.time() - 100
    os.utime(a.path, (old, old))
    os.utime(b.path, (old + 50, old + 50))
    store.load(store.best(k, [1] * 11, limit=10, at_least=1)[0], k)  # a restore makes `a` the newest
    c = store.save(k, [3] * 10, payload(900))
    d = store.save(k, [4] * 10, payload(900))
    assert c is not None and d is not None
    left = sorted(e.tokens[0] for e in store.entries())
    assert left == [1, 3, 4] and sum(e.size for e in store.entries()) <= store.max_bytes
    assert store.save(k, [5] * 10, payload(4 * a.size)) is None  # alone over the cap: never written


def test_a_full_disk_while_saving_loses_only_that_entry(store, monkeypatch):
    k = key()
    assert store.save(k, [1, 2], payload(10)) is not None

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pc.os, "fsync", full)
    assert store.save(k, [7, 8, 9], payload(10)) is None
    monkeypatch.undo()
    assert [e.tokens for e in store.entries()] == [[1, 2]]
    assert [p.name for p in store.root.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert store.read_only is None and store.save(k, [7, 8, 9], payload(10)) is not None  # later saves work


def test_a_read_only_directory_still_serves_its_entries(store, monkeypatch):
    k = key()
    store.save(k, [1, 2, 3], payload(64))

    def refuse(path: Path, parts: list) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(pc, "write_atomic", refuse)
    assert store.save(k, [4, 5, 6], payload(64)) is None and store.read_only
    assert store.save(k, [7, 8, 9], payload(64)) is None  # said once, then not tried again
    hit = store.best(k, [1, 2, 3, 4], limit=3, at_least=1)
    assert hit is not None and store.load(hit[0], k) == payload(64)


def test_a_missing_or_unwritable_root_is_not_an_error(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    store = pc.PromptStore(blocked / "cache", max_bytes=1 << 20)  # its parent is a file
    assert store.entries() == [] and store.summary()["entries"] == []
    assert store.save(key(), [1, 2, 3], payload(10)) is None


def test_the_model_hash_is_remembered_by_path_size_and_mtime(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    root = tmp_path / "cache"
    first = pc.model_sha256(str(model), root)
    assert pc.known_sha256(str(model), root) == first
    reads = []
    real_open = open

    def counting_open(path, *a, **kw):
        reads.append(str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", counting_open)
    assert pc.model_sha256(str(model), root) == first and str(model) not in reads  # not read again
    monkeypatch.undo()
    model.write_bytes(b"other weights" * 1000)  # a changed file (size and mtime): hashed again
    assert pc.known_sha256(str(model), root) is None
    assert pc.model_sha256(str(model), root) != first


def test_entries_of_a_model_file_that_changed_are_deleted(store):
    store.save(key(model_sha256="a" * 64), [1, 2], payload(10), model_path="/models/m.gguf")
    store.save(key(model_sha256="c" * 64), [1, 2], payload(10), model_path="/models/other.gguf")
    assert store.forget_model("/models/m.gguf", "b" * 64) == 1
    assert [e.model_path for e in store.entries()] == ["/models/other.gguf"]


def test_clear_and_summary(store):
    store.save(key(), [1, 2, 3, 4], payload(400), model_path="/m.gguf")
    info = store.summary()
    assert info["entries"][0]["tokens"] == 4 and info["entries"][0]["bytes_per_token"] == 100
    assert info["bytes"] == info["entries"][0]["bytes"] > 400
    assert store.clear() == (1, info["bytes"]) and store.summary()["entries"] == []


def test_ctx_class_rounds_up_to_a_power_of_two():
    assert [pc.ctx_class(n) for n in (256, 257, 4096, 5000)] == [256, 512, 4096, 8192]


def test_common_prefix_finds_the_first_difference_wherever_it_lies():
    import random
    rng = random.Random(7)
    for size in (0, 1, 2, 31, 32, 33, 63, 64, 65, 100, 1000, 4099):
        a = [rng.randrange(3) for _ in range(size)]
        assert pc.common_prefix(a, list(a)) == size
        assert pc.common_prefix(a, a + [5, 6]) == size == pc.common_prefix(a + [5], a)
        for at in {0, size // 3, size // 2, size - 1, *(rng.randrange(size) for _ in range(8))} if size else ():
            b = list(a)
            b[at] += 1
            assert pc.common_prefix(a, b) == at  # the only token that differs
            assert pc.common_prefix(b[:at + 1], a) == at  # a shorter one that differs at its last token
    assert pc.common_prefix([], [1]) == 0
    # tokens from different readers need not be the same objects, nor lists
    big = [100_000 + i for i in range(300)]
    assert pc.common_prefix(big, [int(str(t)) for t in big]) == 300
    assert pc.common_prefix(tuple(big), big[:200] + [0]) == 200
