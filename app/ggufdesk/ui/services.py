"""What the model wizard needs from core/ (probe, catalog, planner, downloads, library), in one place.

The wizard only talks to a ModelServices; tests pass a fake with the same methods. Every method
here may block (network, disk, measuring RAM) and is called from a background task.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SpeculationSettings

if TYPE_CHECKING:
    from ggufdesk.core.downloads import Progress, RemoteModel
    from ggufdesk.core.gguf_meta import GGUFInfo
    from ggufdesk.core.hardware import HardwareInfo

log = logging.getLogger("ggufdesk.ui.services")

DevicesFn = Callable[[], list[dict[str, object]]]  # the running engine's ggml device list

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
    n_cpu_moe: int = 0  # a mixture of experts: the first N layers' experts stay in RAM (core/planner.py)
    n_ctx: int = 4096
    pred_prefill_tok_s: float | None = None
    pred_decode_tok_s: float | None = None
    recommended: bool = False
    note: str = ""
    capabilities: tuple[str, ...] = ()  # reasoning, tools, vision, moe (core/catalog.py)
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


@dataclass(slots=True, kw_only=True)
class ContextEstimate:
    """What a context length costs for one model on this machine (the planner's numbers)."""

    n_ctx: int
    n_ctx_train: int
    kv_bytes: int
    ram_bytes: int
    vram_bytes: int
    ram_budget: int
    vram_budget: int
    fits: bool

    def words(self) -> str:
        gb = 1024**3
        where = (f"{self.vram_bytes / gb:.1f} GB of VRAM and {self.ram_bytes / gb:.1f} GB of RAM"
                 if self.vram_bytes else f"{self.ram_bytes / gb:.1f} GB of RAM")
        head = (f"A {self.n_ctx:,}-token context needs about {where} "
                f"(KV cache {self.kv_bytes / gb:.1f} GB)")
        if self.fits:
            return head + "; that fits here."
        room = (f"{self.vram_budget / gb:.1f} GB VRAM + {self.ram_budget / gb:.1f} GB RAM"
                if self.vram_bytes else f"{self.ram_budget / gb:.1f} GB")
        return head + f", more than the {room} free here: loading will probably fail."


class DownloadControl:
    """One stop flag a download checks between chunks; `reason` says pause (keep the part) or cancel."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reason = ""

    def request(self, reason: str) -> None:
        self.reason = reason
        self.stop.set()

    @property
    def stopped(self) -> bool:
        return self.stop.is_set()


class DownloadStopped(Exception):
    """Raised by download() when paused or cancelled."""


# The probe's notes that only say why there is no GPU (core/hardware.py).
NO_GPU_NOTES = ("no usable GPU found", "no NVIDIA driver in use", "nvidia-ml-py is not installed")


def describe_hardware(hw: HardwareInfo) -> list[str]:
    """The probe's findings as sentences a user understands."""
    gb = 1024**3
    lines = []
    gpus = list(getattr(hw, "gpus", ()) or ())
    if gpus:
        for g in gpus:
            speed = f", moving about {g.bandwidth_gbs:.0f} GB/s" if g.bandwidth_gbs else ""
            lines.append(f"Graphics card: {g.name} with {g.vram_total / gb:.1f} GB of its own memory "
                         f"({g.vram_free / gb:.1f} GB free{speed}). Models that fit in it run fastest.")
    else:
        lines.append("No graphics card we can use: models run on the processor (slower, but it works).")
    cpu = getattr(hw, "cpu", None)
    if cpu is not None:
        n = getattr(cpu, "cores_usable", None)
        usable = f" ({n} usable here)" if n else ""
        fast = getattr(cpu, "cores_performance", None)
        fast_text = f", {fast} of them fast ones that models run on" if fast else ""
        lines.append(f"Processor: {cpu.name}, {cpu.cores_physical} cores{fast_text}{usable}.")
    ram_total = getattr(hw, "ram_total", 0)
    ram_free = getattr(hw, "ram_available", 0)
    bw = getattr(hw, "ram_bandwidth_gbs", 0.0)
    lines.append(f"Memory: {ram_total / gb:.1f} GB ({ram_free / gb:.1f} GB free right now).")
    if bw and cpu is not None:
        from ggufdesk.core.planner import cpu_read_gbs

        # the planner's own rate (a quantized model on the processor: the efficiency llama.cpp reaches,
        # or this machine's recorded runs), so this sentence and the model list's speeds agree
        words = cpu_read_gbs(hw)
        timed = " (timed on this processor)" if hw.calibration.cpu_type_gbs else ""
        lines.append(f"Memory speed: about {bw:.0f} GB/s. Writing each word reads the whole model once, so on "
                     f"the processor a 1 GB model writes roughly {words:.0f} words per second here{timed}.")
    for note in getattr(hw, "notes", ()) or ():
        if not gpus and note.startswith(NO_GPU_NOTES):
            continue  # the first line said it (the probe's notes stay in `ggufdesk probe`)
        lines.append(f"Note: {note}.")
    return lines


def _pick_draft_file(models: list[RemoteModel]) -> RemoteModel:
    """A draft should be small and faithful: Q8_0 if offered, else the smallest file."""
    q8 = [m for m in models if (m.quant or "").upper() == "Q8_0"]
    return q8[0] if q8 else min(models, key=lambda m: m.size)


class ModelServices:
    """The real thing: core.hardware, core.catalog, core.planner, core.downloads, core.library."""

    MAX_CATALOG_ROWS = 3  # each one costs a repo listing and a remote header read

    def __init__(self, *, engine_devices: DevicesFn | None = None, decode_probe: bool = False) -> None:
        self.hw: HardwareInfo | None = None
        self._infos: dict[str, GGUFInfo] = {}  # GGUF headers read for context estimates
        self.engine_devices = engine_devices  # () -> the running engine's ggml device list
        self.decode_probe = decode_probe  # time llama.cpp's decode on this CPU once (the app does)

    def probe(self) -> HardwareInfo:
        from ggufdesk.core import hardware

        if self.decode_probe:  # once per machine: the planner's speeds from this CPU's own decode
            from ggufdesk.engine.link import decode_probe

            if decode_probe.needed():
                self._engine_ready()  # an engine starting beside the probe would slow its timings
            decode_probe.ensure()  # a failure is logged; the fitted constants then predict
        self.hw = hardware.probe()
        if self.engine_devices is not None and not self.hw.gpus:
            self.hw = hardware.with_ggml_devices(self.hw, self._engine_ready())
        return self.hw

    def _engine_ready(self, timeout: float = 10.0) -> list[dict[str, object]]:
        """The running engine's ggml devices, once it has started (its list comes with Ready); [] after
        timeout seconds, or when there is no engine."""
        if self.engine_devices is None:
            return []
        deadline = time.monotonic() + timeout
        while not (devices := self.engine_devices()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return devices

    def describe(self, hw: HardwareInfo) -> list[str]:
        return describe_hardware(hw)

    def hub_reachable(self, timeout: float = 3.0) -> bool:
        from ggufdesk.core import downloads

        return downloads.hub_reachable(timeout)

    def recommendations(self, hw: HardwareInfo | None) -> list[ModelChoice]:
        """The biggest catalog models that should fit here, each with its best quant for this machine."""
        from ggufdesk.core import catalog, planner

        cat = catalog.load()
        ram, vram = planner.budgets(hw) if hw is not None else (0, 0)
        budget = max(ram, vram)
        q4_bytes = lambda e: e.params_b * 1e9 * 4.9 / 8  # noqa: E731 - Q4_K_M is ~4.9 bits/weight
        fitting = sorted((e for e in cat.entries if q4_bytes(e) * 1.3 < budget),
                         key=lambda e: -e.params_b)[: self.MAX_CATALOG_ROWS]
        out: list[ModelChoice] = []
        for e in fitting:
            try:
                rows = self.lookup_repo(e.repo, hw, label=e.name)
            except KnownError as err:
                log.info("catalog entry %s skipped: %s", e.id, err)
                continue
            best = next((r for r in rows if r.recommended), None)
            if best is None:
                continue
            best.recommended = not out
            best.source = "catalog"
            best.capabilities = tuple(dict.fromkeys(e.capabilities + best.capabilities))
            if (d := cat.draft_for(e.id)) is not None:
                best.draft = self._draft_choice(d.repo, d.name)
            out.append(best)
        return out

    def _draft_choice(self, repo: str, name: str) -> ModelChoice | None:
        from ggufdesk.core import downloads

        try:
            models = downloads.list_gguf(repo)
        except KnownError:
            return None
        if not models:
            return None
        m = _pick_draft_file(models)
        return ModelChoice(label=f"{name} {m.quant or ''}".strip(), source="catalog", repo=repo,
                           filename=m.first, size_bytes=m.size)

    def lookup_repo(self, repo: str, hw: HardwareInfo | None, *, label: str | None = None) -> list[ModelChoice]:
        """Every GGUF in a hub repo, ranked for this machine by the planner."""
        from ggufdesk.core import downloads, planner
        from ggufdesk.core.gguf_meta import read_gguf

        models = downloads.list_gguf(repo)
        if not models:
            raise KnownError(f"{repo} has no .gguf files")
        name = label or repo.split("/")[-1]
        if hw is None:  # the probe failed: list the files unplanned (the planner needs the machine)
            return [ModelChoice(label=f"{name} {m.quant or m.first}", source="repo", repo=repo,
                                filename=m.first, size_bytes=m.size) for m in models]
        ref = next((m for m in models if (m.quant or "").upper() == "Q4_K_M"),
                   models[len(models) // 2])
        info = read_gguf(f"hf://{repo}/{ref.first}")
        by_file = {m.first: m for m in models}
        ranked = planner.rank_quants([(m.first, m.size) for m in models], info, hw)
        from ggufdesk.core.catalog import capabilities_of

        caps = capabilities_of(info)
        return [ModelChoice(
            label=f"{name} {r.quant or r.file}", source="repo", repo=repo,
            filename=r.file, size_bytes=r.size, fit=r.plan.fit, n_gpu_layers=r.plan.n_gpu_layers,
            n_cpu_moe=r.plan.n_cpu_moe, capabilities=caps,
            n_ctx=r.plan.n_ctx, pred_prefill_tok_s=r.plan.pred_prefill_tok_s,
            pred_decode_tok_s=r.plan.pred_decode_tok_s, recommended=r.recommended,
            note=r.plan.explanation + (f" ({len(by_file[r.file].files)} parts)"
                                       if len(by_file[r.file].files) > 1 else ""),
        ) for r in ranked]

    def local_choices(self, hw: HardwareInfo | None) -> list[ModelChoice]:
        """The starter model (works offline) and GGUF files already on this computer."""
        from ggufdesk.core import library, starter

        out: list[ModelChoice] = []
        for s in starter.installed():
            path = starter.target(s)  # an assembled starter has no file until its first use
            out.append(self.plan(ModelChoice(
                label=f"{s.label} (starter, works offline)", source="starter", filename=s.filename,
                path=path if path.is_file() else None, size_bytes=s.size_bytes, note=s.note), hw))
        for m in library.list_models():
            out.append(self.plan(ModelChoice(label=m.name, source="disk", path=m.path,
                                             size_bytes=m.size), hw))
        return out

    def choice_for_file(self, path: Path, hw: HardwareInfo | None) -> ModelChoice:
        """A file the user picked, planned; refused (KnownError, the reader's reason) when it is
        not a GGUF model llama.cpp could load, rather than listed with a guess from its size."""
        from ggufdesk.core.gguf_meta import read_gguf

        if not path.is_file():
            raise KnownError(f"{path} is not a file")
        try:
            self._infos[str(path)] = read_gguf(path)
        except KnownError as e:
            raise KnownError(f"{path.name} cannot be opened as a model: {e}") from e
        return self.plan(ModelChoice(label=path.name, source="file", path=path,
                                     size_bytes=path.stat().st_size), hw)

    def plan(self, choice: ModelChoice, hw: HardwareInfo | None) -> ModelChoice:
        """The planner's verdict for one file (its header is read locally or over HTTP ranges)."""
        if hw is None:
            return choice
        from ggufdesk.core import planner
        from ggufdesk.core.gguf_meta import read_gguf

        if choice.path is None and not choice.repo:
            return replace(choice, fit="unknown")  # nothing to read yet (a starter before its first use)
        target = str(choice.path) if choice.path else f"hf://{choice.repo}/{choice.filename}"
        try:
            info = self._infos.get(target) or read_gguf(target)
            pl = planner.plan(info, hw, n_ctx=choice.n_ctx)
        except KnownError as e:  # one planner (core/planner.py): without the header it cannot say
            log.info("planning %s failed: %s", choice.label, e)
            return replace(choice, fit="unknown", note=str(e))
        from ggufdesk.core.catalog import capabilities_of

        caps = tuple(dict.fromkeys(choice.capabilities + capabilities_of(info) + _vision(choice)))
        return replace(choice, fit=pl.fit, n_gpu_layers=pl.n_gpu_layers, n_cpu_moe=pl.n_cpu_moe, n_ctx=pl.n_ctx,
                       capabilities=caps,
                       pred_prefill_tok_s=pl.pred_prefill_tok_s,
                       pred_decode_tok_s=pl.pred_decode_tok_s, note=pl.explanation)

    def download(self, choice: ModelChoice, on_progress: Callable[[int, int], None],
                 control: DownloadControl) -> Path:
        """Fetch the file (all parts of a split set) into the HF cache; resumes after a pause."""
        if choice.source == "starter":
            from ggufdesk.core import starter

            on_progress(0, choice.size_bytes)
            path = starter.model_path(starter.by_filename(choice.filename or "") or starter.GEMMA)
            on_progress(choice.size_bytes, choice.size_bytes)
            return path
        if not choice.needs_download:
            return Path(choice.path)  # type: ignore[arg-type]
        from ggufdesk.core import downloads
        from ggufdesk.core.gguf_meta import split_names

        assert choice.repo and choice.filename
        names = split_names(choice.filename)
        done_before = 0
        first: Path | None = None
        for name in names:
            def progress(pr: Progress, base: int = done_before) -> None:
                on_progress(base + pr.done, max(choice.size_bytes, base + pr.total))

            try:
                got = downloads.download(choice.repo, name, progress=progress, cancel=control.stop)
            except downloads.DownloadCancelled:
                raise DownloadStopped(control.reason or "cancel") from None
            done_before += got.bytes
            first = first or Path(got.path)
        assert first is not None
        self._fetch_projector(choice, control)
        return first

    @staticmethod
    def _fetch_projector(choice: ModelChoice, control: DownloadControl) -> None:
        """A vision model's projector from the same repo, beside the model (loaded with it); a repo
        that cannot be listed now leaves the model reading text (said in the log, `library` says it too)."""
        from ggufdesk.core import downloads

        assert choice.repo and choice.filename
        try:
            proj = downloads.projector_for(choice.repo, choice.filename)
            if proj is not None:
                downloads.download(choice.repo, proj.path, cancel=control.stop)
        except downloads.DownloadCancelled:
            raise DownloadStopped(control.reason or "cancel") from None
        except KnownError as e:
            log.warning("the vision projector of %s was not fetched: %s", choice.label, e)

    def context_estimate(self, model: str | None, load: LoadSettings) -> ContextEstimate | None:
        """The planner's memory estimate for `load` on `model` (None when it cannot say)."""
        if not model or not Path(model).is_file():
            return None
        from ggufdesk.core import hardware, planner
        from ggufdesk.core.gguf_meta import read_gguf

        try:
            info = self._infos.get(model) or read_gguf(model)
            self._infos[model] = info
            hw = self.hw or hardware.probe()
            self.hw = hw
            pl = planner.plan(info, hw, n_ctx=load.n_ctx, n_gpu_layers=load.n_gpu_layers,
                              n_ubatch=load.n_ubatch, type_k=load.type_k, type_v=load.type_v,
                              flash_attn=load.flash_attn, n_cpu_moe=load.n_cpu_moe)
        except KnownError as e:
            log.info("no memory estimate for %s: %s", model, e)
            return None
        m = pl.memory
        return ContextEstimate(n_ctx=load.n_ctx, n_ctx_train=info.context_length,
                               kv_bytes=m.kv_cpu + m.kv_gpu, ram_bytes=pl.ram_bytes,
                               vram_bytes=pl.vram_bytes, ram_budget=pl.ram_budget,
                               vram_budget=pl.vram_budget, fits=pl.fit != "too_large")

    def recommended_settings(self, model: str | None) -> tuple[LoadSettings, SpeculationSettings]:
        if model and self.hw is not None and Path(model).is_file():
            c = self.choice_for_file(Path(model), self.hw)
            return (LoadSettings(n_gpu_layers=c.n_gpu_layers, n_cpu_moe=c.n_cpu_moe, n_ctx=c.n_ctx),
                    SpeculationSettings())
        return LoadSettings(), SpeculationSettings()


def _vision(choice: ModelChoice) -> tuple[str, ...]:
    """("vision",) for a model file on disk with its projector beside it."""
    from ggufdesk.core.projector import projector_beside

    return ("vision",) if choice.path and projector_beside(choice.path) else ()
