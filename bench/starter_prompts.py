"""Which example prompt shows the starter model (a base model) at its best? Try each, measure, read.

    .venv/bin/python bench/starter_prompts.py [--tokens 64] [--seeds 3]

Each candidate in core/starter.py's CANDIDATE_PROMPTS is continued by the real starter model
through the engine process (completion mode, as the app runs it): greedy, then with the app's
default sampling for a few seeds. Printed per prompt: how repetitive the continuations are
(distinct word 3-grams / all 3-grams: 1.0 never repeats itself), how often the model stopped on
its own, decode speed, and the greedy and first sampled texts to read.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def distinct3(text: str) -> float:
    words = text.split()
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / len(grams) if grams else 1.0


def continue_text(client, prompt: str, sampling) -> tuple[str, str, float]:
    from ggufdesk.engine.link import protocol as P

    rid = client.generate(prompt=prompt, sampling=sampling)
    text, reason, rate = [], "", 0.0
    for ev in client.stream(rid):
        if isinstance(ev, P.Token):
            text.append(ev.text)
        elif isinstance(ev, P.Stats) and ev.final:
            rate = ev.decode_tok_s
        elif isinstance(ev, P.Done):
            reason = ev.finish_reason
        elif isinstance(ev, P.Error):
            raise SystemExit(ev.message)
    return "".join(text), reason, rate


def main() -> int:
    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from ggufdesk.core.starter import CANDIDATE_PROMPTS, EXAMPLE_PROMPT, starter_model_path
    from ggufdesk.engine.link.client import EngineClient

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    model = str(starter_model_path())
    default = SamplingSettings()
    print(f"starter: {Path(model).name}; {args.tokens} tokens; greedy + {args.seeds} seeds at the "
          f"app's defaults (temperature {default.temperature}, top_p {default.top_p}, "
          f"min_p {default.min_p}); load on {os.cpu_count()} CPUs")
    rows = []
    with EngineClient(auto_restart=False) as client:
        client.load(model, settings=LoadSettings(n_ctx=1024, n_threads=2, n_threads_batch=2))
        for prompt in CANDIDATE_PROMPTS:
            runs = [continue_text(client, prompt, SamplingSettings(
                temperature=0.0, max_tokens=args.tokens, seed=1))]
            for seed in range(1, args.seeds + 1):
                runs.append(continue_text(client, prompt, SamplingSettings(
                    temperature=default.temperature, top_p=default.top_p, min_p=default.min_p,
                    top_k=default.top_k, repeat_penalty=default.repeat_penalty,
                    max_tokens=args.tokens, seed=seed)))
            d3 = statistics.mean(distinct3(t) for t, _, _ in runs)
            natural = sum(r == "stop" for _, r, _ in runs)
            rate = statistics.median(x for _, _, x in runs)
            rows.append((prompt, d3, natural, len(runs), rate))
            print(f"\n=== {prompt!r}{'  (the example prompt)' if prompt == EXAMPLE_PROMPT else ''}")
            print(f"distinct 3-grams {d3:.2f}, stopped by itself {natural}/{len(runs)}, "
                  f"decode {rate:.0f} tok/s")
            print(f"greedy : {runs[0][0].strip()[:400]!r}")
            print(f"seed 1 : {runs[1][0].strip()[:400]!r}")
    print("\n| prompt | distinct 3-grams | stopped by itself | decode tok/s |")
    print("|---|---:|---:|---:|")
    for prompt, d3, natural, n, rate in rows:
        mark = " **(chosen)**" if prompt == EXAMPLE_PROMPT else ""
        short = prompt.replace("\n", "⏎")[:48]
        print(f"| {short}{mark} | {d3:.2f} | {natural}/{n} | {rate:.0f} |")
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    os._exit(rc)
