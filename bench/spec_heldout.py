"""A held-out suite for prompt lookup: templates, languages and models nobody tuned on. Never tune on it.

bench/spec_workloads.py (the tuned suite) has one RAG template with English straight quotes, one
code-edit template, English copy prompts, one base model. Here: German, French, Japanese and
English; quotes in „…“, «…» and 「…」; numbered lists in full-width digits; a Markdown table and a
YAML file to edit; a transcript in another chat format; free writing sampled at T 0.8 and a copy
sampled at T 0.7. Each prompt is a text to continue (the base starter) and, for a chat model
(SmolLM2-135M-Instruct), the user's message of a chat (`chat_prompt`, its ChatML template).
`COPY_HEAVY` names the categories where lookup should pay (issue 29: >= 1.4x plain), the others
must not lose (>= 0.97x).

bench/speculative.py --suite heldout measures wall time per hint on and off. This module's main
replays instead (load-insensitive, like bench/spec_oracle.py): each greedy prompt is answered once
by plain decoding on the live step loop in process, then the engine's lookup drafter is driven over
that answer with every hint on, with each hint off and with all off, each step charged a fixed cost
table; it prints accepted/drafted tokens and the replayed speed-up per category and configuration.

With `--measured` it replays at this machine's own costs instead, for the default configuration only,
beside the ceiling of prompt lookup there (bench/spec_oracle.py's oracle: it knows how many of each
draft the model will accept and picks every step's length, 0 to 16, by dynamic programming). The
costs are `llama_decode` of 1 to 17 rows with logits at a 400-token context, each plus the per-step
time the live loop spends outside it (measured on a plain answer), over a plain step: so the
ceiling says what no policy drafting from the n-gram match can beat on this host (the `counts` hint
drafts numbers no match holds and can pass it), and whether a target missed there is the
controller's or the machine's.

    .venv/bin/python bench/spec_heldout.py [--suite heldout|heldout2|tuned] [--model starter|smollm2|PATH]
        [--max-tokens 96] [--categories ...] [--measured]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_heldout2 import HELDOUT2
from bench.spec_workloads import WORKLOADS as TUNED
from bench.spec_workloads import Workload

LOCH_DE = (
    "Der Leuchtturm von Westerhever steht seit 1908 auf einer Warft mitten in den Salzwiesen. Er ist "
    "vierzig Meter hoch und wird von zwei Wärterhäusern flankiert. Bis 1978 lebten dort drei Familien, "
    "die abwechselnd das Licht bewachten. Heute kann man den Turm im Sommer besichtigen, und im Standesamt "
    "im Erdgeschoss wird geheiratet."
)
BIBLIO_FR = (
    "La bibliothèque de Lyon ouvre ses portes à neuf heures du matin, du mardi au samedi. Elle conserve "
    "plus de deux millions de documents, dont des manuscrits du Moyen Âge. Les lecteurs peuvent emprunter "
    "jusqu'à vingt livres pendant trois semaines. Le dimanche, une salle d'étude reste ouverte aux étudiants."
)
TEA_JA = (
    "静岡県は日本で最も多くの緑茶を生産している。茶畑は富士山のふもとから海の近くまで広がっている。"
    "新茶は四月の終わりから五月にかけて摘まれる。摘んだ葉はすぐに蒸して、発酵を止める。"
    "その後、葉をもみながら乾かすと、香りのよい煎茶ができる。"
)
STEPS_JA = ["米を洗う。", "水に三十分つける。", "強火で十分炊く。", "弱火で十五分炊く。", "十分蒸らす。"]
MD_TABLE = (
    "| City | Country | Population |\n|---|---|---|\n| Lyon | France | 522,000 |\n"
    "| Porto | Portugal | 232,000 |\n| Ghent | Belgium | 263,000 |\n| Brno | Czechia | 382,000 |\n"
)
YAML_CONF = (
    "server:\n  host: 0.0.0.0\n  port: 8080\n  workers: 4\nlogging:\n  level: info\n  file: /var/log/app.log\n"
    "database:\n  url: postgres://db:5432/app\n  pool: 10\n  timeout: 30\n"
)


def _numbered_ja(steps: list[str]) -> str:
    return "\n".join(f"{chr(0xFF11 + i)}．{s}" for i, s in enumerate(steps))


HELDOUT: list[Workload] = [
    # ---- quoting a source, in other languages and quote marks (copy-heavy)
    Workload("quote-de", "leuchtturm", f"Quelle 1: {LOCH_DE}\n\nFrage: Wie hoch ist der Leuchtturm, und wer lebte "
             "dort? Antworte mit wörtlichen Zitaten aus der Quelle.\n\nAntwort: In Quelle 1 heißt es: „Er"),
    Workload("quote-fr", "bibliotheque", f"Document A : {BIBLIO_FR}\n\nQuestion : Quand la bibliothèque ouvre-t-elle, "
             "et combien de livres peut-on emprunter ? Réponds en citant le document mot pour mot.\n\n"
             "Réponse : Selon le document A, « La"),
    Workload("quote-ja", "tea", f"資料：{TEA_JA}\n\n質問：新茶はいつ摘まれますか。資料から引用して答えてください。\n\n"
             "答え：資料によると、「新茶"),
    # ---- copying (copy-heavy)
    Workload("copy-ja", "tea", f"次の文章をそのまま書き写してください。\n\n文章：{TEA_JA}\n\n書き写し：\n静岡県は"),
    Workload("copy-de", "leuchtturm", f"Text:\n{LOCH_DE}\n\nDer zweite und der dritte Satz, wörtlich abgeschrieben:\n"),
    Workload("copy-ja", "tea-sampled", f"文章：{TEA_JA}\n\n同じ文章：\n静岡県は", 0.7),
    # ---- lists that count on (copy-heavy): full-width digits
    Workload("list-ja", "rice",
             f"ご飯の炊き方：\n{_numbered_ja(STEPS_JA)}\n\nもう一度、同じ手順を書いてください：\n１．"),
    # ---- lists that count on past the prompt (added 2026-12-02 for the `counts` hint, before any run of it:
    # the numbers to write are not in the prompt, so only counting on can draft them)
    Workload("count-de", "monate", "Die Monate des Jahres, nummeriert:\n1. Januar\n2. Februar\n3. März\n4."),
    Workload("count-fr", "etapes", "Les étapes pour planter un arbre :\n1) Choisir l'emplacement.\n2) Creuser un "
             "trou deux fois plus large que la motte.\n3)"),
    # ---- editing structured text (copy-heavy)
    Workload("edit-en", "table", f"{MD_TABLE}\nAdd a row for Aarhus, Denmark, 285,000 after Ghent and return the whole "
             "table.\n\n| City | Country | Population |\n"),
    Workload("edit-en", "yaml", f"```yaml\n{YAML_CONF}```\n\nChange the port to 9090 and the log level to debug. "
             "Return the whole file.\n\n```yaml\nserver:\n"),
    # ---- free text (must not lose)
    Workload("free-de", "winter", "Schreibe einen kurzen Text über den ersten Schnee im Dorf.\n\n", 0.8),
    Workload("free-fr", "marche", "Raconte une matinée au marché de Lyon.\n\n", 0.8),
    Workload("free-ja", "sakura", "春の公園について短い文章を書いてください。\n\n", 0.8),
    Workload("explain-en", "tides", "### User\nWhy does the sea have two tides a day?\n### Assistant\n"),
    Workload("explain-fr", "pain", "### Utilisateur\nPourquoi le pain rassis devient-il dur ?\n### Assistant\n"),
]
HELDOUT_CATEGORIES = list(dict.fromkeys(w.category for w in HELDOUT))
COPY_HEAVY = ("quote-de", "quote-fr", "quote-ja", "copy-ja", "copy-de", "list-ja", "edit-en")
SUITES = {"tuned": TUNED, "heldout": HELDOUT, "heldout2": HELDOUT2}  # heldout2: bench/spec_heldout2.py


def chat_prompt(w: Workload) -> list[dict[str, str]]:
    """The workload as a chat model gets it: the user's message (a chat model answers from scratch)."""
    return [{"role": "user", "content": w.prompt}]


