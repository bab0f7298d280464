"""`ggufdesk library`: the models on this machine (starters, HF cache, added files, LM Studio, Ollama), by id."""
from __future__ import annotations

import argparse

from ggufdesk.cli import print_json
from ggufdesk.core import library

NAME = "library"
HELP = "list local models with their ids (starters, Hugging Face cache, added files, LM Studio, Ollama); --add a GGUF"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--add", metavar="PATH", action="append", default=[], help="add a GGUF file (used in place)")
    p.add_argument("--remove", metavar="PATH", action="append", default=[], help="forget an added file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def capabilities(caps: dict[str, bool]) -> str:
    names = {"chat_template": "chat", "tools": "tools", "embedding": "embedding", "vision": "vision"}
    return ",".join(word for key, word in names.items() if caps.get(key)) or "text"


def run(args: argparse.Namespace) -> int:
    for path in args.add:
        library.add_path(path)
    for path in args.remove:
        library.remove_path(path)
    models = library.entries()
    rows = [{**m.as_json(), **library.facts(m)} for m in models]
    if args.json:
        print_json({"models": rows})
        return 0
    if not rows:
        print("no local models yet: `ggufdesk download REPO FILE` or `ggufdesk library --add PATH`; "
              "`pip install 'ggufdesk[starter]'` adds the offline starters")
    for r in rows:
        parts = f" ({r['parts']} parts)" if r["parts"] > 1 else ""
        print(f"{r['id']:<32} {r['source']:>9}  {r['quant'] or '?':>8}  {r['size'] / 1e9:6.2f} GB  "
              f"{capabilities(r['capabilities']):<14} {r['name']}{parts}\n{'':>33}{r['path']}")
        if r.get("projector_missing"):
            print(f"{'':>33}a vision model without its projector: it reads text only; {r['projector_missing']}")
    return 0
