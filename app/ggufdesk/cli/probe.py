"""`ggufdesk probe`: what this machine has for running models."""
from __future__ import annotations

import argparse

from ggufdesk.cli import print_json
from ggufdesk.core import hardware

NAME = "probe"
HELP = "show GPUs, CPU, RAM and measured memory bandwidth"
GiB = 1 << 30


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--remeasure", action="store_true", help="measure RAM bandwidth again")


def run(args: argparse.Namespace) -> int:
    hw = hardware.probe(remeasure=args.remeasure)
    if args.json:
        print_json(hw.to_json())
        return 0
    for g in hw.gpus:
        bw = f", {g.bandwidth_gbs:.0f} GB/s" if g.bandwidth_gbs else ""
        print(f"GPU {g.index}: {g.name}, {g.vram_free / GiB:.1f} of {g.vram_total / GiB:.1f} GB free"
              f"{bw}, compute {g.compute_capability or '?'}, PCIe gen {g.pcie_gen or '?'} x{g.pcie_width or '?'}")
    c = hw.cpu
    print(f"CPU: {c.name}, {c.cores_physical} cores / {c.cores_logical} threads, {' '.join(c.flags) or 'no SIMD flags'}")
    print(f"RAM: {hw.ram_available / GiB:.1f} of {hw.ram_total / GiB:.1f} GB available, "
          f"{hw.ram_bandwidth_gbs:.1f} GB/s read ({hw.ram_bandwidth_source}), {hw.cpu_gflops:.0f} GFLOPS")
    for n in hw.notes:
        print(f"note: {n}")
    return 0
