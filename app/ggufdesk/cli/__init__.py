"""Command line: `ggufdesk` alone starts the GUI; subcommands run the same code paths headless."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any

from ggufdesk import __version__
from ggufdesk.core.errors import KnownError

# Each module defines NAME, HELP, add_arguments(parser) and run(args) -> int.
SUBCOMMANDS = ("probe", "plan", "recommend", "download", "library", "run", "chat", "docs",
               "serve", "ps", "worker", "cache")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggufdesk", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument("--version", action="version", version=f"ggufdesk {__version__}")
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
    # huggingface_hub prints through a handler of its own: without this, each line came twice
    logging.getLogger("huggingface_hub").propagate = False
    if not getattr(args, "_run", None):
        build_parser().print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:
        return _stdout_closed()
    except (KnownError, OSError) as e:  # OSError: a disk, folder or pipe the user can fix
        return _report(args, e)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one plain line, the trace with -v: never a bare traceback
        log = logging.getLogger("ggufdesk")
        log.debug("internal error", exc_info=True)
        if not args.verbose:
            e = KnownError(f"internal error ({type(e).__name__}: {e}); this is a bug in ggufdesk, "
                           "run again with -v for the details")
        else:
            log.error("internal error", exc_info=True)
        _report(args, e)
        return 70  # EX_SOFTWARE


def _report(args: argparse.Namespace, e: BaseException) -> int:
    try:
        if getattr(args, "json", False):
            print_json({"error": str(e), "kind": type(e).__name__})
        else:
            print(f"ggufdesk: {e}", file=sys.stderr)
    except BrokenPipeError:
        return _stdout_closed()
    return 1


def _stdout_closed() -> int:
    """`ggufdesk run ... | head`: the reader left. Quiet exit, as a program killed by SIGPIPE would."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
    except (OSError, ValueError):
        pass
    return 141


if __name__ == "__main__":
    sys.exit(main())
