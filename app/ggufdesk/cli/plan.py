"""`ggufdesk plan MODEL`: memory, GPU layers and speed to expect, before loading (or downloading)."""
from __future__ import annotations

import argparse

from ggufdesk.cli import print_json
from ggufdesk.core import hardware, planner
from ggufdesk.core.gguf_meta import read_gguf
from ggufdesk.core.projector import projector_beside, read_projector
from ggufdesk.core.settings import KV_TYPES

NAME = "plan"
HELP = "predict memory, GPU layers and tok/s for a model (path, library id or hf://repo/file.gguf)"
MiB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="a .gguf path, a library id (`ggufdesk library`) or hf://owner/repo/"
                                            "file.gguf (reads the header only); default: the chat starter")
    p.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--draft", help="draft model for speculative decoding (path, library id or hf://...)")
    p.add_argument("--kv-type", default="f16", choices=KV_TYPES, help="KV cache type for K and V")
    p.add_argument("--gpu-layers", type=int, default=None, help="force this many GPU layers (-1 = all)")
    p.add_argument("--ubatch", type=int, default=512, help="micro-batch size (default 512)")
    p.add_argument("--n-cpu-moe", type=int, default=None, metavar="N",
                   help="mixture of experts: keep the experts of the first N layers in RAM (default: planned)")
    p.add_argument("--mmproj", help="a vision model's projector (path or hf://...; default: the one beside "
                                    "the model, if any); its memory and the tokens an image takes are counted")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from ggufdesk.cli.run import library_file
    from ggufdesk.core.library import resolve

    source = resolve(args.model)
    info = read_gguf(source)
    draft = read_gguf(library_file(args.draft)) if args.draft else None
    mmproj = args.mmproj or (None if str(source).startswith("hf://") else projector_beside(source))
    proj = read_projector(mmproj) if mmproj else None
    hw = hardware.probe()
    p = planner.plan(info, hw, n_ctx=args.ctx, draft=draft, type_k=args.kv_type, type_v=args.kv_type,
                     n_gpu_layers=args.gpu_layers, n_ubatch=args.ubatch, n_cpu_moe=args.n_cpu_moe, projector=proj)
    if args.json:
        d = p.to_json()
        d.update(architecture=info.architecture, n_layer=info.n_layer, file_bytes=info.file_bytes,
                 mmproj=str(mmproj) if mmproj else None)
        print_json(d)
        return 0
    m = p.memory
    print(f"{info.source}: {info.architecture}, {info.n_layer} layers, {p.quant or '?'}, "
          f"{info.file_bytes / MiB:.0f} MiB")
    print(f"fit: {p.fit}, GPU layers {p.n_gpu_layers}"
          + (f", experts of {p.n_cpu_moe} layers on the CPU (--n-cpu-moe {p.n_cpu_moe})" if p.n_cpu_moe else ""))
    print(f"memory: weights {(m.weights_cpu + m.weights_gpu) / MiB:.0f} MiB, KV {(m.kv_cpu + m.kv_gpu) / MiB:.0f} MiB, "
          f"compute {(m.compute_cpu + m.compute_gpu) / MiB:.0f} MiB -> RAM {p.ram_bytes / MiB:.0f} MiB, "
          f"VRAM {p.vram_bytes / MiB:.0f} MiB")
    if proj is not None:
        print(f"vision: projector {proj.projector_type} {p.projector_bytes / MiB:.0f} MiB "
              f"(weights {proj.weight_bytes / MiB:.0f} MiB + encoder), ~{p.image_tokens} tokens per image")
    print(f"speed: prefill ~{p.pred_prefill_tok_s:.0f} tok/s, decode ~{p.pred_decode_tok_s:.1f} tok/s "
          f"(~{p.pred_decode_tok_s_full:.1f} with the context full)")
    print(p.explanation)
    for a in p.advice:
        print(f"tip: {a}")
    return 0
