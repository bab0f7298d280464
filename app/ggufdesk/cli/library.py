"""`ggufdesk library`: the models on this machine (HF cache, added files, LM Studio, Ollama)."""
from __future__ import annotations

import argparse

from ggufdesk.cli import print_json
from ggufdesk.core import library

NAME = "library"
HELP = "list local models (Hugging Face cache, added files, LM Studio, Ollama); --add a GGUF by path"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--add", metavar="PATH", action="append", default=[], help="add a GGUF file (used in place)")
    p.add_argument("--remove", metavar="PATH", action="append", default=[], help="forget an added file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    for path in args.add:
        library.add_path(path)
    for path in args.remove:
        library.remove_path(path)
    models = library.list_models()
    if args.json:
        print_json({"models": [m.as_json() for m in models]})
        return 0
    if not models:
        print("no local models yet: `ggufdesk download REPO FILE` or `ggufdesk library --add PATH`")
    for m in models:
        parts = f" ({m.parts} parts)" if m.parts > 1 else ""
        print(f"{m.source:>9}  {m.quant or '?':>8}  {m.size / 1e9:7.2f} GB  {m.name}{parts}\n{'':>31}{m.path}")
    return 0
