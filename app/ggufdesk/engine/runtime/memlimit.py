"""The engine's memory ceiling: RLIMIT_DATA from the planner's figure, set before each load.

RLIMIT_DATA (Linux >= 4.7) counts the heap and private writable mappings, not the read-only
shared mapping llama.cpp uses for an mmap'd model file, so the file's size does not eat the
ceiling while everything allocated (KV cache, compute buffers, weights read without mmap,
repacked weights, Python objects, a chat template's strings) does. RLIMIT_AS would count the
mapped file and every thread's address space reservations and is not used.

Only the soft limit is set (the next load may raise it again); GPU loads are left unlimited,
since GPU drivers map large host regions of their own.
"""
from __future__ import annotations

import logging
import sys

from ggufdesk.core.settings import LoadSettings

log = logging.getLogger("ggufdesk.engine")

MiB = 1 << 20
GiB = 1 << 30
MARGIN_MIN = 1 * GiB  # Python, libraries, thread stacks, what the plan does not model


def data_bytes() -> int | None:
    """This process's data segment now (VmData), or None where /proc is not there."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def planned_bytes(model: str, settings: LoadSettings, draft: str | None, mmproj: str | None = None) -> int:
    """RAM the planner expects this load to use (weights counted even when mmap'd: it is margin; a
    vision projector's are read into memory, never mapped)."""
    from ggufdesk.core import gguf_meta, planner
    from ggufdesk.core.projector import read_projector

    def ram(path: str) -> int:
        return planner.memory(gguf_meta.read_gguf(path), n_ctx=settings.n_ctx, n_ubatch=settings.n_ubatch,
                              type_k=settings.type_k, type_v=settings.type_v, flash_attn=settings.flash_attn).ram

    total = ram(model)
    if draft:
        total += ram(draft)
    if mmproj:
        total += read_projector(mmproj).memory_bytes(settings.flash_attn != "off")
    return total


def limit_for(model: str, settings: LoadSettings, draft: str | None = None, mmproj: str | None = None) -> int | None:
    """The ceiling for this load, or None when none is set (GPU offload, no /proc, unreadable file)."""
    if settings.n_gpu_layers != 0 or not sys.platform.startswith("linux"):
        return None
    now = data_bytes()
    if now is None:
        return None
    try:
        plan = planned_bytes(model, settings, draft, mmproj)
    except Exception as e:  # noqa: BLE001 - the engine's own load reports a bad file better
        log.info("no memory limit for %s: %s", model, e)
        return None
    return now + plan + settings.prompt_cache_ram_bytes + max(MARGIN_MIN, plan // 2)


def apply(limit: int | None) -> int | None:
    """Set the soft RLIMIT_DATA (None: unlimited, up to the hard limit). Returns what was set."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = resource.RLIM_INFINITY if limit is None else limit
    if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
        soft = hard
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    except (ValueError, OSError) as e:
        log.warning("could not set the engine's memory limit: %s", e)
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)
