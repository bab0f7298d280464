"""The replay behind "An expected-value sentence-end cut" (session 28): a diagnostic, not a bench.

Replays adaptive lookup over saved greedy answers at a fixed cost table (the AMD host's, as
bench/spec_heldout.py --measured printed it), one line per prompt and a SUMMARY per category
(replayed x plain / oracle (accepted/drafted)); -v logs every draft, --all turns every hint on.
Run from the repository root, with or without sentence_ends_ev.patch applied:

    .venv/bin/python docs/bench/runs/2026-12-05/sentence_ends_ev_replay.py \
        starter|smollm2 tuned|heldout all|CATS [--all] [-v]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from bench.spec_heldout import LENGTHS, SUITES, model_path, prompt_text
from bench.spec_oracle import gmean, oracle, replay
from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.engine.speculation.speculative import TokenText, make_drafter
from tests.engine.live import Live

# k -> a step verifying k drafts, in plain steps: bench/spec_heldout.py --measured on the AMD host
TABLES = {
    "starter": [1.87, 3.01, 2.47, 3.70, 3.16, 4.41, 3.80, 5.07, 4.64, 5.91, 5.31, 6.59, 6.16, 7.45, 6.72, 8.12],
    "smollm2": [1.70, 2.26, 2.49, 3.10, 3.30, 3.93, 4.14, 4.75, 4.99, 5.71, 5.88, 6.48, 6.71, 7.30, 7.62, 8.25],
}


def main() -> None:
    model, suite, cats = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    verbose = "-v" in sys.argv
    hints_off = {"lookup_hints_off": ""} if "--all" in sys.argv else {}
    table = {k + 1: c for k, c in enumerate(TABLES[model])}
    answers = Path(__file__).with_name(f"sentence_ends_answers_{model}_{suite}.json")  # answered once
    saved = json.loads(answers.read_text()) if answers.exists() else {}
    live = Live(model_path(model), LoadSettings(n_ctx=8192, n_threads=2, n_threads_batch=2))
    text = TokenText.of(live.lm)
    rows: dict[str, list[tuple[float, float, list[int]]]] = {}
    for w in SUITES[suite]:
        if w.temperature or (cats != ["all"] and w.category not in cats):
            continue
        prompt = live.tokens(prompt_text(w, model == "smollm2"))
        key = f"{w.category}/{w.name}"
        if key not in saved:
            live.forget()
            saved[key] = live.plain(prompt, 96).tokens
            answers.write_text(json.dumps(saved))
        out = saved[key]
        if len(out) < 2:
            continue
        d = make_drafter(SpeculationSettings(mode="lookup", k_max=16, adaptive=True, **hints_off), prompt=prompt,
                         draft=None, target=live.lm, costs=table, text=text)
        log = logged(d)
        counts = [0, 0]
        x = replay(prompt, out, d, table, counts)
        b = oracle(prompt, out, table, LENGTHS)
        rows.setdefault(w.category, []).append((x, b, counts))
        print(f"{key}: {x:.2f} ({counts[1]}/{counts[0]}) oracle {b:.2f}")
        if verbose:
            def words(ts: list[int]) -> str:
                return b"".join(live.vocab.piece(t) for t in ts).decode("utf8", "replace")
            for pos, m, nd, na, dr in log:
                i = pos - len(prompt)
                print(f"   @{i:3d} m={m:2d} {na:2d}/{nd:2d} ctx={words(out[max(0, i - 6):i])!r:40.40} "
                      f"draft={words(dr)!r:.70}")
    print("SUMMARY", " ".join(f"{c}={gmean([r[0] for r in rs]):.3f}/{gmean([r[1] for r in rs]):.2f}"
                              f"({sum(r[2][1] for r in rs)}/{sum(r[2][0] for r in rs)})" for c, rs in rows.items()))


def logged(d) -> list[tuple[int, int, int, int, list[int]]]:
    """(position, judged match length, drafted, accepted, draft) of every draft the replay makes."""
    log: list[tuple[int, int, int, int, list[int]]] = []
    now: dict = {}
    propose, feedback = d.propose, d.feedback

    def proposing(history, last, k):
        now.update(pos=len(history) + 1, draft=propose(history, last, k), m=d._last_m)
        return now["draft"]

    def told(nd, na, s, *rest):
        if nd:
            log.append((now["pos"], now["m"], nd, na, now["draft"]))
        return feedback(nd, na, s, *rest)

    d.propose, d.feedback = proposing, told
    return log


if __name__ == "__main__":
    main()
