"""`ggufdesk serve [MODEL]`: a local OpenAI/Anthropic-compatible HTTP server over the engine process."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import sys
import threading

from ggufdesk.cli.run import add_model_arguments, resolve_model, settings_from_args
from ggufdesk.core.errors import KnownError

NAME = "serve"
HELP = "serve the model over an OpenAI- and Anthropic-compatible HTTP API (127.0.0.1 by default)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.set_defaults(max_tokens=1024)  # a request without max_tokens gets this many at most
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
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin allowed to call the API from a browser, e.g. http://localhost:3000 "
                        "(repeatable; none by default)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="seconds one generation may take before it is stopped with a 504 (0 = no limit)")
    p.add_argument("--read-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a request's headers and body may take to arrive")
    p.add_argument("--max-connections", type=int, default=0, metavar="N",
                   help="open connections at most (0 = sized from the process's file descriptor limit)")


def build(args: argparse.Namespace):
    """The pool, service and runner `serve` would run (tests and the bench build the same)."""
    from ggufdesk.server.pool import EnginePool
    from ggufdesk.server.runner import ServerRunner, check_exposure
    from ggufdesk.server.service import ServerConfig, Service

    if args.parallel < 1:
        raise KnownError("--parallel must be at least 1")
    if args.queue < 0 or args.rate_limit < 0 or args.max_body < 1 or args.prefill_chunk < 0:
        raise KnownError("--queue, --rate-limit and --prefill-chunk cannot be negative, --max-body must be positive")
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
    load, sampling, spec = settings_from_args(args)
    load = dataclasses.replace(load, n_parallel=args.parallel, prefill_chunk=args.prefill_chunk)
    config = ServerConfig(api_keys=keys, rate_limit=args.rate_limit, parallel=args.parallel,
                          max_queue=args.queue, max_body=args.max_body, default_max_tokens=args.max_tokens,
                          sampling=sampling, request_timeout=args.request_timeout, cors_origins=origins,
                          read_timeout=args.read_timeout, max_connections=args.max_connections)
    pool = EnginePool(model=resolve_model(args.model), load=load, speculation=spec)
    service = Service(pool=pool, config=config)
    return service, ServerRunner(service, host=args.host, port=args.port)


def run(args: argparse.Namespace) -> int:
    service, runner = build(args)
    pool = service.pool
    url = runner.bind()
    print(f"ggufdesk serve: listening on {url} (loading {pool.model_id}; GET {url}/health says when ready)",
          flush=True)
    failure: list[str] = []

    def load() -> None:
        try:
            pool.start()
        except KnownError as e:
            failure.append(str(e))
            runner.stop(timeout=0)
            return
        loaded = pool.loaded
        print(f"ggufdesk serve: ready: model {pool.model_id!r}, context {loaded.n_ctx if loaded else '?'}, "
              f"{service.config.parallel} at once; OpenAI base URL {url}/v1", flush=True)

    threading.Thread(target=load, name="serve-load", daemon=True).start()
    try:
        asyncio.run(runner.serve())
    finally:
        pool.shutdown()
    if failure:
        raise KnownError(f"the model did not load: {failure[0]}")
    print("ggufdesk serve: stopped", file=sys.stderr)
    return 0
