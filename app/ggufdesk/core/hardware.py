"""What this machine has for running models: GPUs (NVML), CPU features, RAM and its measured bandwidth."""
from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ggufdesk.core.atomic import locked, write_atomic
from ggufdesk.core.cpus import performance_cores, usable_cpus
from ggufdesk.core.settings import default_threads

log = logging.getLogger("ggufdesk.hardware")

CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile",
             "neon", "sve")
BANDWIDTH_BYTES = 256 << 20  # the measured pass reads this much (fewer when RAM is short)
CACHE_FILE = "hardware.json"
MACHINES_MAX = 8  # entries kept per file (_keep): the whole machine and the CPU limits it was used under
CALIBRATION_FILE = "calibration.json"
DECODE_PROBE_FILE = "decode_probe.json"
MAX_RUNS = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUInfo:
    index: int
    name: str
    vram_total: int
    vram_free: int
    vram_used: int
    vram_used_by_others: int  # held by processes other than this one (0 when unknown)
    bandwidth_gbs: float | None  # theoretical: bus width x max memory clock x 2 (DDR)
    bus_width_bits: int | None = None
    mem_clock_mhz: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    compute_capability: str | None = None
    cuda_cores: int | None = None
    sm_clock_mhz: int | None = None
    source: str = "nvml"


@dataclass(frozen=True, slots=True, kw_only=True)
class CPUInfo:
    name: str
    arch: str
    cores_physical: int
    cores_logical: int
    flags: tuple[str, ...]
    cores_usable: int | None = None  # fewer CPUs than logical ones this process may use (core/cpus.py)
    cores_performance: int | None = None  # a hybrid CPU's performance cores this process may use; None: alike


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareInfo:
    """What probe() found; `calibration` is what real runs on this machine measured (read once)."""

    gpus: tuple[GPUInfo, ...]
    cpu: CPUInfo
    ram_total: int
    ram_available: int
    ram_bandwidth_gbs: float  # measured read bandwidth (numpy pass), cached per machine
    ram_bandwidth_source: str  # "measured" | "cached" | "assumed"
    cpu_gflops: float = 50.0  # measured float32 matmul throughput (numpy BLAS, all cores)
    driver: str | None = None
    unified_memory: bool = False
    notes: tuple[str, ...] = ()
    calibration: Calibration = field(default_factory=lambda: Calibration())

    @property
    def vram_free(self) -> int:
        return sum(g.vram_free for g in self.gpus)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"] = [asdict(g) for g in self.gpus]
        return d


# --------------------------------------------------------------------------- GPUs


def _nvml_call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - NVMLError_NotSupported and friends: field unknown
        log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), e)
        return None


def _str(v: Any) -> str | None:
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def probe_nvidia() -> tuple[list[GPUInfo], str | None, list[str]]:
    """NVIDIA GPUs through NVML; ([], None, [why]) when there is no driver or NVML fails."""
    try:
        import pynvml
    except ImportError:
        return [], None, ["nvidia-ml-py is not installed: NVIDIA GPUs are not probed"]
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no driver, no library, no device: CPU only
        return [], None, [f"no NVIDIA driver in use ({e})"]
    gpus: list[GPUInfo] = []
    notes: list[str] = []
    try:
        driver = _str(_nvml_call(pynvml.nvmlSystemGetDriverVersion))
        count = _nvml_call(pynvml.nvmlDeviceGetCount) or 0
        me = os.getpid()
        for i in range(count):
            h = _nvml_call(pynvml.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                notes.append(f"GPU {i}: NVML could not open it")
                continue
            mem = _nvml_call(pynvml.nvmlDeviceGetMemoryInfo, h)
            if mem is None:
                notes.append(f"GPU {i}: NVML reports no memory information")
                continue
            others = 0
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                for p in _nvml_call(getattr(pynvml, getter, lambda h: []), h) or []:
                    if getattr(p, "pid", None) != me and isinstance(getattr(p, "usedGpuMemory", None), int):
                        others += p.usedGpuMemory
            bus = _nvml_call(getattr(pynvml, "nvmlDeviceGetMemoryBusWidth", lambda h: None), h)
            clk = _nvml_call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM)
            cc = _nvml_call(pynvml.nvmlDeviceGetCudaComputeCapability, h)
            gpus.append(GPUInfo(
                index=i, name=_str(_nvml_call(pynvml.nvmlDeviceGetName, h)) or f"GPU {i}",
                vram_total=int(mem.total), vram_free=int(mem.free), vram_used=int(mem.used),
                vram_used_by_others=int(others),
                bandwidth_gbs=round(bus / 8 * clk * 2 / 1000, 1) if bus and clk else None,
                bus_width_bits=bus, mem_clock_mhz=clk,
                pcie_gen=_nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                pcie_width=_nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                cuda_cores=_nvml_call(getattr(pynvml, "nvmlDeviceGetNumGpuCores", lambda h: None), h),
                sm_clock_mhz=_nvml_call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
            ))
    except Exception as e:  # noqa: BLE001 - a broken driver must not take the app down
        notes.append(f"NVML failed while probing ({e})")
    finally:
        _nvml_call(pynvml.nvmlShutdown)
    return gpus, driver, notes


