"""Session 42's check (docs/bench/speculative-decoding.md, "Where greedy answers leave plain's"): the
starter in process, eight greedy prompts of the tuned suite, each answered plain, adaptive lookup,
plain, adaptive (96 tokens; a one-token "\n" request between them, the disk and RAM prompt caches off, one
slot, so each later answer reuses only the first prompt token); prints where each later answer leaves
the first plain one. Run from the repository root:

    PYTHONPATH=app .venv/bin/python docs/bench/runs/2026-12-07/s42_repeat_greedy.py on|off   (flash attention)
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tests" / "engine")); sys.path.insert(0, str(ROOT))
from inproc import Live
from ggufdesk.engine.link import protocol as P
from bench.spec_heldout import SUITES
TUNED = SUITES["tuned"]
fa = sys.argv[1]
from ggufdesk.core.starter import starter_model_path
M = str(starter_model_path())
os.environ["GGUFDESK_PROMPT_CACHE"] = "/proc/no-such-dir"
live = Live(M, n_ctx=8192, n_threads=2, n_threads_batch=2, flash_attn=fa, prompt_cache_ram_bytes=0)
SPEC = {"plain": {"mode": "off", "lookup_history": False},
        "adaptive": {"mode": "lookup", "k_max": 16, "adaptive": True, "lookup_history": False}}
ws = [w for w in TUNED if not w.temperature][:8]
left = 0; total = 0
for w in ws:
    outs = {}
    for name in ("plain", "adaptive", "plain", "adaptive"):
        ev = live.run(f"{w.name}{name}{len(outs)}{total}", prompt=w.prompt, sampling={"temperature": 0.0, "max_tokens": 96}, speculation=SPEC[name])
        d = [e for e in ev if isinstance(e, P.Done)][-1]
        outs.setdefault(name, []).append(list(d.tokens))
        live.run(f"f{w.name}{name}{total}", prompt="\n", sampling={"temperature": 0.0, "max_tokens": 1}, speculation=SPEC["plain"])
        total += 1
    base = outs["plain"][0]
    diffs = [next((j for j, (a, b) in enumerate(zip(base, t)) if a != b), None) for t in outs["plain"][1:] + outs["adaptive"]]
    left += sum(x is not None for x in diffs)
    print(w.category, w.name, "left plain at", diffs)
print("flash attention", fa, ": answers that left the first plain answer:", left, "of", 3 * len(ws))
