"""OpenAI's POST /v1/embeddings (also /embeddings, as llama-server serves it): float or base64 vectors, batch input."""
from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk.server.errors import invalid
from ggufdesk.server.http import caller, parse_body, service
from ggufdesk.server.schemas import Strict

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request

Input = str | list[str] | list[int] | list[list[int]]


class EmbeddingsRequest(Strict):
    model: str | None = None  # OpenAI requires it; llama-server does not (one model is served)
    input: Input | None = None
    content: Input | None = None  # llama-server's older name for input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


def embedding_inputs(raw: Input | None, field: str = "input") -> list[str | list[int]]:
    """The request's input as a list of texts or token id lists; 400 for an empty or oversized one."""
    if raw is None:
        raise invalid(f"'{field}' is required: a string, a list of strings, or token ids", param=field)
    items: list[Any]
    if isinstance(raw, str):
        items = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        items = [raw]  # one input given as token ids
    else:
        items = list(raw)
    if not items:
        raise invalid(f"'{field}' must not be empty", param=field)
    if len(items) > MAX_INPUTS:
        raise invalid(f"'{field}' holds {len(items)} inputs; at most {MAX_INPUTS} at a time", param=field)
    for i, x in enumerate(items):
        if not x:
            raise invalid(f"'{field}[{i}]' is empty; every input needs some text or tokens", param=field)
    return items


def pack(vector: list[float], encoding: str) -> list[float] | str:
    """A vector as OpenAI sends it: a list of floats, or base64 of little-endian float32s."""
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


async def embeddings(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, EmbeddingsRequest)
    inputs = embedding_inputs(req.input if req.input is not None else req.content)
    model = svc.check_model(req.model)
    pool = svc.pool_for(model)
    size = pool.loaded.n_embd if pool.loaded is not None else 0
    if req.dimensions is not None and req.dimensions != size:
        raise invalid(f"dimensions {req.dimensions} is not supported: this model's embeddings have {size} "
                      "dimensions, and shortening them is not supported", param="dimensions", code="unsupported")
    ev = await svc.embed(caller(request), model, inputs, truncate=False, receive=request.receive)
    n = sum(ev.n_tokens)
    return JSONResponse({
        "object": "list", "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": pack(v, req.encoding_format)}
                 for i, v in enumerate(ev.vectors)],
        "usage": {"prompt_tokens": n, "total_tokens": n},
    })


ROUTES = [Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/embeddings", embeddings, methods=["POST"])]
