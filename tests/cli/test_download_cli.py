"""`ggufdesk download` / `ggufdesk library`: the JSON shape, errors, split models, and a real process via HF_ENDPOINT."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ggufdesk.cli import main
from tests.hubserver import Fault, write_blob


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def test_download_json(capsys, hub, tiny_model):
    commit = hub.add_repo("org/tiny-GGUF", {"tiny-F32.gguf": tiny_model})
    rc, d = run_json(capsys, "download", "org/tiny-GGUF", "tiny-F32.gguf")
    assert rc == 0
    assert d["sha256"] == sha(tiny_model) and d["bytes"] == tiny_model.stat().st_size
    assert d["repo"] == "org/tiny-GGUF" and d["file"] == "tiny-F32.gguf" and d["revision"] == commit
    assert sha(d["path"]) == d["sha256"]
    rc, d2 = run_json(capsys, "download", "org/tiny-GGUF", "tiny-F32.gguf", "--revision", commit, "--offline")
    assert rc == 0 and d2["path"] == d["path"] and d2["from_cache"]


def test_download_split_model_fetches_every_part_and_lists(capsys, hub, tmp_path):
    parts = {f"M-Q4_0-{i:05d}-of-00002.gguf": write_blob(tmp_path / f"p{i}", 70_000 + i, seed=i) for i in (1, 2)}
    hub.add_repo("org/split", parts)
    rc, d = run_json(capsys, "download", "org/split", "M-Q4_0-00001-of-00002.gguf")
    assert rc == 0 and len(d["parts"]) == 2 and d["bytes"] == 140_003
    assert [sha(p["path"]) for p in d["parts"]] == [sha(p) for p in parts.values()]
    rc, listing = run_json(capsys, "download", "org/split")
    assert listing["models"] == [{"name": "M-Q4_0", "quant": "Q4_0", "bytes": 140_003, "files": sorted(parts)}]


def test_download_errors_are_plain_json(capsys, hub, tiny_model):
    hub.add_repo("org/gated", {"g.gguf": tiny_model}, gated=True)
    rc, d = run_json(capsys, "download", "org/gated", "g.gguf")
    assert rc == 1 and "gated" in d["error"] and d["kind"] == "KnownError"
    rc, d = run_json(capsys, "download", "org/gated", "../../etc/passwd")
    assert rc == 1 and "escape" in d["error"]


def test_library_add_and_list(capsys, hub, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    rc, d = run_json(capsys, "library", "--add", str(tiny_model))
    added = [m for m in d["models"] if m["source"] != "starter"]  # the starters come first
    assert rc == 0 and [m["source"] for m in added] == ["user"]
    assert added[0]["path"] == str(tiny_model.resolve()) and added[0]["id"] == "tiny-target"
    assert main(["library"]) == 0 and "tiny-target.gguf" in capsys.readouterr().out


def test_cli_process_killed_mid_download_resumes_via_hf_endpoint(hub, tmp_path):
    """A fresh process reads HF_ENDPOINT at import (the plain env var is all it needs); SIGKILL, then resume."""
    blob = write_blob(tmp_path / "b.gguf", 3_000_000, seed=3)
    hub.add_repo("org/env", {"b-Q8_0.gguf": blob})
    hub.faults.add(Fault(file="b-Q8_0.gguf", stall_at=2_500_000, stall_s=60))
    env = {**os.environ, "HF_ENDPOINT": hub.url}
    cmd = [sys.executable, "-m", "ggufdesk", "download", "org/env", "b-Q8_0.gguf", "--json"]
    partial = Path(os.environ["HF_HOME"]) / "hub" / "models--org--env" / "blobs" / (
        hub.sha256("org/env", "b-Q8_0.gguf") + ".incomplete")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size >= 2 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()  # a crash: no cleanup runs
    proc.communicate()
    kept = partial.stat().st_size
    assert kept >= 2 << 20
    hub.faults.clear()
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    d = json.loads(second.stdout)
    assert second.returncode == 0 and d["sha256"] == sha(blob) and d["resumed_from"] == kept
    assert hub.ranges("b-Q8_0.gguf")[-1] == kept
