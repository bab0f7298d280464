"""`ggufdesk ps`: ask a running `ggufdesk serve` which models it has loaded (or is loading), their memory and expiry."""
from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from typing import Any

from ggufdesk.cli import print_json
from ggufdesk.core.errors import KnownError

NAME = "ps"
HELP = "show the models a running server has loaded (GET /v1/models of `ggufdesk serve`)"
MiB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL")
    p.add_argument("--api-key", default="", help="the server's API key, if it needs one")
    p.add_argument("--all", action="store_true", help="list every servable model, not only the loaded ones")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def fetch_models(url: str, api_key: str = "", timeout: float = 10.0) -> list[dict[str, Any]]:
    if not url.startswith(("http://", "https://")):
        raise KnownError(f"--url must be an http:// or https:// address, got {url!r}")
    req = urllib.request.Request(url.rstrip("/") + "/v1/models",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.loads(r.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        raise KnownError(f"the server at {url} answered {e.code} {e.reason}"
                         + (" (give its key with --api-key)" if e.code == 401 else "")) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise KnownError(f"no server answers at {url} ({reason}); start one with `ggufdesk serve`") from None
    except ValueError:
        raise KnownError(f"{url}/v1/models did not answer JSON: is it a ggufdesk server?") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise KnownError(f"{url}/v1/models did not list models")
    return [m for m in data if isinstance(m, dict)]


def until(expires_at: float | None) -> str:
    if expires_at is None:
        return "stays"
    left = expires_at - time.time()
    return "now" if left <= 0 else f"{left / 60:.0f} min" if left >= 90 else f"{left:.0f} s"


def run(args: argparse.Namespace) -> int:
    models = fetch_models(args.url, args.api_key)
    shown = models if args.all else [m for m in models if m.get("state") in ("ready", "loading", "unloading")]
    if args.json:
        print_json({"url": args.url, "models": shown})
        return 0
    if not shown:
        print(f"no model loaded at {args.url} ({len(models)} servable; each loads when a request names it)")
        return 0
    print(f"{'MODEL':<32} {'STATE':<10} {'RAM':>9} {'VRAM':>9} {'CONTEXT':>8} {'ACTIVE':>6}  UNLOADS IN")
    for m in shown:
        print(f"{m.get('id', '?'):<32} {m.get('state', '?'):<10} {(m.get('ram_bytes') or 0) / MiB:>5.0f} MiB "
              f"{(m.get('vram_bytes') or 0) / MiB:>5.0f} MiB {m.get('n_ctx') or '':>8} {m.get('active', 0):>6}  "
              f"{until(m.get('expires_at')) if m.get('state') == 'ready' else ''}")
    return 0
