"""Structured-output benchmark: grammar-constrained vs unconstrained decoding on the starter model.

Side by side in one run, interleaved rounds, medians: decode tok/s and time to first token
(grammar compilation counted: it happens between the request and the first token) for the same
prompt with and without a JSON schema, the ratio each way, how often the fast single-token check
was rejected, and — over the 50 test schemas (tests/fixtures/schemas.py) — how many outputs of the
real model parse and validate.

    .venv/bin/python bench/structured.py [--rounds 5] [--tokens 160] [--schemas 50]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jsonschema

from ggufdesk.core.settings import LoadSettings
from ggufdesk.core.starter import starter_model_path
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.fixtures.schemas import SCHEMAS

# A list of records: long enough output to measure decode, natural for a base model to continue.
SCHEMA = {"type": "array", "minItems": 5, "maxItems": 5, "items": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                     "country": {"type": "string", "maxLength": 24},
                                     "population": {"type": "integer", "minimum": 0, "maximum": 50000000}},
    "required": ["city", "country", "population"]}}
PROMPT = ("The five largest cities of Europe, as a JSON array of objects with the keys city, country and "
          "population:\n")


def one(client: EngineClient, tokens: int, schema: dict | None) -> dict:
    t0 = time.perf_counter()
    kw = {"json_schema": schema} if schema is not None else {}
    rid = client.generate(prompt=PROMPT, sampling={"temperature": 0.0, "max_tokens": tokens}, **kw)
    text, stats, done, first = [], None, None, None
    for ev in client.stream(rid):
        if isinstance(ev, P.Token):
            first = first or time.perf_counter()
            text.append(ev.text)
        elif isinstance(ev, P.Stats):
            stats = ev
        elif isinstance(ev, P.Done):
            done = ev
        elif isinstance(ev, P.Error):
            raise SystemExit(f"engine error: {ev.message}")
    return {"tok_s": stats.decode_tok_s, "ttft": (first or time.perf_counter()) - t0, "n": stats.n_gen,
            "text": "".join(text), "finish": done.finish_reason}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--schemas", type=int, default=len(SCHEMAS), help="how many test schemas to validate")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    load = LoadSettings(n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads)
    print(f"starter model, {args.threads} threads, {args.tokens} tokens, {args.rounds} interleaved rounds; "
          f"load average {os.getloadavg()[0]:.2f}")
    with EngineClient(auto_restart=False) as client:
        client.load(str(starter_model_path()), settings=load)
        one(client, 8, None)  # warm-up
        runs: dict[str, list[dict]] = {"plain": [], "schema": []}
        for _ in range(args.rounds):
            for name, schema in (("plain", None), ("schema", SCHEMA)):
                client.generate(prompt="reset the prefix cache", sampling={"max_tokens": 1})
                runs[name].append(one(client, args.tokens, schema))
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("tok_s", "ttft", "n")} for k, v in runs.items()}
        for k, m in med.items():
            print(f"  {k:7s} decode {m['tok_s']:6.1f} tok/s   TTFT {m['ttft'] * 1000:7.1f} ms   tokens {m['n']:.0f}")
        print(f"  constrained / plain: decode {med['schema']['tok_s'] / med['plain']['tok_s']:.3f}x "
              f"(target >= 0.8x), TTFT {med['schema']['ttft'] / med['plain']['ttft']:.3f}x (target <= 1.1x)")
        last = runs["schema"][-1]
        try:
            jsonschema.validate(json.loads(last["text"]), SCHEMA)
            print(f"  the constrained answer validates ({last['finish']}): {last['text'][:100]}...")
        except (ValueError, jsonschema.ValidationError) as e:
            print(f"  the constrained answer does NOT validate ({last['finish']}): {e}")
        ok = 0
        t0 = time.perf_counter()
        for name, schema in SCHEMAS[: args.schemas]:
            prompt = f"A JSON value that matches the schema {json.dumps(schema)}:\n"
            rid = client.generate(prompt=prompt, sampling={"temperature": 0.0, "max_tokens": 300},
                                  json_schema=schema)
            text, done = [], None
            for ev in client.stream(rid):
                if isinstance(ev, P.Token):
                    text.append(ev.text)
                elif isinstance(ev, P.Done):
                    done = ev
            try:
                jsonschema.validate(json.loads("".join(text)), schema)
                ok += 1
            except (ValueError, jsonschema.ValidationError) as e:
                print(f"  schema {name!r}: invalid ({done.finish_reason if done else 'error'}): {e}")
        n = min(args.schemas, len(SCHEMAS))
        print(f"  {ok}/{n} test schemas: the starter's output parses and validates "
              f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
