"""Command line: `ggufdesk` alone starts the GUI; subcommands run the same code paths headless."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from typing import Any

from ggufdesk.core.errors import KnownError

# Each module defines NAME, HELP, add_arguments(parser) and run(args) -> int.
SUBCOMMANDS = ("probe", "plan", "recommend", "download", "library", "run", "chat",
               "worker")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggufdesk", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"ggufdesk.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"ggufdesk.cli.{name}":
                continue  # not built yet
            raise
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        from ggufdesk.ui.app import main as gui_main  # lazy: the CLI must work without a display

        return gui_main()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        build_parser().print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KnownError as e:
        if getattr(args, "json", False):
            print_json({"error": str(e), "kind": type(e).__name__})
        else:
            print(f"ggufdesk: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
