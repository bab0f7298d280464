"""A mixture of experts that does not fit a VRAM budget: the experts-on-the-CPU split against the
whole-layer split, predicted (core/planner.py) and measured (the engine, a CUDA build), on a lent GPU.

    python3 bench/moe_split.py OUT_DIR [--model PATH] [--vram-gb G]

Without --model it writes a synthetic mixture of experts with random f16 weights (tests/fixtures/
moe.py: 16 layers, 128 experts, 8 used, shared experts, ~13 GB) and plans it for a VRAM budget of
half its size (--vram-gb, default), so that neither split holds the whole model on the GPU: the
whole-layer split puts as many layers as fit on the GPU; the experts split keeps every layer there
but the routed experts of the first N layers. Both loads are measured (decode tok/s, median of 3)
and written to OUT_DIR/moe_split.json. Needs an NVIDIA GPU (NVML) and a CUDA llama-cpp-python.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "app"))

from bench.gpu import decode_tok_s  # noqa: E402
from ggufdesk.core import gguf_meta, hardware, planner  # noqa: E402
from ggufdesk.core.settings import LoadSettings  # noqa: E402
from ggufdesk.engine.link.client import EngineClient  # noqa: E402
from tests.fixtures.moe import MoeSpec, write_moe  # noqa: E402

GB = 1 << 30
SPEC = MoeSpec(n_layer=16, n_embd=2048, n_head=16, n_head_kv=4, head_dim=128, n_expert=128, n_expert_used=8,
               n_ff_exp=512, n_ff_shexp=1536)


def budgeted(hw: hardware.HardwareInfo, vram: int) -> hardware.HardwareInfo:
    """The machine as the planner sees it with only `vram` bytes of its first GPU free."""
    g = dataclasses.replace(hw.gpus[0], vram_free=vram + max(planner.VRAM_MARGIN[0],
                                                             int(hw.gpus[0].vram_total * planner.VRAM_MARGIN[1])))
    return dataclasses.replace(hw, gpus=(g,))


def measure(path: Path, load: LoadSettings) -> dict:
    with EngineClient(auto_restart=False) as c:
        loaded = c.load(str(path), settings=load)
        dec, pre = decode_tok_s(c)
        return {"decode_tok_s": round(dec, 2), "prefill_tok_s": round(pre, 1), "gpu_bytes": loaded.memory.get("gpu", 0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--vram-gb", type=float)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    hw = hardware.probe()
    if not hw.gpus:
        print("no NVIDIA GPU found (NVML): this bench needs one", file=sys.stderr)
        return 2
    path = args.model or write_moe(args.out / "moe.gguf", SPEC)
    info = gguf_meta.read_gguf(path)
    vram = int((args.vram_gb or info.weight_bytes / GB / 2) * GB)
    machine = budgeted(hw, vram)
    layers = planner.plan(info, machine, n_ctx=4096, n_cpu_moe=0)
    experts = planner.plan(info, machine, n_ctx=4096)
    rows = {}
    for name, p in (("whole_layers", layers), ("experts_on_cpu", experts)):
        load = LoadSettings(n_ctx=4096, n_gpu_layers=p.n_gpu_layers, n_cpu_moe=p.n_cpu_moe)
        rows[name] = {"n_gpu_layers": p.n_gpu_layers, "n_cpu_moe": p.n_cpu_moe, "pred_vram_bytes": p.vram_bytes,
                      "pred_decode_tok_s": round(p.pred_decode_tok_s, 2), **measure(path, load)}
        r = rows[name]
        print(f"{name:15s} ngl {r['n_gpu_layers']:3d} cpu-moe {r['n_cpu_moe']:3d} | VRAM pred "
              f"{r['pred_vram_bytes'] / GB:6.1f} GB, used {r['gpu_bytes'] / GB:6.1f} GB | decode pred "
              f"{r['pred_decode_tok_s']:7.1f} / meas {r['decode_tok_s']:7.1f} tok/s")
    result = {"model": str(path), "weight_bytes": info.weight_bytes, "vram_budget": vram, **rows}
    (args.out / "moe_split.json").write_text(json.dumps(result, indent=1))
    faster = rows["experts_on_cpu"]["decode_tok_s"] > rows["whole_layers"]["decode_tok_s"]
    print("the experts split is faster, as predicted" if faster else "the experts split is NOT faster")
    return 0 if faster else 1


if __name__ == "__main__":
    sys.exit(main())
