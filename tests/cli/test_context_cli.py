"""`run --context-overflow` (and what run --json says it dropped or found cached), `ggufdesk cache [--clear]`."""
from __future__ import annotations

import io
import json
import os
import string
import subprocess
import sys

from ggufdesk.cli import build_parser
from ggufdesk.cli import chat as chat_cmd
from ggufdesk.cli.run import settings_from_args

LONG = " ".join(["the cat"] * 200)


def ggufdesk(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ggufdesk", *argv], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})})


def test_run_refuses_by_default_and_rolls_when_asked(tiny_model):
    base = ("run", str(tiny_model), "--prompt", LONG, "--max-tokens", "4", "--temperature", "0", "--ctx", "256")
    refused = ggufdesk(*base, "--json")
    assert refused.returncode == 1 and "context" in json.loads(refused.stdout)["error"]
    rolled = ggufdesk(*base, "--json", "--context-overflow", "rolling")
    assert rolled.returncode == 0, rolled.stderr
    out = json.loads(rolled.stdout)
    assert out["context_overflow"] == "rolling" and out["truncated_tokens"] > 0 and out["tokens"] == 4
    said = ggufdesk(*base, "--context-overflow", "truncate-middle")
    assert said.returncode == 0 and "tokens no longer fit the 256-token context" not in said.stdout
    assert "was left out to fit the 256-token context" in said.stderr  # said on stderr, not in the text


def test_the_overflow_default_is_the_commands_then_a_preset_then_the_flag():
    from ggufdesk.core.settings import Preset

    def policy(*argv: str, preset: Preset | None = None) -> str:
        return settings_from_args(build_parser().parse_args(list(argv)), preset)[1].context_overflow

    rolling = Preset(sampling={"context_overflow": "rolling"})
    assert policy("run", "m", "--prompt", "x") == "error" and policy("serve", "m") == "error"
    assert policy("chat", "m") == "rolling" and policy("run", "m", "--prompt", "x", preset=rolling) == "rolling"
    assert policy("chat", "m", "--context-overflow", "shift", preset=rolling) == "shift"


def test_chat_rolls_by_default(tiny_model):
    args = build_parser().parse_args(["chat", str(tiny_model), "--ctx", "256", "--max-tokens", "4",
                                      "--temperature", "0"])
    assert settings_from_args(args)[1].context_overflow == "rolling"  # (a flag or the model's preset wins)
    out = io.StringIO()
    lines = "\n".join(f"{i} {LONG[:300]}" for i in range(4)) + "\n/exit\n"
    assert chat_cmd.run(args, stdin=io.StringIO(lines), stdout=out) == 0
    text = out.getvalue()
    assert text.count("tokens,") == 4 and "no longer fit the 256-token context" in text
    assert "error" not in text


def test_cache_lists_and_clears(tiny_model, tmp_path):
    env = {"GGUFDESK_PROMPT_CACHE": str(tmp_path / "pc")}
    empty = json.loads(ggufdesk("cache", "--json", env=env).stdout)
    assert empty["entries"] == [] and empty["bytes"] == 0 and empty["max_bytes"] == 4 << 30
    prompt = " ".join(string.ascii_lowercase[i * 7 % 26] for i in range(300))  # 301 tokens
    run = ggufdesk("run", str(tiny_model), "--prompt", prompt, "--max-tokens", "2", "--ctx", "1024", "--json",
                   env=env)
    assert run.returncode == 0, run.stderr
    listed = json.loads(ggufdesk("cache", "--json", env=env).stdout)
    (entry,) = listed["entries"]
    assert entry["tokens"] >= 256 and entry["model"] == str(tiny_model) and entry["type_k"] == "f16"
    assert listed["bytes"] == entry["bytes"] > 0
    again = json.loads(ggufdesk("run", str(tiny_model), "--prompt", prompt, "--max-tokens", "2", "--ctx", "1024",
                                "--json", env=env).stdout)
    assert again["cached_tokens"] >= entry["tokens"] - 2  # a new process: from the disk
    human = ggufdesk("cache", env=env).stdout
    assert "1 entries" in human and "tiny-target.gguf" in human
    cleared = json.loads(ggufdesk("cache", "--clear", "--json", env=env).stdout)
    assert cleared["cleared"]["files"] == 1 and cleared["entries"] == []
