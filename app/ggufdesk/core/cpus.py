"""The CPUs this process may use: its CPU affinity, capped by a cgroup CPU quota.

A container started with `--cpus 2` or `--cpuset-cpus 0,1`, a systemd unit with `CPUQuota=`, or a
program run under `taskset` sees every CPU of the machine in `os.cpu_count()` and psutil, but may run
on fewer. llama.cpp's threads spin-wait for each other, so more threads than the CPUs allowed take
turns: measured on 2 cores limited to one, 2 threads decoded 13-37% slower than 1 (bench/limited_cpus.py,
docs/bench/engine.md), and neither the CPU-load sensor nor the step times see it, since nothing else
runs and the count is slow from the first step (engine/batching/threads.py). The same reading as
joblib's loky (`cpu_count`): affinity, and the quota rounded up; written here because loky is a
process-pool library, and because this also walks the process's own cgroup up to the root (a unit's
quota is set on its own cgroup, which is not the mount's root outside a container).
"""
from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def affinity() -> frozenset[int] | None:
    """The CPUs the scheduler may run this process on, or None where the platform does not say."""
    try:
        cpus = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        try:
            import psutil

            cpus = frozenset(psutil.Process().cpu_affinity() or ())
        except Exception:  # noqa: BLE001 - psutil missing, or no affinity on this platform (macOS)
            return None
    return cpus or None


def _quota(text: str, period: str | None = None) -> float | None:
    """CPUs from a v2 `cpu.max` line ("max 100000", "150000 100000") or v1 quota and period files."""
    parts = text.split()
    if period is not None:
        parts = parts[:1] + period.split()[:1]
    if len(parts) < 2 or parts[0] in ("max", "-1"):
        return None
    try:
        quota, per = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / per if quota > 0 and per > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def cgroup_cpus(root: Path = CGROUP, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors (v2 `cpu.max`, v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`), in CPUs; None where none is set or none can be read.
    Inside a container's cgroup namespace its own cgroup reads as "/", the mount's root."""
    text = _read(proc_cgroup)
    if text is None:
        return None
    found: list[float] = []
    for line in text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: "0::/path"
            base, name = root, "cpu.max"
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/path"
            base, name = _v1_mount(root, controllers), "cpu.cfs_quota_us"
        else:
            continue
        here = Path(os.path.normpath(base / path.strip().lstrip("/")))  # ("..": still under base)
        for d in (here, *here.parents):
            if not d.is_relative_to(base):
                break
            q = (_quota(_read(d / name) or "") if name == "cpu.max"
                 else _quota(_read(d / name) or "", _read(d / "cpu.cfs_period_us") or ""))
            if q is not None:
                found.append(q)
    return min(found) if found else None


def _v1_mount(root: Path, controllers: str) -> Path:
    """Where a v1 hierarchy holding the cpu controller is mounted: `cpu,cpuacct` or `cpu`."""
    for name in (controllers, "cpu,cpuacct", "cpu"):
        if (root / name).is_dir():
            return root / name
    return root / "cpu"


def usable_cpus() -> int:
    """The CPUs this process can keep busy at once: its affinity, capped by its cgroup's quota
    (rounded up: 1.5 CPUs let two threads run most of the time). At least 1."""
    cpus = affinity()
    n = len(cpus) if cpus else (os.cpu_count() or 1)
    quota = cgroup_cpus()
    if quota is not None:
        n = min(n, math.ceil(quota - 1e-9))
    return max(1, n)


# ------------------------------------------------------------------ hybrid CPUs: performance cores

SYS_DEVICES = Path("/sys/devices")
SYS_CPU = Path("/sys/devices/system/cpu")
CPULIST_MAX = 1 << 16  # no machine has more CPUs: a longer range in a CPU list is nonsense, not a list


def cpulist(text: str) -> frozenset[int]:
    """A kernel CPU list ("0-7,16,18-19"); empty for anything that is not one."""
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            return frozenset()
        if a < 0 or b < a or b - a >= CPULIST_MAX:
            return frozenset()
        out.update(range(a, b + 1))
    return frozenset(out)


def fast_cpus(devices: Path = SYS_DEVICES) -> frozenset[int] | None:
    """The logical CPUs of the performance cores of a hybrid Intel CPU (Alder Lake and later: P- and
    E-cores), which Linux 5.13+ lists as two perf PMUs, `cpu_core` and `cpu_atom`; None where the CPU
    is not hybrid (one PMU, `cpu`) or the lists cannot be read."""
    core, atom = _read(devices / "cpu_core" / "cpus"), _read(devices / "cpu_atom" / "cpus")
    if core is None or atom is None:
        return None
    fast, slow = cpulist(core), cpulist(atom)
    return fast if fast and slow else None


def physical_cores(cpus: frozenset[int], sys_cpu: Path = SYS_CPU) -> int:
    """Physical cores among these logical CPUs: SMT siblings (`thread_siblings_list`) count once."""
    cores = set()
    for c in cpus:
        siblings = cpulist(_read(sys_cpu / f"cpu{c}" / "topology" / "thread_siblings_list") or "")
        cores.add(min(siblings) if c in siblings else c)
    return len(cores)


def _sysctl_int(name: str) -> int | None:
    """A macOS integer sysctl (ctypes: `sysctl` the program would cost a process per call)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        value, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
        if libc.sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)):
            return None
    except (OSError, AttributeError):
        return None
    return value.value


def performance_cores(system: str | None = None, devices: Path = SYS_DEVICES, sys_cpu: Path = SYS_CPU,
                      sysctl: Callable[[str], int | None] = _sysctl_int) -> int | None:
    """The physical performance cores this process may run on, where the CPU mixes fast and slow
    cores; None where its cores are alike or the platform does not say.

    llama.cpp's threads wait for each other at every operation, so a thread on a slower core holds
    the others back: llama.cpp's own default (`cpu_get_num_math`) counts only an Intel hybrid CPU's
    P-cores, and on macOS only the performance cores (`hw.perflevel0.physicalcpu`), and so does
    ours. Linux on Intel reads the perf PMU lists (llama.cpp asks CPUID on each CPU in turn, which
    needs pinning a thread to each); a process pinned to E-cores only has cores that are alike.
    Not read: Windows (llama.cpp counts every core there too) and Arm big.LITTLE boards on Linux."""
    system = system or platform.system()
    if system == "Darwin":
        levels = sysctl("hw.nperflevels")
        fast = sysctl("hw.perflevel0.physicalcpu") if levels and levels > 1 else None
        return fast if fast and fast > 0 else None
    if system != "Linux":
        return None
    fast_set = fast_cpus(devices)
    if fast_set is None:
        return None
    mine = fast_set & (affinity() or fast_set)
    return physical_cores(mine, sys_cpu) if mine else None
