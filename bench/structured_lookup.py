"""Prompt lookup under a grammar: constrained answers with adaptive lookup against the same without.

Until this bench's change a request with a JSON schema or tools ran without speculation, so an
agent's tool calls (which copy file paths and code from the conversation) and JSON extraction never
drafted. TASKS were written before the first run: two that copy from the prompt (a record's fields
as JSON; an edit tool's call quoting a line of code), a list extracted from a text, and one with
nothing to copy (records the model makes up), where lookup must not lose. The first run had the tool
call losing to drafts the grammar refused, which the planner now cuts (no constant, nothing chosen
on these tasks); HELD_OUT were written after that and before their first run. Each task runs greedy,
alone, under the request's grammar, plain (speculation off) and with the load's adaptive lookup
(what `ggufdesk serve --lookup` does), alternated within each round with the order swapped every
round; the KV cache and the conversation's n-grams are not reused (`cache_prompt` off,
`lookup_history` off). Prints decode tok/s, the ratio per task (median over rounds) and whether the
two answers are the same text.

    .venv/bin/python bench/structured_lookup.py [starter|smollm2|PATH ...] [--rounds 3] [--tokens 160] [--held-out]
        [--clients]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import serve_settings
from bench.spec_heldout import model_path
from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient

CODE = '''def load_settings(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    timeout = data.get("request_timeout_seconds", 30)
    return Settings(timeout=timeout, retries=data.get("max_retries", 3))
'''
EDIT = {"type": "function", "function": {
    "name": "edit_file", "description": "Replace one exact piece of text in a file with another.",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
        "required": ["path", "old_text", "new_text"]}}}
RECORD = {"type": "object", "properties": {
    "name": {"type": "string"}, "street": {"type": "string"}, "city": {"type": "string"},
    "email": {"type": "string"}, "phone": {"type": "string"}},
    "required": ["name", "street", "city", "email", "phone"]}
NAMES = {"type": "object", "properties": {"functions": {"type": "array", "items": {"type": "string"}}},
         "required": ["functions"]}
MADE_UP = {"type": "array", "minItems": 4, "maxItems": 4, "items": {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1900, "maximum": 2030}},
    "required": ["title", "year"]}}

TASKS: dict[str, dict[str, Any]] = {
    "record": {"json_schema": RECORD, "text": (
        "Put this customer's details into JSON with the keys name, street, city, email and phone.\n\n"
        "Customer: Margarethe Oyelaran-Fitzgerald, living at 1187 Wrenfield Crescent, Port Ellingham. "
        "Reach her at m.oyelaran.fitzgerald@harborline-logistics.example or +44 20 7946 0318.")},
    "edit-tool": {"tools": [EDIT], "tool_choice": "required", "text": (
        f"In src/app/settings_loader.py the timeout key was renamed. The file:\n\n{CODE}\n"
        "Change the line that reads request_timeout_seconds so it reads timeout_s instead, with "
        "the same default. Use the edit_file tool: old_text is that line exactly as it is now.")},
    "names": {"json_schema": NAMES, "text": (
        "List the names of every function this module defines, as JSON {\"functions\": [...]}.\n\n"
        "def parse_header_block(raw): ...\ndef normalise_whitespace(text): ...\n"
        "def split_into_sections(document): ...\ndef merge_adjacent_paragraphs(sections): ...\n"
        "def render_table_of_contents(sections): ...\ndef write_output_bundle(path, sections): ...")},
    "made-up": {"json_schema": MADE_UP, "text": "Invent four films, each with a title and a year, as a JSON array."},
}

# Written after the grammar cut was measured on TASKS, before any run of these: other languages, other
# tools, another shape. Kept apart, never changed on their figures (--held-out).
READ = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the project.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"}},
                   "required": ["path"]}}}
HELD_OUT: dict[str, dict[str, Any]] = {
    "adresse-de": {"json_schema": RECORD, "text": (
        "Schreibe die Angaben dieser Kundin als JSON mit den Schlüsseln name, street, city, email und phone.\n\n"
        "Kundin: Friederike Baumgärtner-Okonkwo, Lindenhofstraße 42a, 70563 Stuttgart-Vaihingen, "
        "E-Mail f.baumgaertner@kanzlei-okonkwo.example, Telefon +49 711 2847 9930.")},
    "read-tool": {"tools": [READ, EDIT], "tool_choice": "auto", "text": (
        "The failing test imports from services/billing/invoice_rendering/pdf_templates.py and the "
        "error points at line 212. Read that file from line 200 to see what is wrong.")},
    "produits-fr": {"json_schema": NAMES, "text": (
        "Donne en JSON {\"functions\": [...]} les noms des fonctions de ce module.\n\n"
        "def calculer_remise_fidelite(client): ...\ndef formater_facture_mensuelle(facture): ...\n"
        "def envoyer_rappel_de_paiement(client, echeance): ...\ndef archiver_commandes_expirees(date): ...")},
    "opinion": {"json_schema": {"type": "object", "properties": {
        "summary": {"type": "string", "maxLength": 200}, "score": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["summary", "score"]},
        "text": "Give your opinion of rainy Sundays as JSON: a summary and a score."},
}


def run(client: EngineClient, task: dict[str, Any], spec: str, tokens: int,
        logprobs: int = 0) -> tuple[float, list[P.Token], P.Stats]:
    kw = {k: task[k] for k in ("json_schema", "tools", "tool_choice") if k in task}
    rid = client.generate(messages=[{"role": "user", "content": task["text"]}],
                          sampling={"temperature": 0.0, "max_tokens": tokens}, cache_prompt=False,
                          speculation={"mode": spec, "lookup_history": False}, logprobs=logprobs, **kw)
    out, stats = [], None
    for ev in client.stream(rid, timeout=600):
        if isinstance(ev, P.Token):
            out.append(ev)
        elif isinstance(ev, P.Stats):
            stats = ev
        elif isinstance(ev, P.Error):
            raise SystemExit(f"engine error: {ev.message}")
    assert stats is not None
    return stats.decode_tok_s, out, stats


def divergence(client: EngineClient, task: dict[str, Any], tokens: int) -> str:
    """Where the two answers part, and how close plain decoding's choice there was (the gap between
    its two best tokens' log-probabilities): verification rows are computed in a batch of several,
    and a quantized model's sums there differ in the last bits from a one-row step's
    (docs/engine.md), which decides a near tie either way. Logprobs cost time: a separate run."""
    _, plain, _ = run(client, task, "off", tokens, logprobs=2)
    _, spec, _ = run(client, task, "lookup", tokens, logprobs=2)
    a = [e for t in plain for e in (t.logprobs or [])]
    b = [e for t in spec for e in (t.logprobs or [])]
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x["id"] != y["id"]), None)
    if i is None:
        return "the same tokens when logprobs are asked for"
    top = a[i]["top"]
    gap = top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else float("inf")
    return f"part at token {i} ({a[i]['token']!r} / {b[i]['token']!r}), plain's top two {gap:.3f} apart"


def bench(model: str, rounds: int, tokens: int, tasks: dict[str, dict[str, Any]]) -> list[str]:
    client = EngineClient()
    client.start()
    lines = [f"model {Path(model).name}, {rounds} rounds, greedy, at most {tokens} tokens"]
    print(lines[0], flush=True)
    try:
        client.load(model, settings=LoadSettings(n_ctx=4096, n_threads=2, n_threads_batch=2),
                    speculation=SpeculationSettings(mode="lookup"))
        for name, task in tasks.items():
            run(client, task, "lookup", 8)  # warm: the task's grammar and the first prompt
            speeds: dict[str, list[float]] = {"off": [], "lookup": []}
            texts: dict[str, set[str]] = {"off": set(), "lookup": set()}
            drafted = accepted = n_gen = 0
            for r in range(rounds):
                for spec in (("off", "lookup") if r % 2 == 0 else ("lookup", "off")):
                    tok_s, out, st = run(client, task, spec, tokens)
                    speeds[spec].append(tok_s)
                    texts[spec].add("".join(t.text for t in out))
                    if spec == "lookup":
                        drafted, accepted, n_gen = drafted + st.drafted, accepted + st.accepted, st.n_gen
            ratios = [b / a for a, b in zip(speeds["off"], speeds["lookup"])]
            same = texts["off"] == texts["lookup"] and len(texts["off"]) == 1
            lines.append(
                f"  {name:10s} plain {statistics.median(speeds['off']):6.1f} tok/s, lookup "
                f"{statistics.median(speeds['lookup']):6.1f}: {statistics.median(ratios):.2f}x "
                f"(runs {', '.join(f'{x:.2f}' for x in ratios)}); {n_gen} tokens, drafted {drafted}, "
                f"accepted {accepted} over the rounds; same answer: "
                f"{'yes' if same else 'no: ' + divergence(client, task, tokens)}")
            print(lines[-1], flush=True)
    finally:
        client.shutdown()
    return lines


def _client(client: EngineClient, tasks: dict[str, dict[str, Any]], names: list[str], i: int, spec: str,
            tokens: int, counts: list[int]) -> None:
    """Client i: every task once, one after another, from the i-th on; its tokens into counts[i]."""
    for j in range(len(names)):
        counts[i] += run(client, tasks[names[(i + j) % len(names)]], spec, tokens)[2].n_gen


def four_clients(model: str, rounds: int, tokens: int, tasks: dict[str, dict[str, Any]]) -> None:
    """Four clients at once, each sending every task once (starting at a different one), greedy, under
    each task's grammar: tokens of all requests over the time from the first request to the last
    answer, lookup against none, alternated, order swapped each round (an engine for 8 sequences, as
    bench/batch.py part 6 loads). Prints each round's ratio."""
    client = EngineClient()
    client.start()
    names = list(tasks)
    print(f"model {Path(model).name}, four clients, {rounds} rounds, greedy, at most {tokens} tokens", flush=True)
    try:
        client.load(model, settings=serve_settings(n_threads=2, n_threads_batch=2),
                    speculation=SpeculationSettings(mode="lookup"))
        for name in names:
            run(client, tasks[name], "lookup", 8)  # warm: each task's grammar and prompt
        speeds: dict[str, list[float]] = {"off": [], "lookup": []}
        for r in range(rounds):
            for spec in (("off", "lookup") if r % 2 == 0 else ("lookup", "off")):
                counts = [0] * 4
                t0 = time.perf_counter()
                threads = [threading.Thread(target=_client, args=(client, tasks, names, i, spec, tokens, counts))
                           for i in range(4)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                speeds[spec].append(sum(counts) / (time.perf_counter() - t0))
        ratios = [b / a for a, b in zip(speeds["off"], speeds["lookup"])]
        print(f"  plain {statistics.median(speeds['off']):6.1f} tok/s, lookup "
              f"{statistics.median(speeds['lookup']):6.1f}: {statistics.median(ratios):.2f}x "
              f"(runs {', '.join(f'{x:.2f}' for x in ratios)})", flush=True)
    finally:
        client.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["starter", "smollm2"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--held-out", action="store_true", help="the held-out tasks instead")
    ap.add_argument("--clients", action="store_true", help="four clients at once instead of one request at a time")
    args = ap.parse_args()
    for m in args.models:
        (four_clients if args.clients else bench)(model_path(m), args.rounds, args.tokens,
                                                   HELD_OUT if args.held_out else TASKS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
