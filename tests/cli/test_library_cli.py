"""`ggufdesk library [--json]` lists ids and capabilities; every command takes a library id; no MODEL is the chat starter."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ggufdesk.cli import main
from ggufdesk.core import hardware, library, starter


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: 20.0)
    monkeypatch.setattr(hardware, "measure_cpu_gflops", lambda *a, **k: 100.0)


def test_library_lists_the_starters_by_id_not_no_models(capsys, tmp_path, monkeypatch, tiny_chatml):
    monkeypatch.setenv("HOME", str(tmp_path))
    library.add_path(tiny_chatml)
    assert main(["library"]) == 0
    out = capsys.readouterr().out
    assert "no local models" not in out
    assert "smollm2-135m-instruct" in out and "gemma-3-270m" in out and "tiny-chatml" in out
    assert main(["library", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    chat = rows["smollm2-135m-instruct"]
    assert chat["source"] == "starter" and chat["quant"] == "Q4_1" and chat["size"] == 98_362_432
    assert chat["capabilities"] == {"chat_template": True, "tools": False, "embedding": False,
                                  "vision": False}
    assert chat["architecture"] == "llama" and chat["parameters"] > 100_000_000
    assert rows["tiny-chatml"]["capabilities"]["chat_template"] is True
    assert {"id", "path", "name", "size", "source", "quant", "parts", "context_length"} <= set(rows["tiny-chatml"])


def test_library_says_how_to_get_a_model_when_there_is_none(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(starter, "installed", lambda: [])
    assert main(["library"]) == 0
    assert "no local models yet" in capsys.readouterr().out


def test_plan_and_recommend_take_a_library_id_and_default_to_the_chat_starter(capsys):
    assert main(["plan", "smollm2-135m-instruct", "--json"]) == 0
    by_id = json.loads(capsys.readouterr().out)
    assert by_id["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and by_id["fit"] == "cpu"
    assert main(["plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == by_id["model"]
    assert main(["recommend", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["repo"] == "smollm2-135m-instruct" and rec["recommended"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert main(["plan", "no-such-model", "--json"]) == 1
    assert "smollm2-135m-instruct" in json.loads(capsys.readouterr().out)["error"]  # the error lists the ids


def test_run_with_no_model_chats_with_the_chat_starter(chat_starter):
    p = subprocess.run([sys.executable, "-m", "ggufdesk", "run", "--chat", "--prompt", "Say hello.",
                        "--max-tokens", "8", "--temperature", "0", "--ctx", "512", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["model"] == str(chat_starter) and out["chat_format"] == "template" and out["tokens"] > 0


def test_run_takes_a_library_id(tiny_model, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    library.add_path(tiny_model)
    p = subprocess.run([sys.executable, "-m", "ggufdesk", "run", "tiny-target", "--prompt", "the cat",
                        "--max-tokens", "3", "--temperature", "0", "--ctx", "256", "--json"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["model"] == str(tiny_model.resolve())


def test_run_uses_the_models_preset_and_a_flag_wins_over_it(tiny_model, tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("HOME", str(tmp_path))
    library.add_path(tiny_model)
    settings = tmp_path / "cfg" / "ggufdesk" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"presets": {"tiny-target": {"sampling": {"max_tokens": 3, "temperature": 0},
                                                                "load": {"n_ctx": 256}}}}))
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}

    def run(*extra: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "ggufdesk", "run", "tiny-target", "--prompt", "the cat", *extra,
                            "--json"], capture_output=True, text=True, timeout=180, env=env)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    assert run()["tokens"] == 3
    assert run("--max-tokens", "5")["tokens"] == 5
    settings.write_text("{broken")
    p = subprocess.run([sys.executable, "-m", "ggufdesk", "run", "tiny-target", "--prompt", "x", "--max-tokens", "1",
                        "--json"], capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0 and "presets not used" in p.stderr  # a broken settings file never stops a run
