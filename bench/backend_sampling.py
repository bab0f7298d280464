"""Greedy sampling inside llama.cpp's graph against the engine's way: logits copied out, argmax in numpy.

The engine samples a greedy row by reading its logits (llama.cpp copies every logits row out of the
graph: a megabyte a row for Gemma 3's 262,144-word vocabulary) and taking numpy's argmax
(app/ggufdesk/engine/batching/sampling.py). This llama.cpp can instead sample in the graph: a greedy
sampler chain attached to a sequence (`llama_set_sampler`, with `n_outputs_max_per_seq` raised so a
verification batch may sample every draft row) adds an argmax to the graph, and `llama_get_sampled_token_ith`
returns the token. Two contexts on one model, one with the samplers and one without, the same prompt
(400 tokens) in each of four sequences; every case is a decode of SEQS x ROWS rows, all with logits,
then rolled back. Both ways must give the same tokens (checked every round); their times are
interleaved, the order flipped every round, the medians printed with their ratio.

    .venv/bin/python bench/backend_sampling.py [--model starter|smollm2|PATH] [--rounds 15]
        [--cases 1x1,1x4,4x1,4x4,1x16,4x5] [--threads 2]
"""
from __future__ import annotations

import argparse
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

CONTEXT = 400  # tokens each sequence holds while the cases run (a prompt of the suites' size)
SEQS = 4


class Way:
    """One context: greedy in the graph (backend) or logits copied out and argmax'd in numpy."""

    def __init__(self, model, threads: int, *, backend: bool) -> None:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 4096, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.n_outputs_max = cp.n_outputs_max_per_seq = 32
        cp.n_seq_max, cp.kv_unified = SEQS, True
        self.ctx = llama_cpp.llama_init_from_model(model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp could not create a context")
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.backend = backend
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.batch = internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1)
        prompt = [int(t) for t in np.random.default_rng(0).integers(1000, 20000, CONTEXT)]
        for s in range(SEQS):
            fill_batch(self.batch, [(t, i, s, False) for i, t in enumerate(prompt)])
            if llama_cpp.llama_decode(self.ctx, self.batch.batch) != 0:
                raise SystemExit("llama_decode failed on the prompt")
        if backend:  # a chain is initialised once: attach each for good (detaching and reattaching aborts)
            for s in range(SEQS):
                chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
                llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
                if not llama_cpp.llama_set_sampler(self.ctx, s, chain):
                    raise SystemExit("llama_set_sampler refused a greedy chain")

    def run(self, seqs: int, rows: int) -> tuple[float, list[int]]:
        """Seconds of one decode of seqs x rows rows (all with logits) and its sampling; the tokens."""
        items = [(2000 + 7 * i + s, CONTEXT + i, s, True) for s in range(seqs) for i in range(rows)]
        fill_batch(self.batch, items)
        t = time.perf_counter()
        if llama_cpp.llama_decode(self.ctx, self.batch.batch) != 0:
            raise SystemExit("llama_decode failed")
        if self.backend:
            toks = [llama_cpp.llama_get_sampled_token_ith(self.ctx, i) for i in range(len(items))]
        else:
            toks = [int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i),
                                                        shape=(self.n_vocab,)))) for i in range(len(items))]
        dt = time.perf_counter() - t
        for s in range(seqs):
            llama_cpp.llama_memory_seq_rm(self.mem, s, CONTEXT, -1)
        return dt, toks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="starter")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cases", default="1x1,1x4,4x1,4x4,1x16,4x5", help="SEQSxROWS, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    try:
        cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    except ValueError:
        ap.error("--cases is SEQSxROWS,... e.g. 4x4")
    if args.rounds < 1 or any(len(c) != 2 or not 1 <= c[0] <= SEQS or not 1 <= c[1] <= 32 // c[0] for c in cases):
        ap.error(f"--rounds >= 1; each case 1-{SEQS} sequences of at most 32 rows in all")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(model_path(args.model).encode(),
                                                 llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    ways = [Way(model, args.threads, backend=False), Way(model, args.threads, backend=True)]
    times: dict[tuple, list[float]] = {(c, w.backend): [] for c in cases for w in ways}
    seen: dict[tuple, list[int]] = {}
    for rnd in range(args.rounds + 1):  # round 0 warms every shape up
        for w in (ways if rnd % 2 else ways[::-1]):
            for c in cases:
                w.run(*c)  # this shape once after the other context's: both pay the switch alike
                dt, seen[(c, w.backend)] = w.run(*c)
                if rnd:
                    times[(c, w.backend)].append(dt)
        if any(seen[(c, False)] != seen[(c, True)] for c in cases):
            raise SystemExit(f"round {rnd}: the two ways sampled different tokens")
    for c in cases:
        a, b = statistics.median(times[(c, False)]), statistics.median(times[(c, True)])
        print(f"{c[0]} seqs x {c[1]} rows: logits + numpy argmax {a * 1e3:.2f} ms, greedy in the graph "
              f"{b * 1e3:.2f} ms, in the graph / numpy {b / a:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
