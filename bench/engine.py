"""Engine speed: `ggufdesk run`'s path (engine process) vs llama-cpp-python's high-level API in-process.

Same model, same threads and batch sizes, measured side by side and interleaved in one run, so
the ratios hold on a noisy shared machine. Both sides are timed the same way, from the caller:
prefill tok/s = prompt tokens / time to first token; decode tok/s = (tokens - 1) / (last - first).

    .venv/bin/python bench/engine.py [MODEL] [--rounds N] [--gen N] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient

PASSAGE = (
    "The river town woke slowly. Fishermen pulled their boats onto the gravel, the baker opened "
    "his shutters, and a thin smoke rose from the chimneys along the water. Children ran to the "
    "school on the hill while their parents argued about the price of grain and the coming rain. "
)


def prompts(n_words: int) -> tuple[str, str]:
    words = (PASSAGE * 40).split()[:n_words]
    a = " ".join(words)
    return "Story: " + a, "Tale: " + a  # same length, different from the second token on


def run_ours(client: EngineClient, prompt: str, gen: int) -> dict:
    t0 = time.perf_counter()
    rid = client.generate(prompt=prompt, sampling=SamplingSettings(temperature=0, max_tokens=gen))
    t_first = t_last = None
    done = stats = None
    for ev in client.stream(rid):
        now = time.perf_counter()
        if isinstance(ev, P.Token):
            t_first = t_first or now
            t_last = now
        elif isinstance(ev, P.Stats):
            stats = ev
        elif isinstance(ev, P.Done):
            done = ev
        elif isinstance(ev, P.Error):
            raise SystemExit(f"engine error: {ev.message}")
    n = len(done.tokens)
    n_eval = stats.n_prompt - stats.n_reused
    return {"prefill": n_eval / (t_first - t0), "decode": (n - 1) / (t_last - t_first),
            "ttft": t_first - t0, "n": n, "n_prompt": n_eval}


def run_ref(llm, prompt: str, gen: int) -> dict:
    llm.reset()
    n_prompt = len(llm.tokenize(prompt.encode(), special=True))
    t0 = time.perf_counter()
    t_first = t_last = None
    n = 0
    for _chunk in llm.create_completion(prompt, max_tokens=gen, temperature=0, stream=True):
        now = time.perf_counter()
        t_first = t_first or now
        t_last = now
        n += 1
    return {"prefill": n_prompt / (t_first - t0), "decode": (n - 1) / (t_last - t_first),
            "ttft": t_first - t0, "n": n, "n_prompt": n_prompt}


def cancel_latency(client: EngineClient, tries: int = 5) -> list[float]:
    """Seconds from sending cancel (during a ~1500-token prefill) to the engine's Done event."""
    out = []
    for _ in range(tries):
        rid = client.generate(prompt="The quick brown fox jumps over the lazy dog. " * 150,
                              sampling=SamplingSettings(temperature=0, max_tokens=4))
        t = None
        for ev in client.stream(rid):
            if isinstance(ev, P.Progress) and t is None:
                time.sleep(0.2)  # well inside the next n_batch chunk
                t = time.perf_counter()
                client.cancel(rid)
            elif isinstance(ev, P.Done):
                out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=380)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.model is None:
        from ggufdesk.core.starter import starter_model_path

        args.model = str(starter_model_path())
    from llama_cpp import Llama

    settings = LoadSettings(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=args.threads,
                            n_threads_batch=args.threads, flash_attn="off")
    llm = Llama(args.model, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=args.threads,
                n_threads_batch=args.threads, flash_attn=False, verbose=False)
    pa, pb = prompts(args.prompt_words)
    ours: list[dict] = []
    ref: list[dict] = []
    with EngineClient(auto_restart=False) as client:
        client.load(args.model, settings=settings)
        run_ours(client, pb, 8)  # warm-up both sides
        run_ref(llm, pb, 8)
        for i in range(args.rounds):
            prompt = pa if i % 2 == 0 else pb
            if i % 2 == 0:
                ours.append(run_ours(client, prompt, args.gen))
                ref.append(run_ref(llm, prompt, args.gen))
            else:
                ref.append(run_ref(llm, prompt, args.gen))
                ours.append(run_ours(client, prompt, args.gen))
        cancels = cancel_latency(client)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(f"model: {Path(args.model).name}; threads {args.threads}; prompt {ours[0]['n_prompt']} tokens; "
          f"{args.gen} generated; {args.rounds} interleaved rounds, medians")
    print("| metric | ggufdesk run (engine process) | llama-cpp-python in-process | ratio |")
    print("|---|---:|---:|---:|")
    for key, label, _better in (("decode", "decode tok/s", "higher"), ("prefill", "prefill tok/s", "higher"),
                               ("ttft", "time to first token s", "lower")):
        o, r = med(ours, key), med(ref, key)
        print(f"| {label} | {o:.2f} | {r:.2f} | {o / r:.3f}x |")
    print("targets: decode >= 0.98x, prefill >= 0.95x")
    print(f"cancel during a 1500-token prefill: median {statistics.median(cancels) * 1000:.1f} ms, "
          f"max {max(cancels) * 1000:.1f} ms over {len(cancels)} tries (target <= 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
