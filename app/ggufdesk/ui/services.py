"""What the model wizard needs from core/ (probe, catalog, planner, downloads, library), in one place.

The wizard only talks to a ModelServices; tests pass a fake with the same methods. Every method
here may block (network, disk, measuring RAM) and is called from a background task.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SpeculationSettings

log = logging.getLogger("ggufdesk.ui.services")

FIT_WORDS = {
    "full_gpu": "fits on the GPU",
    "partial": "GPU + CPU",
    "cpu": "runs on the CPU",
    "too_large": "too large",
    "unknown": "unknown",
}


@dataclass(slots=True, kw_only=True)
class ModelChoice:
    """One row of the model list: a file on disk or a file in a hub repo, with its plan."""

    label: str
    source: str  # "catalog" | "repo" | "starter" | "disk" | "file"
    repo: str | None = None
    filename: str | None = None
    path: Path | None = None  # set when the file is on disk
    size_bytes: int = 0
    fit: str = "unknown"
    n_gpu_layers: int = 0
    n_ctx: int = 4096
    pred_prefill_tok_s: float | None = None
    pred_decode_tok_s: float | None = None
    recommended: bool = False
    note: str = ""
    draft: ModelChoice | None = None

    @property
    def needs_download(self) -> bool:
        return self.path is None or not Path(self.path).is_file()


@dataclass(slots=True, kw_only=True)
class Selection:
    """What the wizard hands back: a model on disk and how to load it."""

    path: Path
    load: LoadSettings = field(default_factory=LoadSettings)
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)


class DownloadControl:
    """Pause and cancel flags a download checks between chunks (both stop it; pause keeps the part)."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.pause = threading.Event()

    @property
    def stopped(self) -> bool:
        return self.cancel.is_set() or self.pause.is_set()


class DownloadStopped(Exception):
    """Raised by download() when paused or cancelled."""


def describe_hardware(hw: Any) -> list[str]:
    """The probe's findings as sentences a user understands."""
    gb = 1024**3
    lines = []
    gpus = list(getattr(hw, "gpus", ()) or ())
    if gpus:
        for g in gpus:
            bw = f", moving about {g.bandwidth_gbs:.0f} GB/s" if g.bandwidth_gbs else ""
            lines.append(f"Graphics card: {g.name} with {g.vram_total / gb:.1f} GB of its own memory "
                         f"({g.vram_free / gb:.1f} GB free{bw}). Models that fit in it run fastest.")
    else:
        lines.append("No graphics card we can use: models run on the processor (slower, but it works).")
    cpu = getattr(hw, "cpu", None)
    if cpu is not None:
        lines.append(f"Processor: {cpu.name}, {cpu.cores_physical} cores.")
    ram_total = getattr(hw, "ram_total", 0)
    ram_free = getattr(hw, "ram_available", 0)
    bw = getattr(hw, "ram_bandwidth_gbs", 0.0)
    lines.append(f"Memory: {ram_total / gb:.1f} GB ({ram_free / gb:.1f} GB free right now).")
    if bw:
        lines.append(f"Memory speed: about {bw:.0f} GB/s. Writing each word reads the whole model "
                     f"once, so a 1 GB model writes roughly {bw:.0f} words per second here.")
    for note in getattr(hw, "notes", ()) or ():
        lines.append(f"Note: {note}.")
    return lines


def rough_plan(choice: ModelChoice, hw: Any) -> ModelChoice:
    """A size-based plan used until (or when) the planner cannot say more."""
    size = choice.size_bytes
    vram = getattr(hw, "vram_free", 0) or 0
    ram = getattr(hw, "ram_available", 0) or 0
    bw = getattr(hw, "ram_bandwidth_gbs", 0.0) or 0.0
    gpus = list(getattr(hw, "gpus", ()) or ())
    if size and vram and size * 1.2 < vram:
        fit, layers = "full_gpu", -1
        gbw = gpus[0].bandwidth_gbs if gpus and gpus[0].bandwidth_gbs else bw
        decode = gbw * 1e9 * 0.6 / size
    elif size and ram and size * 1.2 < ram + vram:
        fit, layers = ("partial" if vram else "cpu"), 0
        decode = bw * 1e9 * 0.6 / size if bw else None
    elif size:
        fit, layers, decode = "too_large", 0, None
    else:
        fit, layers, decode = "unknown", 0, None
    return replace(choice, fit=fit, n_gpu_layers=layers, pred_decode_tok_s=decode,
                   pred_prefill_tok_s=decode * 8 if decode else None)


