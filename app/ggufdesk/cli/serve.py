"""`ggufdesk serve [MODEL ...]`: an OpenAI/Anthropic-compatible HTTP server, an engine process per loaded model."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
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
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (others need --api-key); several: comma-separated")
    p.add_argument("--port", type=int, default=8080, help="port (0 = any free port)")
    p.add_argument("--parallel", type=int, default=4, help="requests generated at once")
    p.add_argument("--prefill-chunk", type=int, default=0,
                   help="prompt tokens per step beside streaming requests (0 = sized from measured step times)")
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
                   help="a web page origin allowed to call the API from a browser, e.g. http://localhost:3000; "
                        "'localhost': any page on this machine; '*': any page (repeatable; none by default)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="seconds a request may wait and generate before it is stopped with a 504 (reading its "
                        "prompt is not counted; 0 = no limit)")
    p.add_argument("--read-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a request's headers and body may take to arrive")
    p.add_argument("--max-connections", type=int, default=0, metavar="N",
                   help="open connections at most (0 = sized from the process's file descriptor limit)")
    p.add_argument("--idle-unload", type=float, default=600.0, metavar="S",
                   help="unload a model idle this many seconds (0 = never; a request's keep_alive overrides)")
    p.add_argument("--max-loaded", type=int, default=0, metavar="N",
                   help="models loaded at once (0 = as many as the memory budget holds)")
    p.add_argument("--alias", action="append", default=[], metavar="NAME=ID",
                   help="another name for a served model (repeatable); NAME alone (or several, comma-separated) "
                        "names the first model, as llama-server's --alias")
    p.add_argument("--tags", default="", help="comma-separated labels /models lists for the model (llama-server's)")
    p.add_argument("--chat-template-file", help="a Jinja chat template to use instead of the model's own")
    p.add_argument("--chat-template", help="a chat template as Jinja text, or a built-in name "
                                           "(chatml, llama3, command-r, gemma, phi3)")
    p.add_argument("--no-metrics", action="store_true", help="no /metrics endpoint (it answers 501)")
    p.add_argument("--metrics", action="store_true", help=argparse.SUPPRESS)  # llama-server's flag: on anyway
    p.add_argument("--slots", action="store_true", help="serve llama-server's /slots monitoring endpoint")
    p.add_argument("--verbose", dest="verbose_answers", action="store_true",
                   help="as llama-server's --verbose: every OpenAI answer carries `__verbose` (the prompt as the "
                        "model read it, the native answer), and the log says what happens (as ggufdesk -v)")
    p.add_argument("--ollama-port", type=int, default=None,
                   help="also listen on this port (11434 for clients that hard-code Ollama's); off by default")


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
    template = chat_template(args)
    found = library.entries()
    out: dict[str, ModelEntry] = {}
    for model_id, path, m in _candidates(args.model, found):
        preset = presets.get(model_id)
        load, _, spec = settings_from_args(args, preset)
        load = dataclasses.replace(load, n_parallel=args.parallel, prefill_chunk=args.prefill_chunk,
                                   chat_template=template)
        sampling = {k: v for k, v in (preset.known("sampling") if preset else {}).items()
                    if k not in given["sampling"]}
        file: Any = (lambda m=m: str(library.file_for(m))) if m is not None else None
        out.setdefault(model_id, ModelEntry(
            id=model_id, path=str(path), load=load, speculation=spec, name=m.name if m else path.name,
            size=m.size if m else path.stat().st_size, source=m.source if m else "user",
            quant=m.quant if m else None, sampling=sampling,
            system_prompt=preset.system_prompt if preset else None, file=file))
    return list(out.values())


def _named(entries: list[ModelEntry], pairs: list[str]) -> tuple[list[ModelEntry], dict[str, str]]:
    """The entries and --alias NAME=ID pairs. NAME alone (or comma-separated names) names the first model
    as llama-server's --alias does: the first in sorted order becomes its id, the others answer too (and
    its file name, as any file stem does)."""
    out: dict[str, str] = {}
    bare: set[str] = set()
    for pair in pairs:
        name, sep, target = pair.partition("=")
        if not sep:
            bare.update(n.strip() for n in pair.split(",") if n.strip())
        elif not name.strip() or not target.strip():
            raise KnownError(f"--alias {pair!r}: write it as NAME=ID")
        else:
            out[name.strip()] = target.strip()
    if bare and entries:
        first, *others = sorted(bare)
        old = entries[0].id
        entries = [dataclasses.replace(entries[0], id=first), *entries[1:]]
        out = {**{n: first for n in others}, **{n: first if t == old else t for n, t in out.items()}}
    return entries, out


def _presets() -> dict[str, Preset]:
    from ggufdesk.core.errors import SettingsError
    from ggufdesk.core.settings import load_settings

    try:
        return load_settings().presets
    except SettingsError as e:
        print(f"ggufdesk serve: presets not used: {e}", file=sys.stderr)
        return {}


def _check_limits(args: argparse.Namespace) -> None:
    """Refuse counts, sizes, timeouts and ports that cannot be."""
    if args.parallel < 1:
        raise KnownError("--parallel must be at least 1")
    if args.queue < 0 or args.rate_limit < 0 or args.max_body < 1 or args.prefill_chunk < 0:
        raise KnownError("--queue, --rate-limit and --prefill-chunk cannot be negative, --max-body must be positive")
    if args.idle_unload < 0 or args.max_loaded < 0:
        raise KnownError("--idle-unload and --max-loaded cannot be negative")
    if not args.request_timeout >= 0 or not args.read_timeout > 0 or args.max_connections < 0:
        raise KnownError("--request-timeout cannot be negative, --read-timeout must be positive and "
                         "--max-connections cannot be negative")
    if args.ollama_port is not None and not 0 <= args.ollama_port <= 65535:
        raise KnownError("--ollama-port must be a port number (0-65535)")


def _cors_origins(args: argparse.Namespace) -> tuple[str, ...]:
    """--cors-origin's origins (scheme and host, no trailing slash), `localhost` or `*` (llama-server's
    keywords: loopback origins, any origin); anything else is refused. `*` is said aloud at start."""
    origins = tuple(o.strip().rstrip("/") for o in args.cors_origin if o.strip())
    bad = [o for o in origins if o not in ("*", "localhost") and not re.match(r"^https?://[^/\s]+$", o)]
    if bad:
        raise KnownError(f"--cors-origin takes an origin such as http://localhost:3000 (scheme and host, no path), "
                         f"'localhost' or '*', not {bad[0]!r}")
    if "*" in origins:
        print("ggufdesk serve: warning: --cors-origin '*' lets any web page you open use this server",
              file=sys.stderr, flush=True)
    return origins


def build(args: argparse.Namespace) -> tuple[Service, ServerRunner]:
    """The service and runner `serve` would run (tests and the bench build the same)."""
    from ggufdesk.server.pool import EnginePool
    from ggufdesk.server.router import Router
    from ggufdesk.server.runner import ServerRunner, check_exposure
    from ggufdesk.server.service import ServerConfig, Service

    _check_limits(args)
    origins = _cors_origins(args)
    keys = tuple(k for k in args.api_key if k)
    for host in args.host.split(","):
        check_exposure(host.strip(), keys)
    _, sampling, _ = settings_from_args(args)
    config = ServerConfig(api_keys=keys, rate_limit=args.rate_limit, parallel=args.parallel,
                          max_queue=args.queue, max_body=args.max_body, default_max_tokens=sampling.max_tokens,
                          sampling=sampling, request_timeout=args.request_timeout, cors_origins=origins,
                          read_timeout=args.read_timeout, max_connections=args.max_connections,
                          metrics=not args.no_metrics, slots=args.slots, verbose=args.verbose_answers,
                          tags=tuple(t.strip() for t in args.tags.split(",") if t.strip()),
                          max_image_body=max(args.max_image_body, args.max_body),
                          allow_remote_images=args.allow_remote_images)
    entries, aliases = _named(entries_for(args, _presets()), args.alias)
    router = Router(entries=entries, idle_unload_s=args.idle_unload, max_loaded=args.max_loaded, aliases=aliases,
                    pool_factory=lambda e, path: EnginePool(model=path, load=e.load, speculation=e.speculation,
                                                            model_id=e.id))
    service = Service(router=router, config=config)
    return service, ServerRunner(service, host=args.host, port=args.port, ollama_port=args.ollama_port)


def chat_template(args: argparse.Namespace) -> str | None:
    """--chat-template-file's text, or --chat-template's (a built-in name or Jinja text)."""
    from ggufdesk.core.chat_templates import template_for

    if getattr(args, "chat_template_file", None):
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                return f.read((1 << 20) + 1)
        except (OSError, UnicodeDecodeError) as e:
            raise KnownError(f"cannot read the chat template {args.chat_template_file}: {e}") from None
    value = getattr(args, "chat_template", None)
    return template_for(value) if value else None


def run(args: argparse.Namespace) -> int:
    from ggufdesk.server.errors import ApiError

    if args.verbose_answers:  # llama-server's --verbose logs too
        logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))
    service, runner = build(args)
    router = service.router
    url = runner.bind()
    preload = len(args.model) == 1  # one model: loaded now, as before; several or the library: when asked
    what = f"loading {router.default_id}" if preload else f"{len(router.slots)} models, each loaded when asked"
    print(f"ggufdesk serve: listening on {url} ({what}; GET {url}/health says when ready)", flush=True)
    if runner.ollama_port is not None:
        print(f"ggufdesk serve: also listening on port {runner.ollama_port} (Ollama's API and the rest)", flush=True)
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
