"""Planner accuracy: predicted vs measured RAM (llama.cpp's buffers and the process's RSS) and decode tok/s.

Run: .venv/bin/python bench/planner.py [--quick]
Each case loads the model in a fresh subprocess (mmap off, the engine's own load path), reads
llama.cpp's reported buffer sizes, the RSS growth after a prefill + decode, and the decode speed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def worker(path: str, n_ctx: int, n_ubatch: int, prompt_len: int, n_decode: int, flash: str) -> dict:
    """Load, prefill prompt_len tokens, decode n_decode greedy tokens; report memory and speed."""
    import ctypes

    import llama_cpp
    import numpy as np

    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine import native

    llama_cpp.llama_backend_init()
    log = native.LlamaLog(maxlen=100000)
    r0 = rss()
    s = LoadSettings(n_ctx=n_ctx, n_batch=max(512, n_ubatch), n_ubatch=n_ubatch, use_mmap=False,
                     n_threads=2, n_threads_batch=2, flash_attn=flash)
    # the engine's load path, with mmap really off: this llama.cpp build replaced use_mmap by load_mode
    real_defaults = llama_cpp.llama_model_default_params

    def no_mmap_defaults():
        p = real_defaults()
        p.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        return p

    llama_cpp.llama_model_default_params = no_mmap_defaults
    lm = native.load_model(path, s, log)
    r_load = rss()
    ctx = lm.ctx.ctx
    n_vocab = lm.n_vocab
    rng = np.random.default_rng(0)
    toks = rng.integers(10, min(n_vocab, 250), size=prompt_len).astype(np.int32)
    t0 = time.perf_counter()
    for i in range(0, prompt_len, s.n_batch):
        chunk = toks[i:i + s.n_batch]
        arr = (llama_cpp.llama_token * len(chunk))(*chunk.tolist())
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
        assert rc == 0, rc
    t_prefill = time.perf_counter() - t0
    tok = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))))
    one = (llama_cpp.llama_token * 1)()
    times = []
    for _ in range(n_decode):
        one[0] = tok
        t = time.perf_counter()
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        tok = int(np.argmax(logits))
        times.append(time.perf_counter() - t)
        assert rc == 0, rc
    r_end = rss()
    times.sort()
    med = times[len(times) // 2]
    lines = log.since(0)
    flash_on = any("flash_attn" in ln and "enabled" in ln for ln in lines)
    return {"memory": lm.memory, "rss_load": r_load - r0, "rss_end": r_end - r0,
            "prefill_tok_s": prompt_len / t_prefill, "decode_tok_s": 1 / med, "flash_on": flash_on,
            "log_tail": [ln for ln in lines if "buffer size" in ln or "cells" in ln]}
