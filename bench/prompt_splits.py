"""How much a prompt's logits depend on how it was split into llama_decode calls: the same tokens at
the same positions, read in one batch or as a cached first token plus the rest, or the rest plus a
last token alone (what a prefix cache, a chunked prefill and a verification batch each do).

In exact arithmetic every split gives the same logits. llama.cpp's CPU kernels do not: the weights
repacked for the CPU (its "extra buffer types", e.g. Q4_K as 8x8 blocks on AVX2) are multiplied by a
many-row kernel and a one-row kernel that round differently, and flash attention sums in chunks that
follow the batch. On the starter (Gemma 3 270M Q4_K_M) greedy answers of plain decoding itself leave
each other where a near-tie meets that noise; SmolLM2-135M's Q4_1 is not repacked. For each split this
prints, against the one-batch read: the largest log-probability change among the ten likeliest next
tokens, the KL divergence of the next-token distribution, and the first token where a greedy answer
(decoded one token a step after the prompt) leaves the one-batch read's. `--no-repack` loads the
weights as they are in the file (`use_extra_bufts` off), to show the repacked kernels' share.

    .venv/bin/python bench/prompt_splits.py [MODEL] [--tokens 64] [--threads 2] [--no-repack] [--flash-attn on|off]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals

from ggufdesk.core.starter import starter_model_path

PROMPT = ("Rename the key \"port\" to \"listen_port\" in this configuration and return all of it:\n"
          "{\n  \"server\": {\"host\": \"0.0.0.0\", \"port\": 8080, \"workers\": 4},\n"
          "  \"cache\": {\"dir\": \"/var/cache/app\", \"max_mb\": 512},\n"
          "  \"log\": {\"level\": \"info\", \"file\": \"/var/log/app.log\"}\n}\n")


class Reader:
    def __init__(self, model: str, threads: int, repack: bool, flash_attn: bool) -> None:
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = repack
        self.model = internals.LlamaModel(path_model=model, params=mp, verbose=False)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 4096, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = 1 if flash_attn else 0
        self.ctx = internals.LlamaContext(model=self.model, params=cp, verbose=False)
        self.mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model.model))
        self.batch = internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1)

    def decode(self, tokens: list[int], p0: int) -> np.ndarray:
        """The tokens at positions p0..; the last one's next-token log-probabilities."""
        b = self.batch.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p0 + i, 1, i == len(tokens) - 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        if llama_cpp.llama_decode(self.ctx.ctx, b) != 0:
            raise SystemExit("llama_decode failed")
        x = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx.ctx, -1), shape=(self.n_vocab,))
        x = x.astype(np.float64)
        return x - x.max() - np.log(np.exp(x - x.max()).sum())

    def read(self, prompt: list[int], parts: list[int], n_gen: int) -> tuple[np.ndarray, list[int]]:
        """The prompt read in calls of `parts` tokens from an empty cache; then a greedy answer."""
        llama_cpp.llama_memory_clear(self.mem, True)
        p = 0
        lp = np.zeros(0)
        for n in parts:
            lp = self.decode(prompt[p:p + n], p)
            p += n
        first, out = lp, []
        for _ in range(n_gen):
            out.append(int(lp.argmax()))
            lp = self.decode(out[-1:], p)
            p += 1
        return first, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-repack", action="store_true")
    ap.add_argument("--flash-attn", choices=("on", "off"), default="on")
    args = ap.parse_args()
    model = args.model or str(starter_model_path())
    r = Reader(model, args.threads, not args.no_repack, args.flash_attn == "on")
    prompt = r.model.tokenize(PROMPT.encode(), True, False)
    n = len(prompt)
    base, answer = r.read(prompt, [n], args.tokens)
    print(f"{Path(model).name}: {n} prompt tokens, repack {'off' if args.no_repack else 'on'}, "
          f"flash attention {args.flash_attn}, {args.threads} threads; against one batch of {n}:")
    top = np.argsort(-base)[:10]
    for parts in ([1, n - 1], [n // 2, n - n // 2], [n - 1, 1], [n]):
        lp, out = r.read(prompt, parts, args.tokens)
        kl = float((np.exp(base) * (base - lp)).sum())
        left = next((i for i, (a, b) in enumerate(zip(answer, out)) if a != b), None)
        change = np.abs(base[top] - lp[top]).max()
        where = "the same" if left is None else f"leaves at token {left}"
        print(f"  split {'+'.join(map(str, parts)):>9}: top-10 log-prob change {change:.4f}, KL {kl:.2e}, "
              f"greedy answer {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
