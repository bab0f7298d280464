"""Does the thread count change what the model computes? And what does flash attention buy on the CPU?

The thread tuner (app/ggufdesk/engine/batching/threads.py) changes llama.cpp's thread count between
steps. Part 1 decodes the same chat prompt greedily for TOKENS steps at 1 thread and at 2, with flash
attention on and off, and prints whether the answers match and the first step whose logits differ in
any bit. Part 2 times, with flash attention on and off, the prompt (CONTEXT random tokens, in n_batch
chunks) and 48 decode steps after it, ROUNDS interleaved rounds, medians. Contexts as the engine makes
them (unified KV cache), 2 threads in part 2.

    .venv/bin/python bench/thread_bits.py [--model smollm2|starter|PATH] [--tokens 256] [--contexts 512,4096]
        [--rounds 4]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals
from spec_heldout import model_path

from ggufdesk.engine.batching.runner import fill_batch

FA = {"on": 1, "off": 0}
PROMPT = "How do I reverse a list in Python?"


def context(model, threads: int, fa: str, n_ctx: int):
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type, cp.n_outputs_max, cp.kv_unified = FA[fa], 1, True
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    return ctx


def chat_tokens(model) -> list[int]:
    tmpl = llama_cpp.llama_model_chat_template(model, None)
    vocab = llama_cpp.llama_model_get_vocab(model)
    text = PROMPT.encode()
    if tmpl:
        msg = llama_cpp.llama_chat_message(role=b"user", content=text)
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_chat_apply_template(tmpl, (llama_cpp.llama_chat_message * 1)(msg), 1, True, buf, 4096)
        if 0 < n <= 4096:
            text = buf.raw[:n]
    toks = (llama_cpp.llama_token * 512)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), toks, 512, True, True)
    return list(toks[:n])


def greedy(model, threads: int, fa: str, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Tokens and logits of a greedy answer of `steps` tokens."""
    ctx = context(model, threads, fa, 2048)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    b = internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1)
    fill_batch(b, [(t, i, 0, i == len(prompt) - 1) for i, t in enumerate(prompt)])
    toks, logits = [], []
    try:
        if llama_cpp.llama_decode(ctx, b.batch) != 0:
            raise SystemExit("llama_decode failed on the prompt")
        for pos in range(len(prompt), len(prompt) + steps):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
            toks.append(int(np.argmax(row)))
            logits.append(row)
            fill_batch(b, [(toks[-1], pos, 0, True)])
            if llama_cpp.llama_decode(ctx, b.batch) != 0:
                raise SystemExit("llama_decode failed")
    finally:
        llama_cpp.llama_free(ctx)
    return toks, logits


def speeds(model, n_ctx: int, rounds: int) -> dict[str, tuple[float, float]]:
    """fa -> (prefill tok/s, decode tok/s), medians of interleaved rounds."""
    ctxs = {f: context(model, 2, f, n_ctx + 64) for f in FA}
    b = internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1)
    prompt = [int(t) for t in np.random.default_rng(1).integers(1000, 20000, n_ctx)]
    got: dict[str, tuple[list[float], list[float]]] = {f: ([], []) for f in FA}
    for r in range(rounds):
        for f in (list(FA) if r % 2 else list(FA)[::-1]):
            ctx = ctxs[f]
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            t = time.perf_counter()
            for i in range(0, n_ctx, 512):
                fill_batch(b, [(tok, i + j, 0, i + j == n_ctx - 1) for j, tok in enumerate(prompt[i:i + 512])])
                if llama_cpp.llama_decode(ctx, b.batch) != 0:
                    raise SystemExit("llama_decode failed on the prompt")
            tp = time.perf_counter() - t
            t = time.perf_counter()
            for s in range(48):
                fill_batch(b, [(1234 + s, n_ctx + s, 0, True)])
                if llama_cpp.llama_decode(ctx, b.batch) != 0:
                    raise SystemExit("llama_decode failed")
            got[f][0].append(n_ctx / tp)
            got[f][1].append(48 / (time.perf_counter() - t))
    for ctx in ctxs.values():
        llama_cpp.llama_free(ctx)
    return {f: (statistics.median(p), statistics.median(d)) for f, (p, d) in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    try:
        contexts = [int(c) for c in args.contexts.split(",") if c]
    except ValueError:
        ap.error("--contexts is a comma-separated list of token counts")
    if not 1 <= args.tokens <= 1500 or args.rounds < 1 or any(not 64 <= c <= 32768 for c in contexts):
        ap.error("--tokens 1-1500, --rounds >= 1, each context 64-32768")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(model_path(args.model).encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    prompt = chat_tokens(model)
    print(f"part 1: {len(prompt)} prompt tokens, {args.tokens} greedy steps")
    for fa in FA:
        (a, la), (b, lb) = greedy(model, 1, fa, prompt, args.tokens), greedy(model, 2, fa, prompt, args.tokens)
        first = next((i for i, (x, y) in enumerate(zip(la, lb)) if not np.array_equal(x, y)), None)
        where = "none" if first is None else f"step {first} ({len(prompt) + first} cells)"
        print(f"  flash attention {fa:3}: answers at 1 and 2 threads {'match' if a == b else 'differ'}; "
              f"first logits that differ: {where}")
    print(f"part 2: 2 threads, {args.rounds} rounds")
    for n in contexts:
        got = speeds(model, n, args.rounds)
        (pon, don), (poff, doff) = got["on"], got["off"]
        print(f"  {n} tokens: prefill {pon:.0f} / {poff:.0f} tok/s, decode {don:.1f} / {doff:.1f} tok/s "
              f"(flash attention on / off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
