"""`ggufdesk cache [--clear] [--json]`: the disk prompt cache's size and entries (core/prompt_cache.py)."""
from __future__ import annotations

import argparse
import os
import time

NAME = "cache"
HELP = "show the disk prompt cache (saved prompt prefixes that survive a restart), or clear it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clear", action="store_true", help="delete every saved prefix")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _cap() -> int:
    """The size cap the app's engines use (settings.json's load section, else the default)."""
    from ggufdesk.core.settings import LoadSettings, open_settings

    try:
        return open_settings().settings.load.prompt_cache_bytes
    except OSError:
        return LoadSettings().prompt_cache_bytes


def run(args: argparse.Namespace) -> int:
    from ggufdesk.cli import print_json
    from ggufdesk.core import prompt_cache

    store = prompt_cache.PromptStore(prompt_cache.cache_dir(), max_bytes=_cap())
    cleared = store.clear() if args.clear else None
    info = store.summary()
    if cleared is not None:
        info["cleared"] = {"files": cleared[0], "bytes": cleared[1]}
    if args.json:
        print_json(info)
        return 0
    if cleared is not None:
        print(f"cleared {cleared[0]} entries ({_size(cleared[1])}) from {info['dir']}")
        return 0
    print(f"{info['dir']}: {len(info['entries'])} entries, {_size(info['bytes'])} of {_size(info['max_bytes'])}")
    for e in info["entries"]:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["last_used"]))
        print(f"  {e['tokens']:>7} tokens  {_size(e['bytes']):>9}  KV {e['type_k']}/{e['type_v']}  "
              f"used {when}  {os.path.basename(e['model'] or '?')}")
    return 0


def _size(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} bytes"
