"""Ollama's POST /api/pull and DELETE /api/delete over our own downloader and the local library.

Pull takes Hugging Face names as Ollama writes them, `hf.co/owner/repo[:QUANT]` (QUANT defaults to
Q4_K_M, as Ollama's does), downloads the repo's GGUF of that quant (every part of a split set) into
the Hugging Face cache with core/downloads.py (resume, sha256), and streams its progress in Ollama's
NDJSON statuses. Delete removes a model only where the file is ggufdesk's to remove: one downloaded
into the Hugging Face cache, and not the model being served; files of LM Studio, Ollama or added by
path are refused (403).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ggufdesk.core.errors import KnownError
from ggufdesk.server.errors import ApiError, invalid
from ggufdesk.server.http import parse_body, service
from ggufdesk.server.ollama import ModelRequest
from ggufdesk.server.schemas import Strict

log = logging.getLogger("ggufdesk.server")
HF_NAME = re.compile(r"^(?:https?://)?(?:hf\.co|huggingface\.co)/([\w.-]+/[\w.-]+)(?::([\w.-]+))?$", re.I)
DEFAULT_QUANT = "Q4_K_M"


class PullRequest(Strict):
    model: str | None = None
    name: str | None = None
    stream: bool = True
    insecure: bool = False


def parse_name(name: str) -> tuple[str, str]:
    """(repo, quant) of `hf.co/owner/repo[:QUANT]`; a 400 for anything else."""
    m = HF_NAME.match(name.strip())
    if m is None or any(part.strip(".") == "" for part in m[1].split("/")):  # no "." or ".." for a name
        raise invalid(f"cannot pull {name!r}: this server pulls Hugging Face GGUF repos, named "
                      "hf.co/owner/repo[:QUANT] (Ollama's registry is not available here)", param="model")
    quant = m[2] or DEFAULT_QUANT
    return m[1], "" if quant.lower() == "latest" else quant


def choose(repo: str, quant: str) -> Any:
    """The repo's model of that quant (any quant when none was named and Q4_K_M is missing: the first)."""
    from ggufdesk.core import downloads

    models = downloads.list_gguf(repo)
    if not models:
        raise ApiError(404, f"{repo} holds no GGUF model", code="model_not_found", reason="unknown_model")
    want = (quant or DEFAULT_QUANT).upper()
    hit = next((m for m in models if (m.quant or "").upper() == want), None)
    if hit is None and not quant:
        hit = models[0]
    if hit is None:
        have = ", ".join(sorted({m.quant or m.name for m in models}))
        raise ApiError(404, f"{repo} has no {want} GGUF; it has {have}", code="model_not_found", reason="unknown_model")
    return hit


async def pull(request: Request) -> Response:
    req = await parse_body(request, PullRequest)
    repo, quant = parse_name(req.model or req.name or "")
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    cancel = threading.Event()

    def put(obj: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, obj)

    def work() -> None:
        try:
            put({"status": "pulling manifest"})
            model = choose(repo, quant)
            for f in model.files:
                _fetch(repo, f, put, cancel)
            put({"status": "verifying sha256 digest"})
            put({"status": "writing manifest"})
            put({"status": "success"})
        except ApiError as e:
            put({"error": e.message, "_status": e.status})
        except KnownError as e:  # the hub or the disk failed us
            put({"error": str(e), "_status": 502})
        finally:
            put(None)

    worker = threading.Thread(target=work, name="ollama-pull", daemon=True)
    worker.start()
    if req.stream:
        return StreamingResponse(_lines(queue, cancel), media_type="application/x-ndjson")
    last: dict[str, Any] = {}
    while (item := await queue.get()) is not None:
        last = item
    if "error" in last:
        raise ApiError(int(last.get("_status", 500)), last["error"], reason="invalid")
    return JSONResponse({"status": "success"})


def _fetch(repo: str, f: Any, put: Any, cancel: threading.Event) -> None:
    from ggufdesk.core import downloads

    digest = f"sha256:{f.sha256}" if f.sha256 else f.path

    def progress(p: downloads.Progress) -> None:
        put({"status": f"pulling {digest.removeprefix('sha256:')[:12]}", "digest": digest, "total": f.size,
             "completed": p.done})

    put({"status": f"pulling {digest.removeprefix('sha256:')[:12]}", "digest": digest, "total": f.size,
         "completed": 0})
    done = downloads.download(repo, f.path, progress=progress, cancel=cancel)
    put({"status": f"pulling {digest.removeprefix('sha256:')[:12]}", "digest": digest, "total": f.size,
         "completed": done.bytes})


async def _lines(queue: asyncio.Queue[Any], cancel: threading.Event) -> AsyncIterator[str]:
    try:
        while (item := await queue.get()) is not None:
            item.pop("_status", None)
            yield json.dumps(item) + "\n"
    finally:
        cancel.set()  # the client went away: the download stops (its partial file is kept for a resume)


async def delete(request: Request) -> Response:
    from ggufdesk.core import library

    svc = service(request)
    req = await parse_body(request, ModelRequest)
    name = req.which.removesuffix(":latest")
    hit = library.find(name, await asyncio.to_thread(library.entries)) if name else None
    if hit is None:
        raise ApiError(404, f"model '{req.which}' not found", code="model_not_found", reason="unknown_model")
    path = Path(library.file_for(hit))
    if any(Path(m["path"]).resolve() == path.resolve() for m in svc.models()):
        raise invalid(f"'{req.which}' is the model this server is serving; stop the server to delete it")
    if hit.source != "hf-cache":
        raise ApiError(403, f"'{req.which}' is not ggufdesk's to delete (it belongs to {hit.source}: "
                            f"{path}); remove it there", code="forbidden", reason="invalid")
    await asyncio.to_thread(remove_from_cache, path)
    return Response(status_code=200)


def remove_from_cache(snapshot: Path) -> None:
    """Remove one file from the Hugging Face cache: its snapshot link, and its blob unless another
    snapshot still points at it."""
    blob = snapshot.resolve()
    snapshot.unlink(missing_ok=True)
    repo_dir = blob.parent.parent  # <repo>/blobs/<hash>
    still_used = any(p.is_symlink() and p.resolve() == blob for p in (repo_dir / "snapshots").rglob("*"))
    if not still_used:
        blob.unlink(missing_ok=True)


ROUTES = [Route("/api/pull", pull, methods=["POST"]), Route("/api/delete", delete, methods=["DELETE"])]
