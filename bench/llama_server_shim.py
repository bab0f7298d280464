#!/usr/bin/env python3
"""llama-server's command line as `ggufdesk serve`: what bench/llama_server_suite.py runs in llama-server's place.

llama.cpp's server test suite starts `llama-server --port P --temp T --model F --ctx-size N ...` for each
test; this maps each flag to ggufdesk's own (or drops one that changes nothing an answer depends on) and
execs `python -m ggufdesk serve`. A flag with no equivalent makes it exit 2 with the flag's name, so the
test fails rather than running under other settings. GGUFDESK_PYTHON names the interpreter (default:
this one); GGUFDESK_SERVE_FLAGS lists the flags `ggufdesk serve --help` offers (set by the harness), so
options that other work adds are used as soon as they exist.

Two defaults differ and are passed as ggufdesk's equivalent flags: llama-server without `--cors-origins`
answers CORS for any origin, so the shim passes `--cors-origin '*'` then (ggufdesk's own default is no
origin); `--cors-origins localhost` maps to `--cors-origin localhost` (the same keyword). llama-server's
/metrics is off unless `--metrics` (501), ggufdesk's on unless `--no-metrics`: without `--metrics` the
shim passes `--no-metrics`.
"""
from __future__ import annotations

import os
import sys

# llama-server flag -> ggufdesk serve flag (None: the value is the model path)
VALUED = {
    "--port": "--port", "--host": "--host", "--temp": "--temperature", "--seed": "--seed", "--model": None,
    "-m": None, "--alias": "--alias", "--ctx-size": "--ctx", "-c": "--ctx", "--batch-size": "--batch",
    "-b": "--batch", "--ubatch-size": "--ubatch", "-ub": "--ubatch", "--parallel": "--parallel", "-np": "--parallel",
    "--n-predict": "--max-tokens", "--threads": "--threads", "-t": "--threads", "--n-gpu-layers": "--gpu-layers",
    "-ngl": "--gpu-layers", "--api-key": "--api-key", "-fa": "--flash-attn", "--chat-template": "--chat-template",
    "--chat-template-file": "--chat-template-file", "--cors-origins": "--cors-origin", "-ctk": "--kv-type",
    "--tags": "--tags", "--reasoning": "--think",  # (on, off, auto: the same words)
}
# flags whose value changes nothing ggufdesk could honour differently (output format of reasoning: later)
IGNORED_VALUED = {"--reasoning-format"}
# switches that are ggufdesk's behaviour anyway (Jinja templates, a unified KV cache, embeddings on, no web UI)
IGNORED = {"--no-slots", "--jinja", "--no-jinja", "--cont-batching", "--embedding", "--embeddings", "--kv-unified",
           "--offline", "--verbose", "--no-ui", "--no-webui",
           "--metrics"}  # (see defaults(): without it, --no-metrics)
SWITCHES = {"--slots": "--slots", "--context-shift": "--context-shift"}


def translate(argv: list[str], offered: set[str]) -> list[str]:
    out: list[str] = []
    model = ""
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in IGNORED:
            i += 1
            continue
        if flag in SWITCHES:
            if SWITCHES[flag] not in offered:
                raise SystemExit(f"llama_server_shim: ggufdesk serve has no equivalent of {flag}")
            out.append(SWITCHES[flag])
            i += 1
            continue
        if flag in IGNORED_VALUED:
            i += 2
            continue
        if flag not in VALUED or i + 1 >= len(argv):
            raise SystemExit(f"llama_server_shim: ggufdesk serve has no equivalent of {flag}")
        value, target = argv[i + 1], VALUED[flag]
        i += 2
        if target is None:
            model = value
            continue
        if target not in offered:
            raise SystemExit(f"llama_server_shim: ggufdesk serve has no equivalent of {flag}")
        if flag == "--n-predict" and int(value) <= 0:
            value = str(1 << 20)  # -1: until the model stops or the context is full
        out += [target, value]
    out += defaults(argv, offered)
    return [model, *out] if model else out  # no model: ggufdesk serve's own default (llama-server's router mode)


def defaults(argv: list[str], offered: set[str]) -> list[str]:
    """llama-server's defaults where ggufdesk's differ: CORS for any origin, no /metrics."""
    out: list[str] = []
    if "--cors-origins" not in argv and "--cors-origin" in offered:
        out += ["--cors-origin", "*"]
    if "--metrics" not in argv and "--no-metrics" in offered:
        out.append("--no-metrics")
    return out


def main() -> None:
    offered = set(os.environ.get("GGUFDESK_SERVE_FLAGS", " ".join(set(VALUED.values()) - {None})).split())
    args = translate(sys.argv[1:], offered)
    python = os.environ.get("GGUFDESK_PYTHON", sys.executable)
    os.execv(python, [python, "-m", "ggufdesk", "serve", *args])


if __name__ == "__main__":
    main()
