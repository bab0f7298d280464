"""`ggufdesk recommend REPO`: a hub repo's GGUF quants ranked for this machine."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ggufdesk.cli import print_json
from ggufdesk.core import hardware, planner, quants
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import read_gguf

NAME = "recommend"
HELP = "rank a Hugging Face repo's GGUF files (or a library model's local quants) for this machine"
MiB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("repo", nargs="?", help="owner/name of a hub repo with .gguf files, or a library id "
                                           "(ranks the quants of it on this computer); default: the chat starter")
    p.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--workload", choices=("chat", "long_docs"), default="chat",
                   help="chat favours decode speed, long_docs prompt processing")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def list_gguf_files(repo: str) -> list[tuple[str, int]]:
    """(first file, bytes) of each model in the repo, smallest first; a split set counts once."""
    from ggufdesk.core.downloads import list_gguf

    models = list_gguf(repo, endpoint=os.environ.get("HF_ENDPOINT") or None)
    if not models:
        raise KnownError(f"{repo}: the repository has no .gguf files")
    return sorted(((m.first, m.size) for m in models), key=lambda kv: kv[1])


def local_quants(name: str | None) -> tuple[str, list[tuple[str, int]], str]:
    """(label, [(file, bytes)], a file to read) for a library model: its quants in the library."""
    from ggufdesk.core import library

    models = library.entries()
    hit = library.find(name, models) if name else next((m for m in models if m.source == "starter"), None)
    if hit is None and name and Path(name).is_file():
        return name, [(Path(name).name, Path(name).stat().st_size)], name
    if hit is None:
        if not name:
            library.resolve(None)  # says that no starter is installed
        ids = ", ".join(m.id for m in models) or "none yet"
        raise KnownError(f"{name!r} is not a repository id (owner/name) nor a model in the library (ids: {ids})")
    same = [hit]
    if hit.source == "hf-cache":  # every quant of that repo downloaded here
        repo = hit.name.rsplit("/", 1)[0] + "/"
        same = [m for m in models if m.source == "hf-cache" and m.name.startswith(repo)]
    return hit.id, sorted(((m.path.name, m.size) for m in same), key=lambda kv: kv[1]), str(library.file_for(hit))


def run(args: argparse.Namespace) -> int:
    if args.repo and "/" in args.repo:
        files = list_gguf_files(args.repo)
        # read one quant's header remotely for the architecture; prefer a mid-size one (Q4_K_M)
        ref_name = next((f for f, _ in files if quants.quant_from_name(f) == "Q4_K_M"), files[len(files) // 2][0])
        ref = read_gguf(f"hf://{args.repo}/{ref_name}")
    else:
        args.repo, files, path = local_quants(args.repo)
        ref = read_gguf(path)
    hw = hardware.probe()
    ranked = planner.rank_quants(files, ref, hw, n_ctx=args.ctx, workload=args.workload)
    best = next((r for r in ranked if r.recommended), None)
    if args.json:
        print_json({"repo": args.repo, "architecture": ref.architecture, "n_ctx": args.ctx,
                    "recommended": best.file if best else None,
                    "explanation": best.plan.explanation if best else "no quant fits this machine",
                    "quants": [r.to_json() for r in ranked]})
        return 0
    print(f"{args.repo} ({ref.architecture}, {ref.n_layer} layers), context {args.ctx}:")
    for r in ranked:
        mark = "*" if r.recommended else " "
        print(f"{mark} {r.file:60s} {r.size / MiB:8.0f} MiB  {r.plan.fit:9s} "
              f"~{r.plan.pred_decode_tok_s:6.1f} tok/s  ppl +{r.ppl_delta:.3f}")
    print(best.plan.explanation if best else "No quant in this repository fits this machine.")
    return 0