# --------------------------------------------------------------------------- CPU and RAM


def cpu_info() -> CPUInfo:
    import psutil

    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            k, _, v = line.partition(":")
            k = k.strip().lower()
            if k == "model name" and name in ("", platform.machine(), platform.processor()):
                name = v.strip()
            elif k in ("flags", "features"):
                flags.update(v.split())
    except OSError:
        pass
    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64") and ("asimd" in flags or platform.system() == "Darwin"):
        flags.add("neon")
    return CPUInfo(
        name=name or "unknown CPU", arch=machine,
        cores_physical=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        cores_logical=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        flags=tuple(f for f in CPU_FLAGS if f in flags), cores_usable=cpu_limit(),
        cores_performance=performance_cores(),
    )


def measure_ram_bandwidth(nbytes: int = BANDWIDTH_BYTES, passes: int = 10, threads: int | None = None) -> float:
    """Read bandwidth in GB/s with one reader per physical core (as llama.cpp decodes): best of a
    few int64 sums over an array larger than the caches. One thread is not enough: on a 16-core
    Xeon it read 8.7 GB/s while llama.cpp's 8 decode threads pulled 42 GB/s (bench/gpu.py)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import psutil

    threads = threads or min(default_threads(), 32)  # the engine's count (default_threads)
    nbytes = int(min(nbytes * max(1, threads // 4), psutil.virtual_memory().available // 8))
    a = np.ones(max(nbytes // 8, 1 << 20), dtype=np.int64)
    parts = np.array_split(a, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:  # numpy's sum releases the GIL
        for _ in range(passes):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t)
    return round(a.nbytes / best / 1e9, 2)


def measure_cpu_gflops(n: int = 768, passes: int = 4) -> float:
    """float32 matmul GFLOPS through numpy's BLAS on all cores: the CPU's prefill ceiling."""
    import numpy as np

    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return round(2 * n**3 / best / 1e9, 1)


def cache_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ggufdesk"))


def cpu_limit() -> int | None:
    """The CPUs this process may use where fewer than the machine's logical ones (core/cpus.py)."""
    import psutil

    usable, logical = usable_cpus(), psutil.cpu_count(logical=True) or os.cpu_count() or 1
    return usable if usable < logical else None


def machine_key(cpu: CPUInfo, ram_total: int) -> str:
    # v2: bandwidth read by one thread per physical core (v1 used one thread and is remeasured). A process
    # limited to fewer CPUs (a container's quota, taskset) decodes and reads on fewer threads: its own
    # measurements and decode probe, not the whole machine's (the unlimited key is unchanged); so does a
    # hybrid CPU's default of its performance cores only (measured on every core before that default)
    limited = f"|cpus{cpu.cores_usable}" if cpu.cores_usable is not None else ""
    fast = f"|perf{cpu.cores_performance}" if cpu.cores_performance is not None else ""
    return f"v2|{platform.node()}|{cpu.name}|{cpu.cores_logical}|{ram_total >> 20}{limited}{fast}"


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _save_json(path: Path, obj: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(obj, indent=1))
    except OSError as e:
        log.warning("could not save %s: %s", path, e)


