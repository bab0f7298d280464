"""Files several processes write (core/atomic.py): whole or not at all, no entry lost to another writer."""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from ggufdesk.core import hardware, library
from ggufdesk.core.atomic import locked, write_atomic

WRITERS, EACH = 4, 12  # 48 runs: under hardware.MAX_RUNS, so every one must be kept
MODELS = 40  # each of two processes adds, started together (without the lock 8 runs of 8 lost some)


def _record_runs(i: int) -> int:
    for j in range(EACH):
        hardware.record_decode_run(where="cpu", bytes_per_token=10**8, tok_s=10.0 + i + j / 100, n_layer=1)
    return i


def _add_models(folder: str, both: Any) -> None:
    both.wait(60)  # the two processes started: their adds overlap
    for p in sorted(Path(folder).iterdir()):
        library.add_path(p)


def test_engines_recording_decode_runs_at_once_keep_every_run_and_never_fail_to_save():
    # with one fixed temporary name, 4 x 50 runs failed 57 renames and kept 14 (the module's docstring)
    ctx = multiprocessing.get_context("spawn")  # each a process of its own, as the engines are
    with ctx.Pool(WRITERS) as pool:
        assert pool.map(_record_runs, range(WRITERS)) == list(range(WRITERS))
    runs = json.loads((hardware.cache_dir() / hardware.CALIBRATION_FILE).read_text())
    assert len(runs) == WRITERS * EACH
    assert sorted(r["tok_s"] for r in runs) == sorted(10.0 + i + j / 100 for i in range(WRITERS) for j in range(EACH))
    assert [p.name for p in hardware.cache_dir().iterdir() if p.name.endswith(".tmp")] == []


def test_two_processes_adding_models_at_once_keep_both_lists(tmp_path):
    header = b"GGUF" + bytes(60)
    folders = []
    for w in range(2):
        d = tmp_path / f"w{w}"
        d.mkdir()
        for j in range(MODELS):
            (d / f"model-{w}-{j}.gguf").write_bytes(header)
        folders.append(str(d))
    ctx = multiprocessing.get_context("spawn")
    both = ctx.Barrier(2)
    procs = [ctx.Process(target=_add_models, args=(f, both)) for f in folders]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    kept = json.loads((library._data_file("library.json")).read_text())["paths"]
    assert sorted(Path(k).name for k in kept) == sorted(f"model-{w}-{j}.gguf" for w in range(2) for j in range(MODELS))


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "f.json"
    write_atomic(path, "old")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        write_atomic(path, [b"new", b"er"])
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_parts_bytes_and_text_are_written_alike(tmp_path):
    for data in ("é\n", "é\n".encode(), [b"\xc3", b"\xa9\n"]):
        write_atomic(tmp_path / "x", data)
        assert (tmp_path / "x").read_text(encoding="utf-8") == "é\n"


def test_a_held_lock_times_out_or_is_passed_by_a_cache(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ggufdesk")
    path = tmp_path / "cache.json"
    with locked(path):
        with pytest.raises(TimeoutError), locked(path, timeout=0.2):
            pass
        with locked(path, timeout=0.2, best_effort=True):  # a cache goes ahead, and says so
            write_atomic(path, "{}")
    assert path.read_text() == "{}" and "no lock on" in caplog.text


def test_a_folder_that_cannot_take_the_lock_file_fails_clearly_or_is_passed_by_a_cache(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(OSError), locked(blocker / "f.json"):
        pass
    with locked(blocker / "f.json", best_effort=True):
        pass


def test_threads_of_one_process_take_the_lock_in_turn(tmp_path):
    import threading

    path = tmp_path / "entries.json"
    write_atomic(path, "{}")

    def add(i: int) -> None:
        for j in range(10):
            with locked(path):
                data = json.loads(path.read_text())
                data[f"{i}.{j}"] = j
                write_atomic(path, json.dumps(data))
    threads = [threading.Thread(target=add, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(json.loads(path.read_text())) == 60