class ModelServices:
    """The real thing: core.hardware, core.catalog, core.planner, core.downloads, core.library."""

    def __init__(self) -> None:
        self.hw: Any = None

    def probe(self) -> Any:
        from ggufdesk.core import hardware

        self.hw = hardware.probe()
        return self.hw

    def describe(self, hw: Any) -> list[str]:
        return describe_hardware(hw)

    def hub_reachable(self) -> bool:
        try:
            from ggufdesk.core import downloads

            return bool(downloads.hub_reachable())
        except (ImportError, AttributeError):
            return False
        except KnownError:
            return False

    def recommendations(self, hw: Any) -> list[ModelChoice]:
        try:
            from ggufdesk.core import catalog
        except ImportError:
            return []
        out: list[ModelChoice] = []
        for entry in catalog.recommend(hw):  # interface adapted when core/catalog.py lands
            out.append(self._from_catalog(entry, hw))
        return out

    def _from_catalog(self, entry: Any, hw: Any) -> ModelChoice:
        c = ModelChoice(label=getattr(entry, "label", str(entry)), source="catalog",
                        repo=getattr(entry, "repo", None), filename=getattr(entry, "filename", None),
                        size_bytes=int(getattr(entry, "size_bytes", 0) or 0))
        return self.plan(c, hw)

    def lookup_repo(self, repo: str, hw: Any) -> list[ModelChoice]:
        from ggufdesk.core import planner

        rows = planner.rank_repo(repo, hw)  # interface adapted when core/planner.py lands
        return [self.plan(ModelChoice(label=r.filename, source="repo", repo=repo,
                                      filename=r.filename, size_bytes=r.size_bytes), hw)
                for r in rows]

    def local_choices(self, hw: Any) -> list[ModelChoice]:
        """The starter model (offline) and GGUF files already on disk."""
        out: list[ModelChoice] = []
        from ggufdesk.core import starter

        if starter.starter_available():
            out.append(self.plan(ModelChoice(
                label="Gemma 3 270M (starter, works offline)", source="starter",
                filename=starter.STARTER_NAME, size_bytes=253 * 1024**2,
                note="small and quick; a base model, so it continues text"), hw))
        try:
            from ggufdesk.core import library

            for item in library.list_models():
                path = Path(getattr(item, "path", item))
                out.append(self.plan(ModelChoice(label=path.name, source="disk", path=path,
                                                 size_bytes=path.stat().st_size), hw))
        except ImportError:
            pass
        return out

    def choice_for_file(self, path: Path, hw: Any) -> ModelChoice:
        if not path.is_file():
            raise KnownError(f"{path} is not a file")
        return self.plan(ModelChoice(label=path.name, source="file", path=path,
                                     size_bytes=path.stat().st_size), hw)

    def plan(self, choice: ModelChoice, hw: Any) -> ModelChoice:
        try:
            from ggufdesk.core import planner

            target = str(choice.path) if choice.path else f"hf://{choice.repo}/{choice.filename}"
            plan = planner.plan(target, hardware=hw)
            return replace(choice, fit=plan.fit, n_gpu_layers=plan.n_gpu_layers,
                           pred_prefill_tok_s=plan.pred_prefill_tok_s,
                           pred_decode_tok_s=plan.pred_decode_tok_s)
        except (ImportError, AttributeError, TypeError):
            return rough_plan(choice, hw)
        except KnownError as e:
            log.info("planning %s failed: %s", choice.label, e)
            return replace(rough_plan(choice, hw), note=str(e))

    def download(self, choice: ModelChoice, on_progress: Callable[[int, int], None],
                 control: DownloadControl) -> Path:
        if choice.source == "starter":
            from ggufdesk.core import starter

            on_progress(0, choice.size_bytes)
            path = starter.starter_model_path()
            on_progress(choice.size_bytes, choice.size_bytes)
            return path
        if not choice.needs_download:
            return Path(choice.path)  # type: ignore[arg-type]
        from ggufdesk.core import downloads

        return Path(downloads.download(choice.repo, choice.filename, progress=on_progress,
                                       should_stop=lambda: control.stopped))

    def recommended_settings(self, model: str | None) -> tuple[LoadSettings, SpeculationSettings]:
        hw = self.hw
        if model and hw is not None:
            c = self.plan(ModelChoice(label=Path(model).name, source="file", path=Path(model),
                                      size_bytes=Path(model).stat().st_size
                                      if Path(model).is_file() else 0), hw)
            return LoadSettings(n_gpu_layers=c.n_gpu_layers, n_ctx=c.n_ctx), SpeculationSettings()
        return LoadSettings(), SpeculationSettings()
