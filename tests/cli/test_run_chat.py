"""`ggufdesk run` and `ggufdesk chat` go through the engine process and report what docs/architecture.md ("The CLI contract") promises."""
from __future__ import annotations

import io
import json
import subprocess
import sys

from ggufdesk.cli import build_parser
from ggufdesk.cli import chat as chat_cmd

KEYS = {"text", "tokens", "ttft_s", "prefill_tok_s", "decode_tok_s", "drafted", "accepted", "finish_reason"}


def ggufdesk(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ggufdesk", *argv], capture_output=True, text=True,
                          input=stdin, timeout=180)


def test_run_json(tiny_model):
    p = ggufdesk("run", str(tiny_model), "--prompt", "hello the cat", "--max-tokens", "7",
                 "--temperature", "0", "--ctx", "256", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert KEYS <= out.keys()
    assert out["tokens"] == 7 and out["finish_reason"] == "length"
    assert out["decode_tok_s"] > 0 and out["ttft_s"] > 0


def test_run_ends_its_text_with_a_newline(tiny_model):
    p = ggufdesk("run", str(tiny_model), "--prompt", "hello the cat", "--max-tokens", "5",
                 "--temperature", "0", "--ctx", "256")
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("\n") and not p.stdout.endswith("\n\n") and p.stdout.strip()
    assert p.stderr.startswith("[5 tokens")  # the figures on their own line, after the text


def test_run_bad_settings_and_bad_model_exit_cleanly(tiny_model, tmp_path):
    p = ggufdesk("run", str(tiny_model), "--prompt", "x", "--batch", "16", "--ubatch", "64")
    assert p.returncode == 1 and "micro-batch" in p.stderr and "Traceback" not in p.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope" * 10)
    p = ggufdesk("run", str(bad), "--prompt", "x", "--json")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "not a GGUF file" in json.loads(p.stdout)["error"]  # refused before the engine starts


def test_chat_keeps_the_conversation(tiny_model):
    args = build_parser().parse_args(["chat", str(tiny_model), "--ctx", "512", "--max-tokens", "5",
                                      "--temperature", "0"])
    out = io.StringIO()
    rc = chat_cmd.run(args, stdin=io.StringIO("hello\nthe cat\n/reset\n/exit\n"), stdout=out)
    text = out.getvalue()
    assert rc == 0
    assert text.count("tokens,") == 2 and "(conversation cleared)" in text
    assert "built-in turn format" in text  # the tiny model has no template
