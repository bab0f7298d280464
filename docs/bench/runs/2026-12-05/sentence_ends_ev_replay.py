"""The replay behind "An expected-value sentence-end cut" (session 28): a diagnostic, not a bench.

Replays adaptive lookup over saved greedy answers at a fixed cost table (the AMD host's, as
bench/spec_heldout.py --measured printed it), one line per prompt and a SUMMARY per category
(replayed x plain / oracle (accepted/drafted)); -v logs every draft, --all turns every hint on.
Run from the repository root, with or without sentence_ends_ev.patch applied:

    .venv/bin/python docs/bench/runs/2026-12-05/sentence_ends_ev_replay.py starter|smollm2 tuned|heldout all|CATS [--all] [-v]
"""
import json, sys, math
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench.spec_heldout import SUITES, prompt_text, model_path, LENGTHS
from bench.spec_oracle import replay, oracle, gmean
from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.engine.speculation.speculative import TokenText, make_drafter
from tests.engine.live import Live

TABLES = {
 "starter": [1.87,3.01,2.47,3.70,3.16,4.41,3.80,5.07,4.64,5.91,5.31,6.59,6.16,7.45,6.72,8.12],
 "smollm2": [1.70,2.26,2.49,3.10,3.30,3.93,4.14,4.75,4.99,5.71,5.88,6.48,6.71,7.30,7.62,8.25],
}
model, suite, cats = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
verbose = "-v" in sys.argv
HOFF = {"lookup_hints_off": ""} if "--all" in sys.argv else {}
table = {k + 1: c for k, c in enumerate(TABLES[model])}
chat = model == "smollm2"
ans_path = Path(__file__).with_name(f"sentence_ends_answers_{model}_{suite}.json")  # answered once, then replayed
saved = json.loads(ans_path.read_text()) if ans_path.exists() else {}
live = Live(model_path(model), LoadSettings(n_ctx=8192, n_threads=2, n_threads_batch=2))
text = TokenText.of(live.lm)
rows = {}
for w in SUITES[suite]:
    if w.temperature or (cats != ["all"] and w.category not in cats):
        continue
    prompt = live.tokens(prompt_text(w, chat))
    key = f"{w.category}/{w.name}"
    if key not in saved:
        live.forget()
        saved[key] = live.plain(prompt, 96).tokens
        ans_path.write_text(json.dumps(saved))
    out = saved[key]
    if len(out) < 2:
        continue
    d = make_drafter(SpeculationSettings(mode="lookup", k_max=16, adaptive=True, **HOFF), prompt=prompt, draft=None,
                     target=live.lm, costs=table, text=text)
    log = []
    orig_p, orig_f = d.propose, d.feedback
    st = {}
    def propose(h, last, k, _o=orig_p, _st=st, _d=d):
        r = _o(h, last, k); _st["pos"] = len(h) + 1; _st["m"] = _d._last_m; _st["draft"] = r; return r
    def feedback(nd, na, s, *a, _o=orig_f, _st=st, _log=log):
        if nd:
            _log.append((_st["pos"], _st["m"], nd, na, _st["draft"]))
        return _o(nd, na, s, *a)
    d.propose, d.feedback = propose, feedback
    counts = [0, 0]
    x = replay(prompt, out, d, table, counts)
    b = oracle(prompt, out, table, LENGTHS)
    rows.setdefault(w.category, []).append((x, b, counts))
    print(f"{key}: {x:.2f} ({counts[1]}/{counts[0]}) oracle {b:.2f}")
    if verbose:
        P = len(prompt)
        tx = lambda ts: b"".join(live.vocab.piece(t) for t in ts).decode("utf8", "replace")
        for pos, m, nd, na, dr in log:
            i = pos - P
            print(f"   @{i:3d} m={m:2d} {na:2d}/{nd:2d} ctx={tx(out[max(0, i - 6):i])!r:40.40} draft={tx(dr)!r:.70}")
print("SUMMARY", " ".join(f"{c}={gmean([r[0] for r in rs]):.3f}/{gmean([r[1] for r in rs]):.2f}({sum(r[2][1] for r in rs)}/{sum(r[2][0] for r in rs)})" for c, rs in rows.items()))