def measurements(cpu: CPUInfo, ram_total: int, *, remeasure: bool = False) -> tuple[float, float, str]:
    """(RAM read GB/s, CPU GFLOPS, source): measured once per machine, then read from the cache.

    A measurement taken while other programs run reads low (the passes share the cores and the
    memory bus; on a shared 2-core machine the same pass read 9.6-21.5 GB/s within a minute), and a
    low figure made every later prediction pessimistic by the same factor. So a remeasurement keeps
    the best figure this machine has shown: a busy pass can only under-read what the memory does."""
    key = machine_key(cpu, ram_total)
    path = cache_dir() / CACHE_FILE
    cached = _entries(path).get(key)
    old_bw = old_fl = 0.0
    if isinstance(cached, dict):
        bw, fl = cached.get("ram_bandwidth_gbs"), cached.get("cpu_gflops")
        if isinstance(bw, (int, float)) and bw > 0 and isinstance(fl, (int, float)) and fl > 0:
            if not remeasure:
                return float(bw), float(fl), "cached"
            old_bw, old_fl = float(bw), float(fl)
    try:
        bw, fl = measure_ram_bandwidth(), measure_cpu_gflops()
    except (MemoryError, ValueError) as e:
        log.warning("RAM bandwidth measurement failed (%s); assuming 20 GB/s, 50 GFLOPS", e)
        return (old_bw, old_fl, "cached") if old_bw else (20.0, 50.0, "assumed")
    bw, fl = max(bw, old_bw), max(fl, old_fl)
    _keep(path, key, {"ram_bandwidth_gbs": bw, "cpu_gflops": fl, "measured_at": time.time()})
    return bw, fl, "measured"


def _entries(path: Path) -> dict[str, dict[str, Any]]:
    """A per-machine file's entries by machine_key. One per key ("machines"), so a limited process and
    the whole machine sharing a cache folder do not measure again each time the other ran; a file of
    one entry (written before) is read as one."""
    kept = _load_json(path)
    machines = kept.get("machines") if isinstance(kept, dict) else None
    if isinstance(machines, dict):
        return {k: v for k, v in machines.items() if isinstance(v, dict)}
    return {kept["key"]: kept} if isinstance(kept, dict) and isinstance(kept.get("key"), str) else {}


def _keep(path: Path, key: str, entry: dict[str, Any]) -> None:
    with locked(path, best_effort=True):  # the engine processes, the window and the CLI share it
        machines = _entries(path)
        machines.pop(key, None)  # the newest last: the oldest go first past MACHINES_MAX
        machines[key] = {"key": key, **entry}
        _save_json(path, {"machines": dict(list(machines.items())[-MACHINES_MAX:])})


def probe(*, remeasure: bool = False) -> HardwareInfo:
    """Everything about this machine; never raises for a missing GPU, driver or NVML error."""
    import psutil

    gpus, driver, notes = probe_nvidia()
    cpu = cpu_info()
    vm = psutil.virtual_memory()
    bw, gflops, src = measurements(cpu, vm.total, remeasure=remeasure)
    unified = platform.system() == "Darwin" and cpu.arch == "arm64"
    if unified:
        notes.append("Apple unified memory: the GPU shares system RAM")
    if not gpus:
        notes.append("no usable GPU found: models run on the CPU")
    if cpu.cores_usable is not None:
        n = cpu.cores_usable
        notes.append(f"ggufdesk may use {n} of the {cpu.cores_logical} CPUs here (a container's CPU limit or an "
                     f"affinity mask), so models run on {n} thread{'s' if n > 1 else ''} by default")
    if cpu.cores_performance is not None:
        notes.append(f"this CPU mixes fast and slow cores: models run on its {cpu.cores_performance} performance "
                     "cores by default, as llama.cpp does (threads that wait for each other at every step go "
                     "at the slowest one's pace); --threads sets another count")
    return HardwareInfo(gpus=tuple(gpus), cpu=cpu, ram_total=int(vm.total), ram_available=int(vm.available),
                        ram_bandwidth_gbs=bw, ram_bandwidth_source=src, cpu_gflops=gflops, driver=driver,
                        unified_memory=unified, notes=tuple(notes), calibration=calibration())


def memory_now() -> HardwareInfo:
    """GPUs and free RAM now, without the one-off bandwidth measurement (a fit needs no speeds)."""
    import psutil

    gpus, driver, notes = probe_nvidia()
    vm = psutil.virtual_memory()
    return HardwareInfo(gpus=tuple(gpus), cpu=cpu_info(), ram_total=int(vm.total),
                        ram_available=int(vm.available), ram_bandwidth_gbs=20.0,
                        ram_bandwidth_source="assumed", driver=driver, notes=tuple(notes))


