"""What a prompt token adds to a step, by the step's rows and the token's position (engine/batching/chunking.py).

In-process, low-level: N decode rows (short sequences, as streams beside a prompt are) plus n prompt
rows of another sequence at positions p..p+n-1 (its earlier p tokens already in the KV cache), in one
llama_decode; every shape is timed in rounds, interleaved, and the median kept. Printed per depth p: the
plain step (the N rows alone) and for each n the step over the plain one and the milliseconds one prompt
token added. The prompt rows ask for no logits (a chunk in the middle of a prompt).

    .venv/bin/python bench/chunk_shape.py [MODEL] [--decode 1] [--depths 0,3000,8000,16000]
        [--chunks 1,4,8,16,31,63,127] [--rounds 5]

(default model: SmolLM2-135M-Instruct; 2 threads, a 32,768-cell context as `ggufdesk serve --ctx 32768`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import llama_cpp
from llama_cpp import _internals as internals

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggufdesk.core import starter
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.batching.runner import fill_batch
from ggufdesk.engine.runtime.native import LlamaLog, load_model

PROMPT_SEQ = 7


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--decode", type=int, default=1, help="decode rows beside the prompt's")
    ap.add_argument("--depths", default="0,3000,8000,16000")
    ap.add_argument("--chunks", default="1,4,8,16,31,63,127")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    model = args.model or str(starter.model_path(starter.SMOLLM2))
    depths = [int(x) for x in args.depths.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    nd = args.decode
    assert nd < PROMPT_SEQ
    lm = load_model(model, LoadSettings(n_ctx=32768, n_parallel=8, n_threads=2, n_threads_batch=2), LlamaLog())
    ctx, mem = lm.ctx.ctx, llama_cpp.llama_get_memory(lm.ctx.ctx)
    batch = internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1)
    print(f"model {Path(model).name}; {nd} decode rows; load average at start {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs", flush=True)

    def decode(rows: list[tuple[int, int, int, bool]]) -> float:
        fill_batch(batch, rows)
        t = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch.batch) != 0:
            raise SystemExit("llama_decode failed")
        return time.perf_counter() - t

    for s in range(nd):  # the streams: 20 tokens each
        decode([(100 + i, i, s, i == 19) for i in range(20)])
    done = 0
    try:
        for p in depths:
            while done < p:  # the prompt's earlier tokens, once
                n = min(512, p - done)
                decode([(200 + (done + i) % 5000, done + i, PROMPT_SEQ, False) for i in range(n)])
                done += n
            times: dict[int, list[float]] = {}
            for _ in range(args.rounds):
                for n in [0, *chunks]:
                    rows = [(300 + s, 20, s, True) for s in range(nd)]
                    rows += [(400 + i, p + i, PROMPT_SEQ, False) for i in range(n)]
                    times.setdefault(n, []).append(decode(rows))
                    for s in range(nd):  # back to where they were
                        llama_cpp.llama_memory_seq_rm(mem, s, 20, -1)
                    llama_cpp.llama_memory_seq_rm(mem, PROMPT_SEQ, p, -1)
            base = statistics.median(times[0])
            cells = []
            for n in chunks:
                t = statistics.median(times[n])
                cells.append(f"{n}: {t / base:.1f}x {1000 * (t - base) / n:.1f} ms")
            print(f"position {p:>6}: plain {1000 * base:.1f} ms | " + " | ".join(cells), flush=True)
    finally:
        lm.close()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
