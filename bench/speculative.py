"""Speculative decoding benchmark: plain vs prompt lookup (fixed K) vs adaptive, side by side, with ratios.

Workloads on the starter model (Gemma 3 270M): a rewrite/extract task whose output mostly copies
the prompt, and free writing (sampled, fixed seed, so every mode must produce the same tokens).
Reference: llama-cpp-python's own `Llama(draft_model=LlamaPromptLookupDecoding())`, in process.
Also the tiny self-draft pair (a model drafting for itself: 100% acceptance, the mechanism's
upper bound in tokens per verification). Configurations run interleaved, medians reported.

    .venv/bin/python bench/speculative.py [--rounds 3] [--tokens 160]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggufdesk.core.starter import starter_model_path
from ggufdesk.engine import protocol as P
from ggufdesk.engine.client import EngineClient

PASSAGE = (
    "The river town of Ashford sits where two valleys meet. Its market opens at dawn every Saturday, "
    "and farmers bring apples, cheese, honey and wool from the hills. The old stone bridge, built in 1642, "
    "still carries carts across the water, although a newer bridge downstream now takes the heavy lorries. "
    "In winter the river often floods the lower meadows, and the children skate on the frozen ponds. "
    "The town library keeps a collection of maps that show how the streets have changed over three "
    "centuries. Visitors come in summer for the music festival, which fills the square with bands, "
    "dancers and food stalls."
)
WORKLOADS = {
    "rewrite": (f"Text: {PASSAGE}\n\nThe same text, copied exactly:\n{PASSAGE[:60]}", 0.0),
    "free": ("Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n", 0.8),
}
MODES = {
    "plain": {"mode": "off"},
    "lookup K=8": {"mode": "lookup", "k_max": 8, "adaptive": False},
    "lookup K=16": {"mode": "lookup", "k_max": 16, "adaptive": False},
    "adaptive": {"mode": "lookup", "k_max": 16, "adaptive": True},
}


def ours(client: EngineClient, prompt: str, temperature: float, tokens: int, spec: dict) -> dict:
    sampling = {"temperature": temperature, "seed": 1, "max_tokens": tokens}
    rid = client.generate(prompt=prompt, sampling=sampling, speculation=spec)
    text, stats = [], None
    for ev in client.stream(rid):
        if isinstance(ev, P.Token):
            text.append(ev.text)
        elif isinstance(ev, P.Stats):
            stats = ev
        elif isinstance(ev, P.Error):
            raise SystemExit(f"engine error: {ev.message}")
    return {"tok_s": stats.decode_tok_s, "ttft": stats.ttft_s, "text": "".join(text), "n": stats.n_gen,
            "acc": f"{stats.accepted}/{stats.drafted}", "spec": stats.speculation}


class Reference:
    """llama-cpp-python's high-level API, plain and with its prompt-lookup drafter."""

    def __init__(self, model: str, n_ctx: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw = {"n_ctx": n_ctx, "verbose": False, "n_threads": 2, "n_threads_batch": 2}
        self.plain = Llama(model, **kw)
        self.lookup = Llama(model, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), **kw)

    def run(self, which: str, prompt: str, temperature: float, tokens: int) -> dict:
        llm = self.plain if which == "plain" else self.lookup
        llm.reset()
        t0 = time.perf_counter()
        first = last = None
        pieces = []
        for chunk in llm.create_completion(prompt, max_tokens=tokens, temperature=temperature, seed=1,
                                           top_k=40, top_p=0.95, min_p=0.05, stream=True):
            now = time.perf_counter()
            first = first or now
            last = now
            pieces.append(chunk["choices"][0]["text"])
        n = len(pieces)
        return {"tok_s": (n - 1) / (last - first) if n > 1 else 0.0, "ttft": first - t0, "text": "".join(pieces),
                "n": n, "acc": "", "spec": "llama-cpp-python"}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def table(title: str, results: dict[str, list[dict]], base: str) -> None:
    print(f"\n{title}")
    print(f"{'mode':<24} {'decode tok/s':>12} {'ratio':>6} {'TTFT s':>7} {'ratio':>6}  accepted/drafted  same text")
    b_tok, b_ttft = median(results[base], "tok_s"), median(results[base], "ttft")
    b_text = results[base][0]["text"]
    for name, rows in results.items():
        tok, ttft = median(rows, "tok_s"), median(rows, "ttft")
        same = all(r["text"] == b_text for r in rows) if not name.startswith("llama-cpp") else "-"
        print(f"{name:<24} {tok:12.1f} {tok / b_tok:6.2f} {ttft:7.3f} {ttft / b_ttft:6.2f}  "
              f"{rows[-1]['acc']:>16}  {same}  {rows[-1]['spec'] if rows[-1]['spec'].startswith('disabled') else ''}")


def tiny(rounds: int, tokens: int) -> None:
    from tests.fixtures import ggufs

    with tempfile.TemporaryDirectory() as d:
        model = str(ggufs.write_tiny_llama(Path(d) / "tiny.gguf", ggufs.TinySpec(seed=0)))
        results: dict[str, list[dict]] = {}
        with EngineClient(auto_restart=False) as client:
            client.load(model, settings={"n_ctx": 2048},
                        speculation={"mode": "draft", "draft_model": model, "p_min": 0.0})
            modes = {"plain": {"mode": "off"}, "self-draft K=8": {"mode": "draft", "adaptive": False},
                     "self-draft adaptive": {"mode": "draft", "adaptive": True}}
            for _ in range(rounds):
                for name, spec in modes.items():
                    for p in ("hello the cat", "the dog was"):  # alternate: no prefix reuse
                        r = ours(client, p, 0.0, tokens, spec)
                        if p == "hello the cat":
                            results.setdefault(name, []).append(r)
        table(f"tiny self-draft pair (2-layer f32 target drafting for itself, {tokens} tokens)", results, "plain")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()
    model = str(starter_model_path())
    ref = None if args.no_reference else Reference(model, 1024)
    results: dict[str, dict[str, list[dict]]] = {w: {} for w in WORKLOADS}
    with EngineClient(auto_restart=False) as client:
        client.load(model, settings={"n_ctx": 1024}, speculation={"k_max": 16})  # logits rows for K <= 16
        for prompt, temp in WORKLOADS.values():  # warm-up: page the weights in
            ours(client, prompt, temp, 8, MODES["plain"])
            if ref is not None:
                ref.run("plain", prompt, temp, 8)
        for rnd in range(args.rounds):
            for name, spec in MODES.items():
                for w, (prompt, temp) in WORKLOADS.items():  # alternating prompts: no prefix reuse
                    results[w].setdefault(name, []).append(ours(client, prompt, temp, args.tokens, spec))
            if ref is not None:
                for which in ("plain", "lookup"):
                    for w, (prompt, temp) in WORKLOADS.items():
                        label = f"llama-cpp-python {which}"
                        results[w].setdefault(label, []).append(ref.run(which, prompt, temp, args.tokens))
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    for w in WORKLOADS:
        table(f"{w} ({'greedy' if WORKLOADS[w][1] == 0 else 'temperature 0.8, seed 1'}, {args.tokens} tokens, "
              f"medians of {args.rounds}, starter model, 2 threads)", results[w], "plain")
    tiny(args.rounds, 400)
    return 0


if __name__ == "__main__":
    sys.exit(main())
