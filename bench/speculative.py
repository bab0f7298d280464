"""Speculative decoding workload suite: plain vs adaptive vs fixed K vs llama-cpp-python's prompt lookup, per category.

Categories and prompts: bench/spec_workloads.py (Spec-Bench-like: multi-turn chat, translation,
summarization, QA over a passage, math, RAG that quotes its sources, code editing, copy/extract,
free writing sampled at T 0.8, one prompt over 6,000 tokens). Starter model (Gemma 3 270M), 2
threads. In every round each prompt runs once in every configuration, back to back (so machine
load hits them alike; the order rotates from round to round), with the KV cache emptied between
runs (no prefix reuse in memory) and the engine's conversation n-gram cache off (each run stands
alone). The disk prompt cache stays on, as it is for users: a prompt of 256 tokens or more
(settings.PROMPT_CACHE_MIN_TOKENS) is restored from it after its first run, so its TTFT is a
restore's in every configuration alike (the long prompt, the held-out Japanese ones).
Ratios are taken against plain in the same round, medians over rounds, then the geometric mean
over a category's prompts.
Reference: llama-cpp-python's `Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))`,
in process (it forces logits_all, an n_ctx x vocab float buffer, so it runs at n_ctx 2048 and
skips the long prompt).

Per hint (engine/speculation/hints.py), `--hints` adds adaptive with each hint switched off and with
all of them off, so each hint's worth shows as adaptive (all on) against adaptive without it.
`--suite heldout` runs bench/spec_heldout.py's held-out suite (other templates, German, French,
Japanese; never tuned on), `--model smollm2` the chat starter (its prompts sent as chat messages).

    .venv/bin/python bench/speculative.py [--suite tuned|heldout] [--model starter|smollm2|PATH]
        [--hints] [--categories copy,code] [--rounds 3] [--max-tokens 128]
        [--fixed 4,8,16] [--no-reference] [--json out.json] [--tiny]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_heldout import SUITES, chat_prompt, hint_configs, model_path
from bench.spec_workloads import Workload
from ggufdesk.core.settings import LOOKUP_HINTS
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient

N_CTX = 8192
REF_CTX = 2048
FLUSH = {"prompt": "\n", "sampling": {"temperature": 0.0, "max_tokens": 1},
         "speculation": {"mode": "off", "lookup_history": False}}


def configs(fixed: list[int], hints: bool = False) -> dict[str, dict]:
    out = {"plain": {"mode": "off"}, "adaptive": {"mode": "lookup", "k_max": 16, "adaptive": True}}
    if hints:  # adaptive with every hint on, each one off, and all off ("adaptive": the default set)
        for name, off in hint_configs(LOOKUP_HINTS).items():
            if name != "default":  # (that is "adaptive")
                out[f"adaptive {name}"] = {**out["adaptive"], "lookup_hints_off": off}
    for k in fixed:
        out[f"K={k}"] = {"mode": "lookup", "k_max": k, "adaptive": False}
    return {name: {**spec, "lookup_history": False} for name, spec in out.items()}


def ours(client: EngineClient, w: Workload, tokens: int, spec: dict, chat: bool = False) -> dict:
    sampling = {"temperature": w.temperature, "seed": 1, "max_tokens": tokens}
    asked = {"messages": chat_prompt(w)} if chat else {"prompt": w.prompt}
    rid = client.generate(**asked, sampling=sampling, speculation=spec)
    text, stats, tokens = [], None, []
    for ev in client.stream(rid, timeout=600):
        if isinstance(ev, P.Token):
            text.append(ev.text)
        elif isinstance(ev, P.Stats):
            stats = ev
        elif isinstance(ev, P.Done):
            tokens = list(ev.tokens or [])
        elif isinstance(ev, P.Error):
            raise SystemExit(f"engine error on {w.category}/{w.name}: {ev.message}")
    flush = client.generate(**FLUSH)  # empty the KV cache: the next run prefills in full
    for _ in client.stream(flush, timeout=60):
        pass
    return {"tok_s": stats.decode_tok_s, "ttft": stats.ttft_s, "text": "".join(text), "n": stats.n_gen,
            "n_prompt": stats.n_prompt, "drafted": stats.drafted, "accepted": stats.accepted,
            "spec": stats.speculation, "tokens": tokens}


def tie_margin(client: EngineClient, w: Workload, plain: list[int], other: list[int], chat: bool = False) -> dict:
    """Where a greedy answer left plain decoding's: the token index and plain's own margin there
    (log-probability of its top token minus the runner-up's). llama.cpp's CPU kernels round by the
    rows in a decode call (a verification batch vs a one-row step, a prompt read cold vs from a
    cache: bench/prompt_splits.py), and the differences add up along an answer: on the starter
    flips were seen at margins up to 1.2; one far beyond that would be worth a look."""
    i = next((j for j, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    asked = {"messages": chat_prompt(w)} if chat else {"prompt": w.prompt}
    rid = client.generate(**asked, sampling={"temperature": 0.0, "max_tokens": i + 1},
                          speculation={"mode": "off", "lookup_history": False}, logprobs=2)
    entries = []
    for ev in client.stream(rid, timeout=600):
        if isinstance(ev, P.Token) and ev.logprobs:
            entries.extend(ev.logprobs)
    top = entries[i]["top"] if i < len(entries) else []
    margin = top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else float("nan")
    flush = client.generate(**FLUSH)
    for _ in client.stream(flush, timeout=60):
        pass
    # the margin is plain's only where this plain run wrote what the round's plain did up to there (else
    # it is read in another text: plain itself came out differently, and the margin says nothing)
    again = [e["id"] for e in entries[:i]]
    moved = next((j for j, (a, b) in enumerate(zip(plain[:i], again)) if a != b), None)
    return {"at": i, "margin": margin} if moved is None else {"at": i, "margin": float("nan"), "plain_moved": moved}


class Reference:
    """llama-cpp-python's high-level API with its prompt-lookup drafter."""

    def __init__(self, model: str, threads: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.llm = Llama(model, n_ctx=REF_CTX, verbose=False, n_threads=threads, n_threads_batch=threads,
                         draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

    def fits(self, n_prompt: int, tokens: int) -> bool:
        return n_prompt + tokens < REF_CTX

    def run(self, w: Workload, tokens: int) -> dict:
        self.llm.reset()
        t0 = time.perf_counter()
        first = last = None
        pieces = []
        for chunk in self.llm.create_completion(w.prompt, max_tokens=tokens, temperature=w.temperature, seed=1,
                                                top_k=40, top_p=0.95, min_p=0.05, stream=True):
            now = time.perf_counter()
            first = first or now
            last = now
            pieces.append(chunk["choices"][0]["text"])
        n = len(pieces)
        return {"tok_s": (n - 1) / (last - first) if n > 1 else 0.0, "ttft": first - t0 if first else 0.0,
                "text": "".join(pieces), "n": n, "drafted": 0, "accepted": 0, "spec": "llama-cpp-python"}


def gmean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def summarize(results: dict, names: list[str], fixed: list[str]) -> list[dict]:
    """Per category: × plain (decode tok/s and TTFT) of every configuration, the best fixed K."""
    rows = []
    for cat in dict.fromkeys(w.split("/")[0] for w in results):
        ws = [w for w in results if w.split("/")[0] == cat]
        if not ws:
            continue
        row: dict = {"category": cat, "prompts": len(ws)}
        plain_tok = [statistics.median(r["tok_s"] for r in results[w]["plain"]) for w in ws]
        row["plain tok/s"] = statistics.median(plain_tok)
        for name in names:
            if name == "plain":
                continue
            speed, ttft, same, acc, dr = [], [], 0, 0, 0
            ties: list[float] = []
            n_same = moved = 0
            for w in ws:
                runs, base = results[w].get(name, []), results[w]["plain"]
                if not runs:
                    continue
                pairs = list(zip(runs, base))  # same round
                speed.append(statistics.median(r["tok_s"] / b["tok_s"] for r, b in pairs))
                ttft.append(statistics.median(r["ttft"] / b["ttft"] for r, b in pairs))
                same += sum(r["text"] == b["text"] for r, b in pairs)
                ties += [r["tie"]["margin"] for r in runs if "tie" in r and "plain_moved" not in r["tie"]]
                moved += sum("plain_moved" in r.get("tie", {}) for r in runs)
                n_same += len(pairs)
                acc += sum(r["accepted"] for r in runs)
                dr += sum(r["drafted"] for r in runs)
            if speed:
                row[name] = {"x": gmean(speed), "ttft_x": gmean(ttft), "same": f"{same}/{n_same}",
                             "acc": f"{acc}/{dr}", "ties": ties, "moved": moved}
        ks = [k for k in fixed if k in row]
        if ks:
            best = max(ks, key=lambda k: row[k]["x"])
            row["best K"] = best
        rows.append(row)
    return rows


def print_hints(rows: list[dict]) -> None:
    """Per category: adaptive with every hint on and with each off, × plain (accepted/drafted)."""
    names = [n for n in (rows[0] if rows else {}) if n.startswith("adaptive ")]
    if not names:
        return
    print("\nper hint (× plain, accepted/drafted tokens; 'adaptive' is the default set): a hint earns its "
          "place where 'adaptive all hints' beats the column without it")
    print("| category | adaptive | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for r in rows:
        cell = lambda d: f"{d['x']:.2f} ({d['acc']})" if d else "n/a"  # noqa: E731
        print(f"| {r['category']} | {cell(r.get('adaptive'))} | " + " | ".join(cell(r.get(n)) for n in names) + " |")


def print_table(rows: list[dict], args, loads: list[float]) -> None:
    gpu = f", {args.gpu_layers} GPU layers" if getattr(args, "gpu_layers", 0) else ""
    print(f"\n{args.model} model, {args.suite} suite, {args.threads} threads{gpu}, {args.max_tokens} tokens, "
          f"medians of {args.rounds} interleaved rounds; load average during the run: "
          f"min {min(loads):.1f}, median {statistics.median(loads):.1f}, "
          f"max {max(loads):.1f} on {os.cpu_count()} cores")
    print("| category | plain tok/s | adaptive × plain | best fixed K × plain | adaptive / best K | "
          "llama-cpp-python lookup × plain | TTFT × plain: adaptive / K / lcp | same text as plain "
          "(adaptive, best K) | accepted/drafted (adaptive) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        a, bk = r.get("adaptive"), r.get("best K")
        b = r.get(bk) if bk else None  # (none with --fixed "")
        if a is None:
            continue
        ref = r.get("llama-cpp-python")
        cell = lambda d, key: f"{d[key]:.2f}" if d else "n/a"  # noqa: E731
        print(f"| {r['category']} ({r['prompts']}) | {r['plain tok/s']:.1f} | {cell(a, 'x')} | "
              f"{bk or '-'}: {cell(b, 'x')} | {a['x'] / b['x'] if b else float('nan'):.2f} | {cell(ref, 'x')} | "
              f"{cell(a, 'ttft_x')} / {cell(b, 'ttft_x')} / {cell(ref, 'ttft_x')} | "
              f"{a['same']}, {b['same'] if b else '-'} | {a['acc']} |")
    print_hints(rows)
    ties = [m for r in rows for k, v in r.items() if isinstance(v, dict) and "ties" in v for m in v["ties"]]
    moved = sum(v.get("moved", 0) for r in rows for v in r.values() if isinstance(v, dict))
    if ties or moved:
        where = f"max {max(ties):.4f}, median {statistics.median(ties):.4f}" if ties else "-"
        print(f"\ngreedy answers that left plain decoding's: {len(ties) + moved}; plain's own margin (top-1 minus "
              f"top-2 log-probability) where they left it: {where}" + (f" (of {len(ties)}; in {moved} plain, run "
              "again, left the round's plain answer before that point: no margin read)" if moved else ""))
    print("\nall fixed K (× plain): " + "; ".join(
        f"{r['category']}: " + ", ".join(f"{k} {r[k]['x']:.2f}" for k in r if k.startswith("K=")) for r in rows))


def tiny(rounds: int, tokens: int) -> None:
    """The tiny self-draft pair: a model drafting for itself (100% acceptance), the mechanism's ceiling."""
    from tests.fixtures import ggufs

    with tempfile.TemporaryDirectory() as d:
        model = str(ggufs.write_tiny_llama(Path(d) / "tiny.gguf", ggufs.TinySpec(seed=0)))
        res: dict[str, list[float]] = {}
        with EngineClient(auto_restart=False) as client:
            client.load(model, settings={"n_ctx": 2048},
                        speculation={"mode": "draft", "draft_model": model, "p_min": 0.0})
            modes = {"plain": {"mode": "off"}, "self-draft K=8": {"mode": "draft", "adaptive": False},
                     "self-draft adaptive": {"mode": "draft", "adaptive": True}}
            for _ in range(rounds):
                for name, spec in modes.items():
                    r = ours(client, Workload("tiny", "cat", "hello the cat"), tokens, spec)
                    res.setdefault(name, []).append(r["tok_s"])
        base = statistics.median(res["plain"])
        print("\ntiny self-draft pair: " + ", ".join(
            f"{n} {statistics.median(v) / base:.2f}x" for n, v in res.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="tuned", choices=list(SUITES), help="tuned (bench/spec_workloads.py) or "
                    "heldout (bench/spec_heldout.py: never tuned on), heldout2 (bench/spec_heldout2.py: "
                    "written 2026-12-06, nothing chosen on it)")
    ap.add_argument("--model", default="starter", help="starter, smollm2 (sent as chat messages) or a GGUF path")
    ap.add_argument("--hints", action="store_true", help="also adaptive with each lookup hint off and all off")
    ap.add_argument("--categories", default="", help="comma-separated (default: all of the suite's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--fixed", default="4,8,16", help="fixed draft lengths to compare")
    ap.add_argument("--prompts", type=int, default=0, help="at most this many prompts per category (0: all)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--json", help="write every run here (after each round)")
    ap.add_argument("--tiny", action="store_true", help="also the tiny self-draft pair")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers on a GPU (-1: all)")
    ap.add_argument("--report", help="only print the tables of a --json file written before")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        for key in ("rounds", "max_tokens", "threads", "gpu_layers", "model", "suite"):
            setattr(args, key, saved["args"].get(key, getattr(args, key)))
        names = list(dict.fromkeys(n for r in saved["results"].values() for n in r))
        print_table(summarize(saved["results"], names, [n for n in names if n.startswith("K=")]), args,
                    saved["loads"])
        return 0
    suite = SUITES[args.suite]
    known = list(dict.fromkeys(w.category for w in suite))
    cats = [c.strip() for c in args.categories.split(",") if c.strip()] or known
    bad = [c for c in cats if c not in known]
    if bad:
        ap.error(f"unknown categories {bad}; known: {known}")
    chosen: list[Workload] = []
    for c in cats:
        ws = [w for w in suite if w.category == c]
        chosen += ws[:args.prompts] if args.prompts else ws
    cfg = configs([int(k) for k in args.fixed.split(",") if k], args.hints)
    model = model_path(args.model)
    chat = args.model == "smollm2"
    ref = None if args.no_reference or chat else Reference(model, args.threads)
    results: dict[str, dict[str, list[dict]]] = {f"{w.category}/{w.name}": {} for w in chosen}
    loads: list[float] = []
    with EngineClient(auto_restart=False) as client:
        client.load(model, settings={"n_ctx": N_CTX, "n_threads": args.threads, "n_threads_batch": args.threads,
                                     "n_gpu_layers": args.gpu_layers},
                    speculation={"mode": "lookup", "k_max": 16})  # logits rows for K <= 16; measures
                                                                 # verification costs (speculation/verify_cost.py)
        ours(client, chosen[0], 8, cfg["plain"], chat)  # warm-up: page the weights in
        for rnd in range(args.rounds):
            for w in chosen:
                key = f"{w.category}/{w.name}"
                loads.append(os.getloadavg()[0])
                names = list(cfg)
                names = names[rnd % len(names):] + names[:rnd % len(names)]  # each round starts elsewhere
                for name in names:
                    results[key].setdefault(name, []).append(ours(client, w, args.max_tokens, cfg[name], chat))
                base = results[key]["plain"][-1]
                for name in names:
                    r = results[key][name][-1]
                    if w.temperature == 0 and name != "plain" and r["tokens"] != base["tokens"]:
                        r["tie"] = tie_margin(client, w, base["tokens"], r["tokens"], chat)
                n_prompt = base["n_prompt"]
                if ref is not None and ref.fits(n_prompt, args.max_tokens):
                    results[key].setdefault("llama-cpp-python", []).append(ref.run(w, args.max_tokens))
                print(f"round {rnd + 1}/{args.rounds} {key}: " + ", ".join(
                    f"{n} {rs[-1]['tok_s']:.1f}" for n, rs in results[key].items()), file=sys.stderr, flush=True)
                if args.json:
                    done = {k: v for k, v in results.items() if v}
                    Path(args.json).write_text(json.dumps({"args": vars(args), "loads": loads, "results": done}))
    names = list(cfg) + ([] if ref is None else ["llama-cpp-python"])
    rows = summarize(results, names, [n for n in cfg if n.startswith("K=")])
    print_table(rows, args, loads)
    if args.tiny:
        tiny(args.rounds, 400)
    return 0


if __name__ == "__main__":
    sys.exit(main())
