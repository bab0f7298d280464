"""`ggufdesk probe`: what this machine has for running models."""
from __future__ import annotations

import argparse
from typing import Any

from ggufdesk.cli import print_json
from ggufdesk.cli.worker import add_rpc_argument, describe_worker, probe_workers_json, rpc_from_args
from ggufdesk.core import hardware

NAME = "probe"
HELP = "show GPUs, CPU, RAM and measured memory bandwidth"
GiB = 1 << 30


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--remeasure", action="store_true", help="measure RAM bandwidth again")
    p.add_argument("--decode", action="store_true",
                   help="measure how fast llama.cpp decodes on this CPU, per weight type (about 50 s); the planner "
                        "uses it from then on")
    p.add_argument("--no-engine", action="store_true",
                   help="without an NVIDIA GPU, do not ask llama.cpp's device list (Metal, Vulkan, ...)")
    add_rpc_argument(p)


def engine_devices() -> list[dict[str, Any]]:
    """The ggml device list, from a short-lived engine process (the only place llama.cpp loads)."""
    from ggufdesk.engine.link.client import EngineClient

    client = EngineClient(auto_restart=False)
    try:
        ready = client.start(timeout=60)
        assert ready is not None  # wait=True: the Ready event, or a KnownError
        return ready.devices
    finally:
        client.shutdown()


def run(args: argparse.Namespace) -> int:
    if args.decode:
        probe_decode(quiet=args.json)
    hw = hardware.probe(remeasure=args.remeasure)
    devices = None
    if not hw.gpus and not args.no_engine:
        devices = engine_devices()
        hw = hardware.with_ggml_devices(hw, devices)
    workers = probe_workers_json(rpc_from_args(args))
    if args.json:
        print_json({**hw.to_json(), **({"ggml_devices": devices} if devices is not None else {}),
                    **({"rpc_workers": workers} if workers else {})})
        return 0
    for g in hw.gpus:
        bw = f", {g.bandwidth_gbs:.0f} GB/s" if g.bandwidth_gbs else ""
        extra = (f", compute {g.compute_capability or '?'}, PCIe gen {g.pcie_gen or '?'} x{g.pcie_width or '?'}"
                 if g.source == "nvml" else " (found by llama.cpp)")
        print(f"GPU {g.index}: {g.name}, {g.vram_free / GiB:.1f} of {g.vram_total / GiB:.1f} GB free{bw}{extra}")
    print(describe_cpu(hw.cpu))
    print(f"RAM: {hw.ram_available / GiB:.1f} of {hw.ram_total / GiB:.1f} GB available, "
          f"{hw.ram_bandwidth_gbs:.1f} GB/s read ({hw.ram_bandwidth_source}), {hw.cpu_gflops:.0f} GFLOPS")
    if line := describe_decode_probe(hw):
        print(line)
    for n in hw.notes:
        print(f"note: {n}")
    if devices is not None:
        print("llama.cpp build sees: " + (", ".join(f"{d['name']} ({d['type']})" for d in devices) or "nothing"))
    for w in workers:
        print(describe_worker(w))
    return 0


def describe_cpu(c: hardware.CPUInfo) -> str:
    fast = f", {c.cores_performance} of them performance cores" if c.cores_performance else ""
    usable = f" ({c.cores_usable} usable here)" if c.cores_usable else ""
    return (f"CPU: {c.name}, {c.cores_physical} cores{fast} / {c.cores_logical} threads{usable}, "
            f"{' '.join(c.flags) or 'no SIMD flags'}")


def probe_decode(*, quiet: bool) -> None:
    """Time llama.cpp's decode on this CPU and keep it; a KnownError: one plain line, exit 1."""
    from ggufdesk.engine.link import decode_probe

    if not quiet:
        print("measuring llama.cpp's decode on this CPU, per weight type (about 50 s).", flush=True)
    decode_probe.run_and_record()


def describe_decode_probe(hw: hardware.HardwareInfo) -> str | None:
    cal = hw.calibration
    if not cal.cpu_type_gbs:
        return None
    rates = ", ".join(f"{t} {gbs:.1f}" for t, gbs in cal.cpu_type_gbs)
    stale = "" if hardware.decode_probe_is_current() else (
        " (timed with another llama.cpp build; `ggufdesk probe --decode` times this one)")
    return f"CPU decode (llama.cpp, measured): {rates} GB/s{stale}"
