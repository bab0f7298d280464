"""Checks `run` makes before the engine starts: readable model and draft, and a plan that fits."""
from __future__ import annotations

from pathlib import Path

from ggufdesk.core import planner
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import GGUFInfo, read_gguf
from ggufdesk.core.hardware import HardwareInfo
from ggufdesk.core.settings import LoadSettings, SpeculationSettings

MiB = 1 << 20


def memory_hardware() -> HardwareInfo:
    """GPUs and free RAM now, without the one-off bandwidth measurement (fit needs no speeds)."""
    import psutil

    from ggufdesk.core import hardware

    gpus, driver, notes = hardware.probe_nvidia()
    vm = psutil.virtual_memory()
    return HardwareInfo(gpus=tuple(gpus), cpu=hardware.cpu_info(), ram_total=int(vm.total),
                        ram_available=int(vm.available), ram_bandwidth_gbs=20.0,
                        ram_bandwidth_source="assumed", driver=driver, notes=tuple(notes))


def check(model: str, load: LoadSettings, spec: SpeculationSettings,
          hw: HardwareInfo | None = None) -> GGUFInfo:
    """The model's header, after refusing what cannot work: a broken model or draft file, or a
    load the planner says will not fit (its numbers in the message). Nothing is loaded."""
    info = read_gguf(model)
    draft = None
    if spec.mode == "draft" and spec.draft_model:
        try:
            draft = read_gguf(spec.draft_model)
        except KnownError as e:
            raise KnownError(f"the draft model cannot be used: {e}") from None
    hw = hw or memory_hardware()
    p = planner.plan(info, hw, n_ctx=load.n_ctx, draft=draft, type_k=load.type_k, type_v=load.type_v,
                     n_gpu_layers=load.n_gpu_layers, n_ubatch=load.n_ubatch, flash_attn=load.flash_attn,
                     n_cpu_moe=load.n_cpu_moe)
    if p.fit == "too_large":
        m = p.memory
        raise KnownError(
            f"{Path(model).name} with {load.n_ctx} tokens of context will not fit: it needs "
            f"{p.ram_bytes / MiB:.0f} MiB of RAM (weights {(m.weights_cpu + m.weights_gpu) / MiB:.0f}, "
            f"KV cache {(m.kv_cpu + m.kv_gpu) / MiB:.0f}, compute {(m.compute_cpu + m.compute_gpu) / MiB:.0f} MiB)"
            + (f" and {p.vram_bytes / MiB:.0f} MiB of VRAM" if p.vram_bytes else "")
            + f", and {p.ram_budget / MiB:.0f} MiB of RAM"
            + (f" / {p.vram_budget / MiB:.0f} MiB of VRAM" if hw.gpus else "")
            + " can be used now. Use a smaller --ctx, a quantized --kv-type (q8_0), or a smaller model"
            " (`ggufdesk plan` shows the numbers).")
    return info
