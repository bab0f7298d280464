"""The self-contained bundle's build facts (build.json beside the executable) and its once-only GPU hint."""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ggufdesk.bundle")

BUILD_FILE = "build.json"  # written by installer/build_bundle.sh next to the bundle's executable
HINT_FILE = "gpu-hint-shown"
AMD_VENDOR = "0x1002"


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildInfo:
    version: str
    variant: str  # cpu | cuda | metal | vulkan (the llama-cpp-python build inside)
    platform: str


def build_info(exe: str | None = None) -> BuildInfo | None:
    """The bundle's build.json when running frozen (or for `exe`), else None (a venv or a wheel install)."""
    if exe is None:
        if not getattr(sys, "frozen", False):
            return None
        exe = sys.executable
    try:
        d = json.loads((Path(exe).resolve().parent / BUILD_FILE).read_text())
        return BuildInfo(version=str(d["version"]), variant=str(d["variant"]), platform=str(d["platform"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("bundle build facts unreadable: %s", e)
        return None


def gpus_here() -> list[tuple[str, str]]:
    """[(kind, name)] of GPUs a GPU build could use: NVIDIA through NVML, AMD through sysfs."""
    from ggufdesk.core.hardware import probe_nvidia

    found = [("nvidia", g.name) for g in probe_nvidia()[0]]
    for vendor in sorted(Path("/sys/class/drm").glob("card[0-9]*/device/vendor")):
        try:
            if vendor.read_text().strip() == AMD_VENDOR:
                found.append(("amd", "AMD Radeon GPU"))
                break
        except OSError:
            continue
    return found


def gpu_hint(info: BuildInfo | None, gpus: list[tuple[str, str]]) -> str | None:
    """Plain words for a CPU build on a machine with a usable GPU, or None."""
    if info is None or info.variant != "cpu" or not gpus:
        return None
    kind, name = gpus[0]
    variant, needs = (("cuda", "the NVIDIA driver (CUDA 12 or newer)") if kind == "nvidia"
                      else ("vulkan", "the Vulkan driver (Debian/Ubuntu: mesa-vulkan-drivers)"))
    return (f"This is the CPU build of ggufdesk {info.version}, and this computer has a GPU ({name}) "
            f"that it does not use. For GPU speed install the {variant} build instead "
            f"(ggufdesk-{info.version}-{info.platform}-{variant}), which needs {needs}.")


def hint_once(state_dir: Path, info: BuildInfo | None = None, gpus: list[tuple[str, str]] | None = None,
              ) -> str | None:
    """The GPU hint the first time this bundle version runs on this machine; None afterwards."""
    info = info if info is not None else build_info()
    if info is None or info.variant != "cpu":
        return None
    marker = state_dir / HINT_FILE
    try:
        if info.version in marker.read_text().split():
            return None
    except OSError:
        pass
    msg = gpu_hint(info, gpus if gpus is not None else gpus_here())
    if msg is None:
        return None
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with marker.open("a") as f:
            f.write(info.version + "\n")
    except OSError as e:
        log.warning("could not remember the GPU hint in %s: %s", marker, e)
    return msg
