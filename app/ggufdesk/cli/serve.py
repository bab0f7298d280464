"""`ggufdesk serve [MODEL ...]`: an OpenAI/Anthropic-compatible HTTP server, an engine process per loaded model."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import sys
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ggufdesk.cli.run import add_model_arguments, given_settings, settings_from_args
from ggufdesk.core.errors import KnownError

if TYPE_CHECKING:
    from ggufdesk.core.library import LocalModel
    from ggufdesk.core.settings import Preset
    from ggufdesk.server.router import ModelEntry
    from ggufdesk.server.runner import ServerRunner
    from ggufdesk.server.service import Service

NAME = "serve"
HELP = ("serve models over an OpenAI- and Anthropic-compatible HTTP API (127.0.0.1 by default); "
        "with no MODEL the whole library, each loaded when a request names it")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, many=True)
    p.set_defaults(default_max_tokens=1024)  # a request without max_tokens gets this many at most
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (others need --api-key)")
    p.add_argument("--port", type=int, default=8080, help="port (0 = any free port)")
    p.add_argument("--parallel", type=int, default=4, help="requests generated at once")
    p.add_argument("--prefill-chunk", type=int, default=0,
                   help="prompt tokens per step while others decode (0 = sized from measured step times)")
    p.add_argument("--queue", type=int, default=64, help="requests that may wait beyond those (then 503)")
    p.add_argument("--api-key", action="append", default=[], help="required API key (repeatable)")
    p.add_argument("--rate-limit", type=int, default=0,
                   help="prompt + generated tokens per minute per API key or client address (0 = off)")
    p.add_argument("--max-body", type=int, default=4 * 1024 * 1024, help="largest request body in bytes")
    # --context-overflow (from add_model_arguments) is each request's default; a request's own
    # "context_overflow" field wins
    p.add_argument("--max-image-body", type=int, default=96 * 1024 * 1024,
                   help="largest chat request body in bytes (chat bodies may carry images)")
    p.add_argument("--allow-remote-images", action="store_true",
                   help="fetch http(s) image URLs in requests (size and time limited); off: data: URLs only")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin allowed to call the API from a browser, e.g. http://localhost:3000 "
                        "(repeatable; none by default)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="seconds one generation may take before it is stopped with a 504 (0 = no limit)")
    p.add_argument("--read-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a request's headers and body may take to arrive")
    p.add_argument("--max-connections", type=int, default=0, metavar="N",
                   help="open connections at most (0 = sized from the process's file descriptor limit)")
    p.add_argument("--idle-unload", type=float, default=600.0, metavar="S",
                   help="unload a model idle this many seconds (0 = never; a request's keep_alive overrides)")
    p.add_argument("--max-loaded", type=int, default=0, metavar="N",
                   help="models loaded at once (0 = as many as the memory budget holds)")
    p.add_argument("--alias", action="append", default=[], metavar="NAME=ID",
                   help="another name for a served model (repeatable)")


def _candidates(models: list[str], library_models: list[LocalModel]) -> list[tuple[str, Path, LocalModel | None]]:
    """(id, file, library entry) for each MODEL argument, or for the whole library when there is none."""
    from ggufdesk.core import library

    if not models:
        return [(m.id, m.path, m) for m in library_models]
    out: list[tuple[str, Path, LocalModel | None]] = []
    for name in models:
        hit = library.find(name, library_models)
        if hit is None:
            path = Path(library.resolve(name, library_models))  # a file outside the library (or the error)
            out.append((library.id_for(path, library_models), path, None))
        else:
            out.append((hit.id, hit.path, hit))
    return out


def entries_for(args: argparse.Namespace, presets: dict[str, Preset]) -> list[ModelEntry]:
    """What `serve` offers: each model with the defaults, its preset, then the flags given here over them."""
    from ggufdesk.core import library
    from ggufdesk.server.router import ModelEntry

    given = given_settings(args)
    found = library.entries()
    out: dict[str, ModelEntry] = {}
    for model_id, path, m in _candidates(args.model, found):
        preset = presets.get(model_id)
        load, _, spec = settings_from_args(args, preset)
        load = dataclasses.replace(load, n_parallel=args.parallel, prefill_chunk=args.prefill_chunk)
        sampling = {k: v for k, v in (preset.known("sampling") if preset else {}).items()
                    if k not in given["sampling"]}
        file: Any = (lambda m=m: str(library.file_for(m))) if m is not None else None
        out.setdefault(model_id, ModelEntry(
            id=model_id, path=str(path), load=load, speculation=spec, name=m.name if m else path.name,
            size=m.size if m else path.stat().st_size, source=m.source if m else "user",
            quant=m.quant if m else None, sampling=sampling,
            system_prompt=preset.system_prompt if preset else None, file=file))
    return list(out.values())


def _aliases(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, target = pair.partition("=")
        if not sep or not name.strip() or not target.strip():
            raise KnownError(f"--alias {pair!r}: write it as NAME=ID")
        out[name.strip()] = target.strip()
    return out


def _presets() -> dict[str, Preset]:
    from ggufdesk.core.errors import SettingsError
    from ggufdesk.core.settings import load_settings

    try:
        return load_settings().presets
    except SettingsError as e:
        print(f"ggufdesk serve: presets not used: {e}", file=sys.stderr)
        return {}


def build(args: argparse.Namespace) -> tuple[Service, ServerRunner]:
    """The service and runner `serve` would run (tests and the bench build the same)."""
    from ggufdesk.server.pool import EnginePool
    from ggufdesk.server.router import Router
    from ggufdesk.server.runner import ServerRunner, check_exposure
    from ggufdesk.server.service import ServerConfig, Service

    if args.parallel < 1:
        raise KnownError("--parallel must be at least 1")
    if args.queue < 0 or args.rate_limit < 0 or args.max_body < 1 or args.prefill_chunk < 0:
        raise KnownError("--queue, --rate-limit and --prefill-chunk cannot be negative, --max-body must be positive")
    if args.idle_unload < 0 or args.max_loaded < 0:
        raise KnownError("--idle-unload and --max-loaded cannot be negative")
    if not args.request_timeout >= 0 or not args.read_timeout > 0 or args.max_connections < 0:
        raise KnownError("--request-timeout cannot be negative, --read-timeout must be positive and "
                         "--max-connections cannot be negative")
    origins = tuple(o.rstrip("/") for o in args.cors_origin if o)
    bad = [o for o in origins if not re.match(r"^https?://[^/\s]+$", o)]
    if bad:
        raise KnownError(f"--cors-origin takes an origin such as http://localhost:3000 (scheme and host, no path), "
                         f"not {bad[0]!r}")
    keys = tuple(k for k in args.api_key if k)
    check_exposure(args.host, keys)
    _, sampling, _ = settings_from_args(args)
    config = ServerConfig(api_keys=keys, rate_limit=args.rate_limit, parallel=args.parallel,
                          max_queue=args.queue, max_body=args.max_body, default_max_tokens=sampling.max_tokens,
                          sampling=sampling, request_timeout=args.request_timeout, cors_origins=origins,
                          read_timeout=args.read_timeout, max_connections=args.max_connections,
                          max_image_body=max(args.max_image_body, args.max_body),
                          allow_remote_images=args.allow_remote_images)
    router = Router(entries=entries_for(args, _presets()), idle_unload_s=args.idle_unload,
                    max_loaded=args.max_loaded, aliases=_aliases(args.alias),
                    pool_factory=lambda e, path: EnginePool(model=path, load=e.load, speculation=e.speculation,
                                                            model_id=e.id))
    service = Service(router=router, config=config)
    return service, ServerRunner(service, host=args.host, port=args.port)


def run(args: argparse.Namespace) -> int:
    from ggufdesk.server.errors import ApiError

    service, runner = build(args)
    router = service.router
    url = runner.bind()
    preload = len(args.model) == 1  # one model: loaded now, as before; several or the library: when asked
    what = f"loading {router.default_id}" if preload else f"{len(router.slots)} models, each loaded when asked"
    print(f"ggufdesk serve: listening on {url} ({what}; GET {url}/health says when ready)", flush=True)
    failure: list[str] = []

    async def load_first() -> None:
        try:
            slot = await router.load(router.default_id)
        except ApiError as e:
            failure.append(e.message)
            runner.stop(timeout=0)
            return
        n_ctx = slot.loaded.n_ctx if slot.loaded else "?"
        print(f"ggufdesk serve: ready: model {slot.id!r}, context {n_ctx}, {service.config.parallel} at once; "
              f"OpenAI base URL {url}/v1", flush=True)

    async def main() -> None:
        service.ensure_background()
        if preload:
            service.spawn(load_first())
        else:
            print(f"ggufdesk serve: ready: {len(router.slots)} models ({', '.join(router.ids)}), loaded when a "
                  f"request names one; {service.config.parallel} at once; OpenAI base URL {url}/v1", flush=True)
        await runner.serve()

    # SIGTERM (a service manager, `kill`) is a normal stop: uvicorn stops on it and then raises it
    # again for the default action, which would end this process before the engine is shut down.
    quiet = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: None) if quiet else None
    try:
        asyncio.run(main())
    finally:
        service.shutdown()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if failure:
        raise KnownError(f"the model did not load: {failure[0]}")
    print("ggufdesk serve: stopped", file=sys.stderr)
    return 0