def prompt_text(w: Workload, chat: bool) -> str:
    """What the replays decode: the prompt raw (the base starter) or as SmolLM2's ChatML user turn."""
    return f"<|im_start|>user\n{w.prompt}<|im_end|>\n<|im_start|>assistant\n" if chat else w.prompt


def model_path(name: str) -> str:
    """starter (the Gemma 3 270M base starter), smollm2 (SmolLM2-135M-Instruct), or a path."""
    from ggufdesk.core import starter

    if name == "starter":
        return str(starter.starter_model_path())
    if name == "smollm2":
        return str(starter.model_path(starter.SMOLLM2))
    return name


def hint_configs(hints: Iterable[str]) -> dict[str, str]:
    """Configuration name -> lookup_hints_off: every hint on, each one off, all off."""
    names = list(hints)
    from ggufdesk.core.settings import SpeculationSettings

    default = {"default": SpeculationSettings().lookup_hints_off}
    return {**default, "all hints": "", **{f"-{h}": h for h in names}, "no hints": ",".join(names)}


# a CPU's verification costs in plain steps (the starter, 2 threads: engine/speculation/verify_cost.py's
# k = 1, 3, 7, 15), fixed here so that the replay does not depend on how busy the machine is
TABLE = {1: 1.7, 3: 2.5, 7: 3.4, 15: 5.6}
LENGTHS = list(range(1, 17))  # what the oracle may draft per step (the engine's K max)


