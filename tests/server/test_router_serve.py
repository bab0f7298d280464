"""`ggufdesk serve A B ...` with the real engine: two tiny models and the two starters, presets, a broken file, a storm."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.fixtures import ggufs
from tests.server.serving import ROOT, ServeProcess


def copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model, tiny_chatml) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("served")
    return {"tiny-a": copy(tiny_model, d / "tiny-a.gguf"), "tiny-b": copy(tiny_chatml, d / "tiny-b.gguf")}


def chat(url: str, model: str, **kw) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello cat"}], "max_tokens": 3, **kw}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=300)


def listed(url: str) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(url + "/v1/models").json()["data"]}


def engines(server: ServeProcess) -> list[psutil.Process]:
    """The server's engine processes that are running (not any other child a library may start)."""
    try:
        kids = psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [k for k in kids if _running(k) and _is_engine(k)]


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_engine(p: psutil.Process) -> bool:
    try:
        return "ggufdesk.engine" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def wait_until(pred, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


@pytest.mark.slow
def test_two_tiny_models_and_the_two_starters_answer_by_name(models, chat_starter, starter_model, tmp_path):
    s = ServeProcess([models["tiny-a"], models["tiny-b"], "smollm2-135m-instruct", "gemma-3-270m"],
                     "--ctx", "512", "--temperature", "0", "--max-loaded", "2", home=tmp_path)
    try:
        assert "4 models" in s.output[-1] and "loaded when a request names one" in s.output[-1]
        assert set(listed(s.url)) == {"tiny-a", "tiny-b", "smollm2-135m-instruct", "gemma-3-270m"}
        assert engines(s) == []  # nothing loaded until asked
        for model in ("tiny-a", "smollm2-135m-instruct", "tiny-b", "gemma-3-270m", "tiny-a", "smollm2-135m-instruct"):
            r = chat(s.url, model)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model and r.json()["usage"]["completion_tokens"] >= 1
            assert len(engines(s)) <= 2
        states = {i: m["state"] for i, m in listed(s.url).items()}
        assert sorted(i for i, st in states.items() if st == "ready") == ["smollm2-135m-instruct", "tiny-a"]
        ps = subprocess.run([sys.executable, "-m", "ggufdesk", "ps", "--url", s.url, "--json"], capture_output=True,
                            text=True, timeout=60, cwd=str(ROOT))
        assert ps.returncode == 0, ps.stderr
        shown = {m["id"]: m for m in json.loads(ps.stdout)["models"]}
        assert set(shown) == {"smollm2-135m-instruct", "tiny-a"}
        assert shown["smollm2-135m-instruct"]["ram_bytes"] > 50 << 20 and shown["tiny-a"]["expires_at"] > time.time()
        text = subprocess.run([sys.executable, "-m", "ggufdesk", "ps", "--url", s.url], capture_output=True,
                              text=True, timeout=60, cwd=str(ROOT)).stdout
        assert "smollm2-135m-instruct" in text and "MiB" in text and "tiny-b" not in text
    finally:
        s.stop()


PRESETS = {"tiny-a": {"load": {"n_ctx": 256}, "sampling": {"max_tokens": 5, "temperature": 0},
                      "system_prompt": "Be brief. " * 12},
           # greedy: sampled at the server's default temperature the random tiny model ended its answer
           # after 5 tokens once, which read as tiny-a's preset (of 400 sampled answers, 3 ended early
           # with finish_reason "stop", at 5 and 6 tokens)
           "tiny-b": {"load": {"n_ctx": 768}, "sampling": {"max_tokens": 7, "temperature": 0}}}


def test_presets_apply_to_jit_loads(models, tmp_path):
    settings = tmp_path / "xdg_config_home" / "ggufdesk" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"presets": PRESETS}))
    s = ServeProcess([models["tiny-a"], models["tiny-b"]], home=tmp_path)
    try:
        body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hello cat"}]}
        r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=120).json()
        assert r["usage"]["completion_tokens"] == 5  # the preset's max_tokens
        own = httpx.post(s.url + "/v1/chat/completions", timeout=120, json={
            **body, "messages": [{"role": "system", "content": "x"}, *body["messages"]]}).json()
        assert r["usage"]["prompt_tokens"] > own["usage"]["prompt_tokens"] + 20  # the preset's system prompt
        b = httpx.post(s.url + "/v1/chat/completions", json={**body, "model": "tiny-b"}, timeout=120).json()
        assert b["usage"]["completion_tokens"] == 7
        assert {i: m["n_ctx"] for i, m in listed(s.url).items()} == {"tiny-a": 256, "tiny-b": 768}
    finally:
        s.stop()