def with_ggml_devices(hw: HardwareInfo, devices: list[dict[str, Any]]) -> HardwareInfo:
    """Add the GPUs the engine's llama.cpp build sees (Metal, Vulkan, ROCm, CUDA without NVML) when
    NVML found none; `devices` is the engine's Ready.devices. Bandwidth stays unknown for them."""
    if hw.gpus:
        return hw
    gpus: list[GPUInfo] = []
    notes = list(hw.notes)
    for d in devices:
        if d.get("type") not in ("gpu", "igpu") or not d.get("memory_total"):
            continue
        total, free = int(d["memory_total"]), int(d.get("memory_free") or 0)
        gpus.append(GPUInfo(index=len(gpus), name=d.get("description") or d.get("name") or "GPU",
                            vram_total=total, vram_free=free, vram_used=max(0, total - free),
                            vram_used_by_others=0, bandwidth_gbs=None, source="ggml"))
        if d.get("type") == "igpu":
            notes.append(f"{gpus[-1].name} shares system memory with the CPU")
    if not gpus:
        return hw
    notes = [n for n in notes if "no usable GPU" not in n]
    notes.append("GPU found by llama.cpp (" + ", ".join(g.name for g in gpus) + "); bandwidth unknown")
    return replace(hw, gpus=tuple(gpus), notes=tuple(notes))


# --------------------------------------------------------------------------- self-calibration


# The CPU's fixed cost per decoded token: T0_CPU_S once (building and scheduling the graph, waking the
# threads) plus MATMUL_CPU_S per weight matrix multiplied (a mixture of experts multiplies three small
# matrices per active expert per layer), on top of reading the weights' bytes. And attention: on the
# CPU, llama.cpp's decode spends ATTN_CPU_S of one thread's time per layer, query head and cached token
# (the scores, the softmax, the values: compute, not bytes; the KV bytes alone predicted a tenth of it),
# split over the threads. Fitted on a sweep of synthetic dense and MoE shapes at depths 1, 1024 and
# 4096 (docs/bench/planner.md, "Sixth session") that is in neither of bench/planner.py's pairs.
# The weight types the decode probe times (engine/runtime/decode_probe.py), those common GGUFs are made
# of: their kernels differ more than their bytes do (on an AVX2 build Q5_K and Q4_0 decode at half Q4_K's
# bytes per second). Q2_K, Q4_1, Q5_1, IQ4_NL and others are read like the nearest probed type of their
# family (planner._probed_gbs); each type probed adds 3-5 s. A recorded probe without one of these is
# measured again (engine.link.decode_probe.ensure).
DECODE_PROBE_TYPES = ("F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q5_0", "Q4_0", "IQ4_XS", "MXFP4")
T0_CPU_S = 1.5e-3
MATMUL_CPU_S = 2.8e-6
ATTN_CPU_S = 65e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeRun:
    where: str  # "cpu" or "gpu"
    bytes_per_token: int
    tok_s: float
    n_layer: int = 0
    matmuls: int = 0  # weight matrices multiplied per token: their fixed cost is not bandwidth
    at: float = field(default_factory=time.time)
    cpus: int | None = None  # the CPUs a limited process could use (cpu_limit); None: the whole machine


@dataclass(frozen=True, slots=True)
class Calibration:
    """Decode rates measured on this machine; None: not measured yet. cpu_gbs and gpu_gbs: effective
    bandwidths of real runs (record_decode_run). cpu_float_gbs, cpu_quant_gbs, cpu_type_gbs: the engine's
    decode probe (record_decode_probe): the GB/s its CPU threads get through float (f16) and quantized
    (Q4_K) weights, and cpu_type_gbs the same per weight type it probed."""

    cpu_gbs: float | None = None
    gpu_gbs: float | None = None
    cpu_float_gbs: float | None = None
    cpu_quant_gbs: float | None = None
    cpu_type_gbs: tuple[tuple[str, float], ...] = ()


def calibration() -> Calibration:
    """This machine's recorded calibration, read from disk once per call (the planner never reads it)."""
    probe = decode_probe() or {}
    return Calibration(cpu_gbs=effective_bandwidth_gbs("cpu"), gpu_gbs=effective_bandwidth_gbs("gpu"),
                       cpu_float_gbs=probe.get("float_gbs"), cpu_quant_gbs=probe.get("quant_gbs"),
                       cpu_type_gbs=tuple(sorted(probe.get("type_gbs", {}).items())))


def cpu_fixed_s(matmuls: int) -> float:
    """A CPU-decoded token's fixed cost (T0_CPU_S + MATMUL_CPU_S per weight matrix multiplied)."""
    return T0_CPU_S + MATMUL_CPU_S * matmuls


def _probe_key() -> str:
    import psutil

    return machine_key(cpu_info(), int(psutil.virtual_memory().total))


def llama_build() -> str:
    """A fingerprint of the installed llama.cpp libraries (their names, sizes and times), read without
    loading them: this layer never imports llama_cpp. A wheel rebuilt with other flags (AVX-512, CUDA)
    decodes at other rates on the same processor, so its decode probe is taken anew. "" when not found."""
    import hashlib
    import importlib.util

    try:
        spec = importlib.util.find_spec("llama_cpp")
        root = Path(spec.origin).parent if spec and spec.origin else None
        libs = sorted(p for p in (root / "lib").iterdir() if p.is_file() and not p.is_symlink()) if root else []
        parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in libs]
    except (OSError, ImportError, ValueError):
        return ""
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16] if parts else ""