def measured_table(live, prompt: list[int], max_tokens: int) -> tuple[dict[int, float], float, float]:
    """(k -> cost of a step verifying k drafts / a plain step, ms of a one-row decode, ms a plain step
    spends outside llama_decode) on this machine: see the module docstring."""
    import time

    from bench.spec_oracle import decode_times

    secs = decode_times(live.lm, [(r, "every") for r in range(1, 18)], reps=5)
    runner = live.engine.runner
    real, inside = runner.decode, [0.0, 0]

    def timed(ctx, batch):  # the loop's own decode calls, timed, so that the rest of each step is known
        t = time.perf_counter()
        try:
            return real(ctx, batch)
        finally:
            inside[0] += time.perf_counter() - t
            inside[1] += 1

    runner.decode = timed
    try:
        live.forget()
        t = time.perf_counter()
        live.plain(prompt, max_tokens)
        wall = time.perf_counter() - t
    finally:
        runner.decode = real
    outside = max(0.0, (wall - inside[0]) / max(1, inside[1]))
    return {k: (secs[k] + outside) / (secs[0] + outside) for k in LENGTHS}, secs[0] * 1e3, outside * 1e3


def adaptive_lookup(live, prompt: list[int], table: dict[int, float], text):
    """The engine's lookup drafter as a request gets it by default (adaptive, K up to 16), priced at `table`."""
    from ggufdesk.core.settings import SpeculationSettings
    from ggufdesk.engine.speculation.speculative import make_drafter

    return make_drafter(SpeculationSettings(mode="lookup", k_max=16, adaptive=True), prompt=prompt, draft=None,
                        target=live.lm, costs=table, text=text)


def measured(args, live, chosen, chat: bool) -> int:
    """Adaptive lookup (the default hints) and the oracle, both replayed at this machine's costs."""
    from bench.spec_oracle import gmean, oracle, replay
    from ggufdesk.engine.speculation.speculative import TokenText

    text = TokenText.of(live.lm)
    rows: dict[str, list[tuple[float, float, int, int]]] = {}
    table: dict[int, float] = {}
    for w in chosen:
        prompt = live.tokens(prompt_text(w, chat))
        if not table:
            table, one_ms, outside_ms = measured_table(live, prompt, args.max_tokens)
            print(f"this machine: a one-row decode {one_ms:.1f} ms, {outside_ms:.1f} ms a step outside it; "
                  "a step verifying k drafts, in plain steps: "
                  + ", ".join(f"k={k} {c:.2f}" for k, c in table.items()), flush=True)
        live.forget()
        out = live.plain(prompt, args.max_tokens).tokens
        if len(out) < 2:
            continue
        d = adaptive_lookup(live, prompt, table, text)
        counts = [0, 0]
        x = replay(prompt, out, d, table, counts)
        bound = oracle(prompt, out, table, LENGTHS)
        rows.setdefault(w.category, []).append((x, bound, counts[0], counts[1]))
        print(f"  {w.category}/{w.name}: adaptive {x:.2f} ({counts[1]}/{counts[0]}), oracle {bound:.2f}",
              file=sys.stderr, flush=True)
    print(f"\n{args.suite} suite, {args.model}, greedy, replayed at this machine's costs; x plain (geometric mean):")
    print("| category | adaptive (accepted/drafted) | oracle: the ceiling of lookup here | target |")
    print("|---|---:|---:|---:|")
    for cat, rs in rows.items():
        target = "-" if args.suite != "heldout" else ">= 1.4" if cat in COPY_HEAVY else ">= 0.97"
        print(f"| {cat} | {gmean([r[0] for r in rs]):.2f} ({sum(r[3] for r in rs)}/{sum(r[2] for r in rs)}) | "
              f"{gmean([r[1] for r in rs]):.2f} | {target} |")
    return 0