def test_flags_given_to_serve_win_over_presets(models):
    from ggufdesk.cli import build_parser
    from ggufdesk.cli.serve import entries_for
    from ggufdesk.core.settings import Preset

    presets = {k: Preset.from_dict(v) for k, v in PRESETS.items()}
    argv = ["serve", str(models["tiny-a"]), str(models["tiny-b"])]
    plain = {e.id: e for e in entries_for(build_parser().parse_args(argv), presets)}
    assert plain["tiny-a"].load.n_ctx == 256 and plain["tiny-b"].load.n_ctx == 768
    assert plain["tiny-a"].sampling == {"max_tokens": 5, "temperature": 0}
    assert plain["tiny-a"].system_prompt.startswith("Be brief.") and plain["tiny-b"].system_prompt is None
    flagged = {e.id: e for e in entries_for(build_parser().parse_args([*argv, "--ctx", "512", "--max-tokens", "2"]),
                                             presets)}
    assert flagged["tiny-a"].load.n_ctx == flagged["tiny-b"].load.n_ctx == 512
    assert flagged["tiny-a"].sampling == {"temperature": 0} and flagged["tiny-b"].sampling == {"temperature": 0}


def test_a_broken_file_fails_only_its_requests_and_an_idle_engine_goes_away(models, tmp_path):
    broken = ggufs.write_truncated(tmp_path / "tiny-broken.gguf", models["tiny-a"], 0.6)
    s = ServeProcess([models["tiny-a"], broken], "--ctx", "256", "--idle-unload", "2", home=tmp_path)
    try:
        results: dict[str, list[int]] = {"tiny-a": [], "tiny-broken": []}
        threads = [threading.Thread(target=lambda m=m: results[m].append(chat(s.url, m).status_code))
                   for m in ("tiny-a", "tiny-broken") * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert results == {"tiny-a": [200, 200], "tiny-broken": [500, 500]}
        err = chat(s.url, "tiny-broken").json()["error"]
        assert err["code"] == "model_load_failed" and "tiny-broken" in err["message"]
        assert httpx.get(s.url + "/health").status_code == 200
        (engine,) = engines(s)
        assert engine.memory_info().rss > 0
        wait_until(lambda: listed(s.url)["tiny-a"]["state"] == "unloaded")  # --idle-unload 2
        wait_until(lambda: engines(s) == [])  # the engine process, and its memory, are gone
    finally:
        s.stop()


def test_a_storm_over_five_models_with_two_loaded_at_most_leaves_no_engine_behind(tiny_model, tmp_path):
    d = tmp_path / "five"
    d.mkdir()
    paths = [copy(tiny_model, d / f"storm-{i}.gguf") for i in range(5)]
    s = ServeProcess(paths, "--ctx", "256", "--max-loaded", "2", "--parallel", "4", home=tmp_path)
    seen: set[int] = set()
    most = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            now = engines(s)
            seen.update(p.pid for p in now)
            most[0] = max(most[0], len(now))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    codes: list[int] = []
    try:
        def one(i: int) -> None:
            r = chat(s.url, f"storm-{i % 5}", max_tokens=2)
            codes.append(r.status_code)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert len(codes) == 50 and set(codes) <= {200, 503} and codes.count(200) >= 10
        assert most[0] <= 2
    finally:
        done.set()
        watcher.join(5)
        s.stop()
    assert s.proc.returncode is not None
    left = [pid for pid in seen if psutil.pid_exists(pid) and _running(psutil.Process(pid))]
    assert left == []  # no orphan engine
