"""What the llama-cpp-python build's CPU flags are worth on this machine: this venv's build against another.

installer/llama_wheel.sh builds a portable CPU wheel (AVX2, FMA, F16C, BMI2; GGML_NATIVE would die
with SIGILL on AMX CPUs). A CPU with AVX-512 can take more: build a second wheel with
`GGUFDESK_EXTRA_CMAKE_ARGS="-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON"` and a cache
of its own (`GGUFDESK_WHEEL_CACHE=/tmp/w512`), install it into a folder (`pip install --no-deps --target
DIR WHEEL`) and pass that folder as --site. Each round loads the model through the engine's loader
(bench/batch.py's LowLevel) once per build, in a child process, the builds alternating, and times:
a 512-token prompt read in one call (prefill tok/s), 64 one-row decode steps after it (decode tok/s,
the median step), and a 5-row step with logits for every row (a 4-token draft verified) over the
decode step. It prints each run and the other build's medians over this one's.

    .venv/bin/python bench/cpu_build.py --site DIR [--model starter|smollm2|PATH] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PROMPT = 512
STEPS = 64
DRAFT = 4


def child(model: str, threads: int) -> dict[str, object]:
    """One build's figures, in this process (whichever llama_cpp the path gives)."""
    import llama_cpp
    from batch import LowLevel

    low = LowLevel(model, threads)
    reads, steps, verify = [], [], []
    for _ in range(3):
        llama_cpp.llama_memory_clear(low.mem, True)
        low.pos = {}
        reads.append(PROMPT / low.decode([(100 + i % 300, 0, i == PROMPT - 1) for i in range(PROMPT)]))
        steps.extend(low.decode([(200 + i % 50, 0, True)]) for i in range(STEPS))
        at = low.pos[0]
        for _ in range(8):
            llama_cpp.llama_memory_seq_rm(low.mem, 0, at, -1)
            low.pos[0] = at
            verify.append(low.decode([(300 + j, 0, True) for j in range(DRAFT + 1)]))
    step = statistics.median(steps)
    return {"system": llama_cpp.llama_print_system_info().decode().strip(), "prefill": statistics.median(reads),
            "decode": 1.0 / step, "verify": statistics.median(verify) / step}


def run(site: str | None, model: str, threads: int) -> dict[str, object]:
    env = dict(os.environ)
    paths = [p for p in (site, str(ROOT / "app"), env.get("PYTHONPATH")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    out = subprocess.run([sys.executable, __file__, "--child", model, "--threads", str(threads)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the run with {site or 'this venv'}'s build failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", help="a folder holding another llama-cpp-python build (pip install --target)")
    ap.add_argument("--model", default="starter", help="starter, smollm2 or a GGUF path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.threads)))
        return 0
    if not args.site or not (Path(args.site) / "llama_cpp").is_dir():
        ap.error("--site must be a folder with a llama_cpp package in it (pip install --no-deps --target DIR WHEEL)")
    from spec_heldout import model_path

    model = model_path(args.model)
    runs: dict[str, list[dict[str, object]]] = {"this": [], "other": []}
    for r in range(args.rounds):
        order: list[tuple[str, str | None]] = [("this", None), ("other", args.site)]
        for name, site in order if r % 2 == 0 else order[::-1]:
            fig = run(site, model, args.threads)
            runs[name].append(fig)
            print(f"round {r + 1} {name:5}: prefill {fig['prefill']:6.0f} tok/s, decode {fig['decode']:5.1f} tok/s, "
                  f"{DRAFT + 1}-row step {fig['verify']:.2f} decode steps", flush=True)
    for name in runs:
        print(f"{name}: {runs[name][0]['system']}")

    def med(name: str, key: str) -> float:
        return statistics.median(float(f[key]) for f in runs[name])  # type: ignore[arg-type]

    print(f"{Path(model).name}, other / this (medians of {args.rounds} rounds): "
          + ", ".join(f"{key} {med('other', key) / med('this', key):.2f}x" for key in ("prefill", "decode", "verify")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