def main() -> int:
    from bench.spec_oracle import replay
    from ggufdesk.core.settings import LOOKUP_HINTS, LoadSettings, SpeculationSettings
    from ggufdesk.engine.speculation.speculative import TokenText, make_drafter
    from tests.engine.live import Live

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="heldout", choices=list(SUITES))
    ap.add_argument("--model", default="starter", help="starter, smollm2 or a GGUF path")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--categories", default="", help="comma-separated (default: all greedy ones)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--answers", help="a JSON file keeping the plain answers (read if there, else written): "
                    "replay again after a change without decoding again")
    ap.add_argument("--measured", action="store_true", help="replay at this machine's measured costs, beside the "
                    "oracle's ceiling (the default hints only)")
    args = ap.parse_args()
    cats = [c for c in args.categories.split(",") if c]
    chosen = [w for w in SUITES[args.suite] if not w.temperature and (not cats or w.category in cats)]
    live = Live(model_path(args.model), LoadSettings(n_ctx=8192, n_threads=args.threads,
                                                      n_threads_batch=args.threads))
    chat = args.model == "smollm2"
    if args.measured:
        return measured(args, live, chosen, chat)
    text = TokenText.of(live.lm)
    configs = hint_configs(LOOKUP_HINTS)
    rows: dict[str, dict[str, list[tuple[float, int, int]]]] = {}
    saved = json.loads(Path(args.answers).read_text()) if args.answers and Path(args.answers).exists() else {}
    for w in chosen:
        prompt = live.tokens(prompt_text(w, chat))
        key = f"{w.category}/{w.name}"
        if key not in saved:
            live.forget()
            saved[key] = live.plain(prompt, args.max_tokens).tokens
            if args.answers:
                Path(args.answers).write_text(json.dumps(saved))
        out = saved[key]
        if len(out) < 2:
            continue
        for name, off in configs.items():
            spec = SpeculationSettings(mode="lookup", k_max=16, adaptive=True, lookup_hints_off=off)
            d = make_drafter(spec, prompt=prompt, draft=None, target=live.lm, costs=TABLE, text=text)
            counts = [0, 0]
            x = replay(prompt, out, d, TABLE, counts)
            rows.setdefault(w.category, {}).setdefault(name, []).append((x, counts[0], counts[1]))
        print(f"  {w.category}/{w.name}: " + ", ".join(f"{n} {rows[w.category][n][-1][0]:.2f}" for n in configs),
              file=sys.stderr, flush=True)
    print(f"\n{args.suite} suite, {args.model}, greedy, replayed at a fixed cost table; x plain (geometric mean):")
    print("| category | " + " | ".join(configs) + " |")
    print("|---|" + "---:|" * len(configs))
    for cat, per in rows.items():
        cells = []
        for name in configs:
            xs = [r[0] for r in per[name]]
            drafted, accepted = sum(r[1] for r in per[name]), sum(r[2] for r in per[name])
            cells.append(f"{math.prod(xs) ** (1 / len(xs)):.2f} ({accepted}/{drafted})")
        print(f"| {cat} | " + " | ".join(cells) + " |")
    print("cells: replayed x plain (accepted/drafted tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
