"""Memory for the router's models: what one needs (the planner's estimate) and what they may fill together."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SpeculationSettings

log = logging.getLogger("ggufdesk.server.budget")
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Need:
    """Bytes of RAM and VRAM (a model's estimate, a sum of them, or a budget)."""

    ram: int = 0
    vram: int = 0

    def __add__(self, other: Need) -> Need:
        return Need(self.ram + other.ram, self.vram + other.vram)

    def within(self, budget: Need) -> bool:
        return self.ram <= budget.ram and self.vram <= budget.vram

    def describe(self) -> str:
        return f"{self.ram / MiB:.0f} MiB of RAM" + (f" and {self.vram / MiB:.0f} MiB of VRAM" if self.vram else "")


def planner_need(path: str, load: LoadSettings, speculation: SpeculationSettings) -> Need:
    """The planner's memory for this load (weights, KV cache, compute buffers, a draft), fit or not.

    Raises KnownError for a file whose header cannot be read: that load would fail anyway."""
    from ggufdesk.core import hardware
    from ggufdesk.core.load_plan import plan_load

    _, p = plan_load(path, load, speculation, hardware.memory_now())
    return Need(p.ram_bytes, p.vram_bytes)


def planner_budget() -> Need:
    """RAM and VRAM free now minus the planner's margins (core/planner.py budgets)."""
    from ggufdesk.core import hardware, planner

    return Need(*planner.budgets(hardware.memory_now()))


class Budget:
    """What the router's models may take together.

    Fixed (`ram`/`vram` given: tests, or a user's cap), or measured: the planner's budget, taken when
    the router holds no model (so what it measures is everyone else's use) and kept while it holds
    some (their own pages would otherwise count against them). Measuring is cheap (psutil, NVML).
    """

    def __init__(self, *, ram: int | None = None, vram: int | None = None,
                 measure: Callable[[], Need] = planner_budget) -> None:
        self._fixed = Need(ram or 0, vram or 0) if ram is not None else None
        self._measure = measure
        self._last: Need | None = None

    def capacity(self, holding: bool) -> Need:
        if self._fixed is not None:
            return self._fixed
        if self._last is None or not holding:
            try:
                self._last = self._measure()
            except (KnownError, OSError) as e:  # cannot tell: do not refuse on a guess
                log.warning("cannot measure free memory: %s", e)
                self._last = Need(1 << 62, 1 << 62)
        return self._last


def too_large(model_id: str, path: str, n_ctx: int, need: Need, capacity: Need) -> str:
    """The 400's words for a model that cannot fit even with every other model unloaded."""
    return (f"the model {model_id!r} ({Path(path).name}) with {n_ctx} tokens of context cannot be loaded: "
            f"the planner says it needs {need.describe()}, and this server may use {capacity.describe()} for "
            "models with every other model unloaded; use a smaller context or model (`ggufdesk plan` shows "
            "the numbers)")
