"""Checks `run` makes before the engine starts: readable model and draft, and a plan that fits."""
from __future__ import annotations

from pathlib import Path

from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import GGUFInfo
from ggufdesk.core.hardware import HardwareInfo
from ggufdesk.core.load_plan import plan_load
from ggufdesk.core.settings import LoadSettings, SpeculationSettings

MiB = 1 << 20


def memory_hardware() -> HardwareInfo:
    """GPUs and free RAM now, without the one-off bandwidth measurement (fit needs no speeds)."""
    from ggufdesk.core import hardware

    return hardware.memory_now()


def check(model: str, load: LoadSettings, spec: SpeculationSettings,
          hw: HardwareInfo | None = None) -> GGUFInfo:
    """The model's header, after refusing what cannot work: a broken model or draft file, or a
    load the planner says will not fit (its numbers in the message). Nothing is loaded."""
    hw = hw or memory_hardware()
    info, p = plan_load(model, load, spec, hw)
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
