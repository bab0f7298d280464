"""Typed, validated settings: engine load options, sampling, speculation; saved as JSON."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from ggufdesk.core.aside import try_move_aside
from ggufdesk.core.atomic import write_atomic
from ggufdesk.core.cpus import performance_cores, usable_cpus
from ggufdesk.core.errors import SettingsError
from ggufdesk.core.rpc_wire import parse_workers

# The choices are the annotations (engine/link/protocol.py validates a line from them); the tuples
# are the same values for the checks below and the UI's lists.
KvType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]
FlashAttn = Literal["auto", "on", "off"]
SpecMode = Literal["off", "draft", "lookup"]
Think = Literal["auto", "on", "off", "low", "medium", "high"]
KV_TYPES: tuple[str, ...] = get_args(KvType)
FLASH_ATTN: tuple[str, ...] = get_args(FlashAttn)
SPEC_MODES: tuple[str, ...] = get_args(SpecMode)
# How engine/link/protocol.py validates these on the wire (pydantic reads it; a plain dict, so core
# needs no pydantic): a field this version does not know is an error, as with the constructor.
_WIRE: dict[str, Any] = {"extra": "forbid"}
# prompt lookup's content hints (engine/speculation/hints.py), each of which `lookup_hints_off` may switch off
LOOKUP_HINTS = ("quotes", "sentence_ends", "counts")
MAX_PARALLEL = 256  # llama.cpp's LLAMA_MAX_SEQ
PREFILL_CHUNK = 0  # 0 = sized each step from measured times (engine/batching/chunking.py, bench/batch.py)
# What happens when a conversation or prompt outgrows the context (docs/context.md): refuse it, drop
# whole older turns, cut the middle of a long prompt, or shift the KV cache while generating.
OVERFLOW_POLICIES = ("error", "rolling", "truncate-middle", "shift")
PROMPT_CACHE_BYTES = 4 << 30  # the disk prompt cache's size cap (least recently used entries go first)
PROMPT_CACHE_MIN_TOKENS = 256  # shorter prefixes are cheap to prefill again: not worth a file
# Recent prompts' KV states kept in the engine's RAM beyond its slots (engine/batching/ram_cache.py):
# llama-server keeps 8 GiB (--cache-ram); a desktop app shares the machine, so 1 GiB (the starter's
# states are 18 KiB a token: 58k tokens; an 8B model's with GQA, 128 KiB: 8k tokens). The engine's
# memory ceiling counts it (engine/runtime/memlimit.py).
PROMPT_CACHE_RAM_BYTES = 1 << 30


def _int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{name} must be a whole number, got {value!r}")
    if lo is not None and value < lo:
        raise SettingsError(f"{name} must be at least {lo}, got {value}")
    if hi is not None and value > hi:
        raise SettingsError(f"{name} must be at most {hi}, got {value}")
    return value


def _float(name: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise SettingsError(f"{name} must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise SettingsError(f"{name} must be between {lo} and {hi}, got {value}")
    return float(value)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    chosen: str = value
    return chosen


def default_threads() -> int:
    """Physical cores: decode is memory-bound and hyperthreads only add contention; on a hybrid CPU
    its performance cores only, as llama.cpp counts them (core/cpus.py `performance_cores`); no more
    than the CPUs this process may use (a container's quota, `taskset`), where more spinning threads
    than CPUs take turns (13-37% slower, bench/limited_cpus.py)."""
    n = performance_cores()
    if n is None:
        try:
            import psutil

            n = psutil.cpu_count(logical=False)
        except Exception:  # noqa: BLE001 - psutil missing or unsupported platform
            n = None
    return max(1, min(n or os.cpu_count() or 1, usable_cpus()))


@dataclass(slots=True, kw_only=True)
class LoadSettings:
    """How llama.cpp loads a model: context, offload, and the prefill/decode split."""

    __pydantic_config__: ClassVar = _WIRE

    n_ctx: int = 4096
    n_gpu_layers: int = 0  # -1 = all layers
    n_batch: int = 512  # logical batch for prompt processing
    n_ubatch: int = 512  # physical micro-batch, <= n_batch
    n_threads: int = 0  # decode (1-token batches); 0 = default_threads()
    n_threads_batch: int = 0  # prefill and verification; 0 = default_threads()
    flash_attn: FlashAttn = "auto"
    type_k: KvType = "f16"
    type_v: KvType = "f16"
    use_mmap: bool = True
    use_mlock: bool = False
    n_parallel: int = 1  # sequences decoded together (the server sets it; the GUI and run use 1)
    prefill_chunk: int = PREFILL_CHUNK  # prompt tokens per engine step beside streams; 0 = auto
    rpc: list[str] = field(default_factory=list)  # RPC workers, host:port (`ggufdesk worker`)
    chat_template: str | None = None  # Jinja text used instead of the model's own (serve --chat-template-file)
    # the KV of finished prompts saved on disk and restored by later requests, also after a restart
    # (engine/batching/disk_cache.py, engine/batching/prompt_states.py); a cap of 0 bytes turns it off
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES
    prompt_cache_min_tokens: int = PROMPT_CACHE_MIN_TOKENS
    prompt_cache_ram_bytes: int = PROMPT_CACHE_RAM_BYTES  # recent prompts' KV in RAM; 0 turns it off
    # a mixture of experts: the routed experts of the first N layers stay in RAM while the rest of
    # those layers is on the GPU (llama.cpp's --n-cpu-moe; core/planner.py proposes N)
    n_cpu_moe: int = 0

    def __post_init__(self) -> None:
        _int("context length (n_ctx)", self.n_ctx, 16, 1 << 20)
        _int("prompt cache size (prompt_cache_bytes)", self.prompt_cache_bytes, 0, 1 << 50)
        _int("shortest cached prompt (prompt_cache_min_tokens)", self.prompt_cache_min_tokens, 1, 1 << 20)
        _int("prompt cache in memory (prompt_cache_ram_bytes)", self.prompt_cache_ram_bytes, 0, 1 << 50)
        _int("layers with experts on the CPU (n_cpu_moe)", self.n_cpu_moe, 0, 100_000)
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template
                                               or len(self.chat_template) > 1 << 20):
            raise SettingsError("a chat template must be Jinja text of at most 1 MiB")
        _int("parallel sequences (n_parallel)", self.n_parallel, 1, MAX_PARALLEL)
        _int("prefill chunk (prefill_chunk)", self.prefill_chunk, 0, 1 << 16)
        _int("GPU layers (n_gpu_layers)", self.n_gpu_layers, -1, 100_000)
        _int("batch size (n_batch)", self.n_batch, 1, 1 << 16)
        _int("micro-batch size (n_ubatch)", self.n_ubatch, 1, 1 << 16)
        _int("decode threads (n_threads)", self.n_threads, 0, 1024)
        _int("prefill threads (n_threads_batch)", self.n_threads_batch, 0, 1024)
        if self.n_ubatch > self.n_batch:
            raise SettingsError(
                f"micro-batch (n_ubatch={self.n_ubatch}) cannot be larger than the batch "
                f"(n_batch={self.n_batch}): llama.cpp splits each batch into micro-batches"
            )
        if self.n_parallel > self.n_batch:
            raise SettingsError(f"{self.n_parallel} parallel sequences need a batch (n_batch) of at least "
                                f"{self.n_parallel}: every step decodes one token of each")
        _choice("flash attention", self.flash_attn, FLASH_ATTN)
        _choice("K cache type (type_k)", self.type_k, KV_TYPES)
        _choice("V cache type (type_v)", self.type_v, KV_TYPES)
        if self.type_v not in ("f32", "f16", "bf16") and self.flash_attn == "off":
            raise SettingsError(
                f"a quantized V cache ({self.type_v}) needs flash attention; "
                "turn flash attention on or auto, or use an f16 V cache"
            )
        for name in ("use_mmap", "use_mlock"):
            if not isinstance(getattr(self, name), bool):
                raise SettingsError(f"{name} must be true or false")
        if not isinstance(self.rpc, list):
            raise SettingsError("RPC workers must be a list of host:port")
        self.rpc = parse_workers(self.rpc)

    @property
    def threads(self) -> int:
        return self.n_threads or default_threads()

    @property
    def threads_batch(self) -> int:
        return self.n_threads_batch or default_threads()


THINK_CHOICES: tuple[str, ...] = get_args(Think)


def think_value(choice: str) -> bool | str | None:
    """A `think` setting as the engine's Generate.think (None: the template's default)."""
    return {"auto": None, "on": True, "off": False}.get(choice, choice)


@dataclass(slots=True, kw_only=True)
class SamplingSettings:
    """How the next token is chosen. temperature 0 = greedy."""

    __pydantic_config__: ClassVar = _WIRE

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = -1  # -1 = a new random seed each request
    max_tokens: int = 512
    stop: list[str] = field(default_factory=list)
    # structured output: "" off, "json_object", a JSON schema or a JSON list of tools (core/tools.py)
    structured: str = ""
    # when the prompt outgrows the context: one of OVERFLOW_POLICIES (the window's default; the
    # server's is "error", `ggufdesk serve --context-overflow`)
    context_overflow: str = "rolling"
    # with tools: "auto" (the model decides), "required" (it must call one), "none" (it may not),
    # or a tool's name (it must call that one) — the API's tool_choice
    tool_choice: str = "auto"
    # reasoning models (core/reasoning.py): tokens of thinking before the engine closes the block
    # (-1 = no limit), and thinking on/off/effort ("auto" = the template's default)
    reasoning_budget: int = -1
    think: Think = "auto"

    def __post_init__(self) -> None:
        _float("temperature", self.temperature, 0.0, 5.0)
        _choice("context overflow policy (context_overflow)", self.context_overflow, OVERFLOW_POLICIES)
        _int("reasoning budget", self.reasoning_budget, -1, 1 << 20)
        _choice("think", self.think, THINK_CHOICES)
        _int("top-k", self.top_k, 0, 1_000_000)
        _float("top-p", self.top_p, 0.0, 1.0)
        _float("min-p", self.min_p, 0.0, 1.0)
        _float("repeat penalty", self.repeat_penalty, 0.0, 10.0)
        _int("repeat window", self.repeat_last_n, -1, 1 << 20)
        _int("seed", self.seed, -1, 2**32 - 1)
        _int("max tokens", self.max_tokens, 1, 1 << 20)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise SettingsError("stop must be a list of non-empty strings")
        if not isinstance(self.structured, str):
            raise SettingsError("structured output must be text")
        if not isinstance(self.tool_choice, str) or not self.tool_choice.strip():
            raise SettingsError("tool choice must be auto, required, none or a tool's name")
        if self.structured.strip():
            from ggufdesk.core.schema import SchemaError
            from ggufdesk.core.tools import request_fields

            try:
                request_fields(self.structured, self.tool_choice)
            except SchemaError as e:
                raise SettingsError(str(e)) from None


@dataclass(slots=True, kw_only=True)
class SpeculationSettings:
    """Speculative decoding: a draft model or prompt lookup proposes, the model verifies."""

    __pydantic_config__: ClassVar = _WIRE

    mode: SpecMode = "off"
    draft_model: str | None = None
    draft_gpu_layers: int = 0
    draft_ctx: int = 0  # 0 = same as the target's context
    k_max: int = 16  # measured on 2 CPU threads: K=16 copies 1.68x plain vs 0.89x for K=8
    k_min: int = 1
    p_min: float = 0.6  # draft stops proposing below this top probability
    ngram: int = 3  # prompt lookup: longest n-gram to match
    adaptive: bool = True
    lookup_history: bool = True  # prompt lookup also drafts from earlier requests' prompts and answers
    # comma-separated LOOKUP_HINTS that prompt lookup leaves out ("" = all on). `sentence_ends` is off
    # by default: it did not win on the held-out suite (bench/spec_heldout.py, replayed greedy answers of
    # the starter: a Japanese quote 1.50x plain without it, 1.34x with it; a German one 1.33 vs 1.32;
    # SmolLM2 unchanged), only on the tuned one (RAG 1.66 vs 1.59)
    lookup_hints_off: str = "sentence_ends"

    def __post_init__(self) -> None:
        _choice("speculation mode", self.mode, SPEC_MODES)
        if self.mode == "draft" and not self.draft_model:
            raise SettingsError("speculation mode 'draft' needs a draft model")
        _int("draft GPU layers", self.draft_gpu_layers, -1, 100_000)
        _int("draft context", self.draft_ctx, 0, 1 << 20)
        _int("maximum draft length (K max)", self.k_max, 1, 64)
        _int("minimum draft length (K min)", self.k_min, 1, 64)
        if self.k_min > self.k_max:
            raise SettingsError(f"K min ({self.k_min}) cannot exceed K max ({self.k_max})")
        _float("draft p_min", self.p_min, 0.0, 1.0)
        _int("lookup n-gram size", self.ngram, 1, 16)
        if not isinstance(self.lookup_hints_off, str):
            raise SettingsError("lookup hints to switch off must be text, e.g. \"quotes,counts\"")
        bad = [h for h in hint_names(self.lookup_hints_off) if h not in LOOKUP_HINTS]
        if bad:
            raise SettingsError(f"unknown lookup hint {bad[0]!r}; known: {', '.join(LOOKUP_HINTS)}")


def hint_names(text: str) -> list[str]:
    """The hint names of a comma-separated list ("quotes, counts")."""
    return [h.strip() for h in text.split(",") if h.strip()]


# The most logits rows one decode may ask for: a verification batch is [last] + K max drafts.
# The engine reserves this many at load (llama.cpp's n_outputs_max; without the cap it reserves
# logits for every micro-batch position) and the planner counts them. The one source of both.
LOGITS_ROWS = SpeculationSettings().k_max + 1

SECTIONS = {"load": LoadSettings, "sampling": SamplingSettings, "speculation": SpeculationSettings}
MAX_PRESET_KEY = 200


@dataclass(slots=True, kw_only=True)
class Preset:
    """One model's own settings, keyed by its library id: only what differs from the defaults.

    Each section is a partial dict of that section's fields (context, GPU layers, KV type, threads;
    sampling defaults; a draft model or lookup), plus a system prompt. Applied over the defaults
    wherever the model is loaded: the window, `run`/`chat`/`serve`, and the server's JIT loads.
    Unknown keys are kept and ignored (a newer version's); values are checked against the defaults.
    """

    load: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    speculation: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        for name, kind in SECTIONS.items():
            part = getattr(self, name)
            if not isinstance(part, dict):
                raise SettingsError(f"{name} must be a JSON object of {name} settings, got {part!r}")
            _section(name, kind, {**dataclasses.asdict(kind()), **part})
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise SettingsError(f"system_prompt must be text, got {self.system_prompt!r}")

    def __bool__(self) -> bool:
        return bool(self.load or self.sampling or self.speculation or self.system_prompt is not None)

    def known(self, name: str) -> dict[str, Any]:
        """The section's fields this version knows (unknown keys stay in the file, unused)."""
        fields = {f.name for f in dataclasses.fields(SECTIONS[name])}
        part: dict[str, Any] = getattr(self, name)
        return {k: v for k, v in part.items() if k in fields}

    def apply(self, load: LoadSettings, sampling: SamplingSettings, speculation: SpeculationSettings,
              ) -> tuple[LoadSettings, SamplingSettings, SpeculationSettings]:
        """The three sections with this preset over them; SettingsError if the mix cannot work."""
        try:
            return (dataclasses.replace(load, **self.known("load")),
                    dataclasses.replace(sampling, **self.known("sampling")),
                    dataclasses.replace(speculation, **self.known("speculation")))
        except SettingsError as e:
            raise SettingsError(f"the model's preset cannot be used with these settings: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: dict(getattr(self, name)) for name in SECTIONS if getattr(self, name)}
        if self.system_prompt is not None:
            out["system_prompt"] = self.system_prompt
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Preset:
        if not isinstance(data, dict):
            raise SettingsError(f"a preset must be a JSON object, got {data!r}")
        return cls(**{k: data[k] for k in (*SECTIONS, "system_prompt") if k in data})

    @classmethod
    def between(cls, defaults: Settings, chosen: Settings) -> Preset:
        """What `chosen` changes of `defaults`: the preset that turns one into the other."""
        parts = {}
        for name in SECTIONS:
            a, b = dataclasses.asdict(getattr(defaults, name)), dataclasses.asdict(getattr(chosen, name))
            parts[name] = {k: v for k, v in b.items() if a.get(k) != v}
        prompt = chosen.system_prompt if chosen.system_prompt != defaults.system_prompt else None
        return cls(**parts, system_prompt=prompt)


def check_preset_key(key: Any) -> str:
    """A preset is keyed by a library id: text, no path separators (ids never have them)."""
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_PRESET_KEY or "/" in key or "\\" in key:
        raise SettingsError(f"presets are keyed by a model's library id (see `ggufdesk library`), got {key!r}")
    return key


def _presets(data: Any) -> dict[str, Preset]:
    if not isinstance(data, dict):
        raise SettingsError(f"presets must be a JSON object of model id -> preset, got {data!r}")
    out = {}
    for key, value in data.items():
        try:
            out[check_preset_key(key)] = Preset.from_dict(value)
        except SettingsError as e:
            raise SettingsError(f"presets[{key!r}]: {e}") from None
    return out


@dataclass(slots=True, kw_only=True)
class Settings:
    """Everything the user can set, saved to one JSON file."""

    load: LoadSettings = field(default_factory=LoadSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    model: str | None = None  # last model used
    system_prompt: str = ""
    presets: dict[str, Preset] = field(default_factory=dict)  # library id -> that model's own settings
    # keys this version does not know (a newer ggufdesk's, or hand-written): kept and written back
    unknown: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def for_model(self, model_id: str | None) -> Settings:
        """These settings with the model's preset over them (a copy; itself when there is none)."""
        preset = self.presets.get(model_id or "")
        if not preset:
            return self
        load, sampling, speculation = preset.apply(self.load, self.sampling, self.speculation)
        prompt = self.system_prompt if preset.system_prompt is None else preset.system_prompt
        return dataclasses.replace(self, load=load, sampling=sampling, speculation=speculation, system_prompt=prompt)

    def set_preset(self, model_id: str, preset: Preset | None) -> None:
        """Save (or, with None or an empty preset, drop) a model's preset."""
        check_preset_key(model_id)
        if preset:
            self.presets[model_id] = preset
        else:
            self.presets.pop(model_id, None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"load": dataclasses.asdict(self.load), "sampling": dataclasses.asdict(self.sampling),
                               "speculation": dataclasses.asdict(self.speculation), "model": self.model,
                               "system_prompt": self.system_prompt}
        if self.presets:
            out["presets"] = {k: p.to_dict() for k, p in self.presets.items()}
        for key, extra in self.unknown.items():
            if key in SECTIONS and isinstance(extra, dict):
                out[key] = {**extra, **out[key]}
            elif key not in out:
                out[key] = extra
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        """Strict about values (SettingsError says which), lenient about keys it does not know."""
        if not isinstance(data, dict):
            raise SettingsError("settings must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)} - {"unknown"}
        unknown: dict[str, Any] = {k: v for k, v in data.items() if k not in known}
        sections = {}
        for name, kind in SECTIONS.items():
            sections[name], extra = _section(name, kind, data.get(name, {}))
            if extra:
                unknown[name] = extra
        model, prompt = data.get("model"), data.get("system_prompt", "")
        if model is not None and not isinstance(model, str):
            raise SettingsError(f"model must be a file path, got {model!r}")
        if not isinstance(prompt, str):
            raise SettingsError(f"system_prompt must be text, got {prompt!r}")
        presets = _presets(data.get("presets", {}))
        return cls(**sections, model=model, system_prompt=prompt, presets=presets, unknown=unknown)


def _section(name: str, kind: type, data: Any) -> tuple[Any, dict[str, Any]]:
    """One section from its dict: (the settings, the keys it does not know)."""
    if not isinstance(data, dict):
        raise SettingsError(f"settings section {name!r} must be a JSON object, got {data!r}")
    fields = {f.name for f in dataclasses.fields(kind)}
    try:
        return kind(**{k: v for k, v in data.items() if k in fields}), {
            k: v for k, v in data.items() if k not in fields}
    except SettingsError as e:
        raise SettingsError(f"{name}: {e}") from None
    except TypeError as e:
        raise SettingsError(f"bad {name} settings: {e}") from None


def settings_path() -> Path:
    from platformdirs import user_config_dir

    return Path(user_config_dir("ggufdesk")) / "settings.json"


def load_settings(path: Path | None = None) -> Settings:
    """Read the settings file; a missing file gives defaults, a broken one a clear SettingsError."""
    path = path or settings_path()
    if not path.exists():
        return Settings()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SettingsError(f"cannot read settings file {path}: {e}") from None
    return Settings.from_dict(data)


@dataclass(frozen=True, slots=True)
class SettingsReport:
    """What open_settings found: the settings to use, and what the user must be told (None: nothing)."""

    settings: Settings
    warning: str | None = None
    kept_as: Path | None = None  # where the unreadable file was moved


def open_settings(path: Path | None = None) -> SettingsReport:
    """Settings for the app to start with; never raises for a broken file and never loses one.

    A file that cannot be read or has a setting that cannot work is moved aside to
    ``settings.json.broken-<time>`` (never overwritten or deleted) and the defaults are used — except
    for sections that were fine, which are kept; the report's warning says what happened, for the GUI
    or CLI to show.
    """
    path = path or settings_path()
    try:
        return SettingsReport(load_settings(path))
    except SettingsError as e:
        problem = str(e)
    salvaged, reset = _salvage(path)
    kept = try_move_aside(path)
    where = f"it was kept as {kept}" if kept else "it could not be moved aside either"
    what = f"{', '.join(reset)} reset to defaults" if salvaged and reset else "defaults are used"
    return SettingsReport(salvaged or Settings(), f"Your settings file could not be used ({problem}); "
                          f"{what} and {where}.", kept)


def _salvage(path: Path) -> tuple[Settings | None, list[str]]:
    """The sections of a parseable file that are still valid; the names of those reset."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, []
    if not isinstance(data, dict):
        return None, []
    out, reset = Settings(), []
    for name, kind in SECTIONS.items():
        try:
            value, extra = _section(name, kind, data.get(name, {}))
            setattr(out, name, value)
            if extra:
                out.unknown[name] = extra
        except SettingsError:
            reset.append(f"{name} settings")
    for key in ("model", "system_prompt"):
        value = data.get(key)
        if isinstance(value, str):
            setattr(out, key, value)
        elif key in data and value is not None:
            reset.append(key)
    presets = data.get("presets", {})
    for key, value in (presets.items() if isinstance(presets, dict) else [("presets", None)]):
        try:
            out.presets.update(_presets({key: value}))
        except SettingsError:
            reset.append(f"the preset for {key}")
    skip = (*SECTIONS, "model", "system_prompt", "presets")
    out.unknown.update({k: v for k, v in data.items() if k not in skip})
    return out, reset


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write atomically so a crash mid-write never leaves a broken settings file."""
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(settings.to_dict(), indent=2))
    return path