def decode_probe_is_current() -> bool:
    """Whether the recorded decode probe was taken with the llama.cpp build installed now (an earlier
    probe, recorded before builds were noted, counts as another build)."""
    d = _entries(cache_dir() / DECODE_PROBE_FILE).get(_probe_key())
    return d is not None and d.get("build") == llama_build()


def decode_probe() -> dict[str, Any] | None:
    """The engine's decode probe recorded for this machine (record_decode_probe), or None."""
    d = _entries(cache_dir() / DECODE_PROBE_FILE).get(_probe_key())
    if d is None or not _usable(d):
        return None  # another machine's, or a hand-edited or half-written file: the fitted constants stay
    types = d.get("type_gbs")
    types = {k: float(v) for k, v in types.items() if _rate(v)} if isinstance(types, dict) else {}
    return {"float_gbs": float(d["float_gbs"]), "quant_gbs": float(d["quant_gbs"]), "type_gbs": types}


def _rate(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e4


def _usable(d: dict[str, Any]) -> bool:
    return all(_rate(d.get(k)) for k in ("float_gbs", "quant_gbs"))


def record_decode_probe(result: dict[str, Any]) -> None:
    """Keep the decode probe's rates for this machine and llama.cpp build (a CPU swap, another machine:
    not read; a rebuilt llama.cpp: read until engine.link.decode_probe.ensure measures it again)."""
    if not _usable(result):
        raise ValueError("the decode probe returned no usable rates: "
                         + ", ".join(f"{k}={result.get(k)!r}" for k in ("float_gbs", "quant_gbs")))
    _keep(cache_dir() / DECODE_PROBE_FILE, _probe_key(),
          {**result, "build": llama_build(), "measured_at": time.time()})


def record_decode_run(*, where: str, bytes_per_token: int, tok_s: float, n_layer: int = 0,
                      matmuls: int = 0) -> None:
    """Remember a real run's decode speed; later predictions use this machine's effective bandwidth."""
    if bytes_per_token <= 0 or not tok_s > 0 or where not in ("cpu", "gpu"):
        return
    path = cache_dir() / CALIBRATION_FILE
    run = asdict(DecodeRun(where=where, bytes_per_token=int(bytes_per_token), tok_s=float(tok_s),
                           n_layer=int(n_layer), matmuls=max(0, int(matmuls)), cpus=cpu_limit()))
    with locked(path, best_effort=True):  # engine processes finish runs at the same moment
        runs = _load_json(path)
        runs = runs if isinstance(runs, list) else []
        _save_json(path, [*runs, run][-MAX_RUNS:])


def effective_bandwidth_gbs(where: str, *, min_bytes: int = 32 << 20) -> float | None:
    """The best bytes/token x tok/s of the recent runs big enough to be bandwidth-bound (None if
    none). The best, not the median: a run measured while other programs used the cores is slow
    for a reason that is not the machine's, and a few answers on a busy afternoon must not become
    the prediction (it had said 2.3 tok/s where a quiet run makes 13). Nothing runs faster than the
    machine allows, so the best run is the machine's figure."""
    runs = _load_json(cache_dir() / CALIBRATION_FILE)
    if not isinstance(runs, list):
        return None
    limit = cpu_limit()  # a run on fewer CPUs says nothing of the whole machine, nor the reverse
    vals = [run_gbs(r) for r in runs
            if isinstance(r, dict) and r.get("where") == where and r.get("cpus") == limit
            and isinstance(r.get("bytes_per_token"), int) and r["bytes_per_token"] >= min_bytes
            and isinstance(r.get("tok_s"), (int, float)) and r["tok_s"] > 0]
    return max(vals) if vals else None


def run_gbs(r: dict[str, Any]) -> float:
    """A run's bytes per second of token time left after its CPU fixed cost (cpu_fixed_s, which the
    planner adds back per model); runs recorded before it was counted keep it inside."""
    seconds = 1 / r["tok_s"]
    mm = r.get("matmuls")
    if r.get("where") == "cpu" and isinstance(mm, int) and mm > 0 and cpu_fixed_s(mm) < 0.5 * seconds:
        seconds -= cpu_fixed_s(mm)
    return float(r["bytes_per_token"] / seconds / 1e9)
