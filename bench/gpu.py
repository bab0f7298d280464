"""GPU check, run on a lent NVIDIA machine: the NVML probe, and the planner's VRAM and decode
predictions against what the engine measures with a CUDA build of llama-cpp-python.

    python3 bench/gpu.py OUT_DIR      (bench/gpu_check.sh builds the CUDA wheel and calls this)
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from ggufdesk.core import gguf_meta, hardware, planner
from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.fixtures import ggufs


def gpu_used() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    except Exception:  # noqa: BLE001 - a dry run on a machine without NVIDIA
        return 0


def decode_tok_s(client: EngineClient, n: int = 128) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) as the engine reports them, median of 3."""
    dec, pre = [], []
    for i in range(3):
        rid = client.generate(prompt=f"run {i} the cat and the dog " * 20,
                              sampling=SamplingSettings(temperature=0, max_tokens=n))
        for ev in client.stream(rid):
            if isinstance(ev, P.Stats) and ev.final:
                dec.append(ev.decode_tok_s)
                pre.append(ev.prefill_tok_s)
            elif isinstance(ev, P.Error):
                raise SystemExit(ev.message)
    return statistics.median(dec), statistics.median(pre)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    hw = hardware.probe()
    (out / "probe.json").write_text(json.dumps(hw.to_json(), indent=2, default=str))
    small = os.environ.get("GPU_CHECK_DRY_RUN") == "1"
    shapes = {  # (layers, n_embd, heads, kv heads, n_ff): 16 wide layers, then 32 narrower ones
        "16x2048": (2, 256, 2, 2, 512) if small else (16, 2048, 16, 8, 5632),
        "32x1536": (2, 128, 2, 2, 256) if small else (32, 1536, 12, 4, 4096),
    }
    models = {}
    for name, (nl, ne, nh, nkv, nff) in shapes.items():
        path = ggufs.write_tiny_llama(Path(f"/tmp/gpu-{name}.gguf"), ggufs.TinySpec(
            n_layer=nl, n_embd=ne, n_head=nh, n_head_kv=nkv, n_ff=nff, n_ctx_train=32768, dtype="f16"))
        models[name] = (path, gguf_meta.read_gguf(path))
    rows = []
    configs = [("16x2048", -1, 4096), ("16x2048", -1, 16384), ("16x2048", 8, 4096), ("16x2048", 0, 4096),
               ("32x1536", -1, 4096), ("32x1536", 16, 4096), ("32x1536", 0, 4096)]
    # predictions first: the engine records real runs (self-calibration), which would otherwise
    # feed the measurement back into the later predictions
    plans = {c: planner.plan(models[c[0]][1], hw, n_ctx=c[2], n_gpu_layers=c[1]) for c in configs}
    with EngineClient(auto_restart=False) as client:
        for name, ngl, ctx in configs:
            model = models[name][0]
            pl = plans[(name, ngl, ctx)]
            client.unload()
            time.sleep(0.5)
            before = gpu_used()
            ld = client.load(str(model), settings=LoadSettings(n_ctx=ctx, n_gpu_layers=ngl, use_mmap=False))
            after = gpu_used()
            dec, pre = decode_tok_s(client)
            row = {"model": name, "n_gpu_layers": ngl, "n_ctx": ctx, "fit": pl.fit, "pred_vram": pl.vram_bytes,
                   "pred_vram_less_cuda_context": pl.vram_bytes - pl.memory.cuda_context,
                   "nvml_vram_delta": after - before, "llama_gpu_buffers": ld.memory.get("gpu", 0),
                   "llama_memory": ld.memory, "pred_decode": round(pl.pred_decode_tok_s, 1),
                   "decode": dec, "pred_prefill": round(pl.pred_prefill_tok_s, 1), "prefill": pre}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "gpu_rows.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
