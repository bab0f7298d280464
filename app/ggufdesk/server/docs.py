"""Retrieval for API requests that name a document collection: `"docs": "NAME"` in a chat completion.

An ASGI layer in front of the routes (server/app.py adds it): it puts the best passages of the named
collection (ggufdesk docs add NAME PATH...) into the last user message, as the terminal chat and the
window do (session/docs.py), and adds the sources to the answer: `"citations": [{index, source,
page, lines, score, text}]` (and `"sources_left_out"`) in the JSON of /v1/chat/completions, or in one
extra chunk (`"choices": []`) just before `data: [DONE]` when streaming. Requests without `docs` pass
through untouched. Other endpoints ignore the field (only chat completions read it).
"""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ggufdesk.core.docs.store import Collection, CollectionError, check_name, collection_path
from ggufdesk.core.errors import KnownError
from ggufdesk.server.errors import ApiError
from ggufdesk.session.docs import Attached, Grounding, Retriever
from ggufdesk.session.embedding import EmbeddingEngine

log = logging.getLogger("ggufdesk.server")
PATHS = ("/v1/chat/completions",)


def _error(err: ApiError) -> list[Message]:
    body = json.dumps(err.openai()).encode()
    return [{"type": "http.response.start", "status": err.status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body}]


class DocsRetrieval:
    """ASGI middleware; `service` gives the body limit and the context size of the loaded model."""

    def __init__(self, app: ASGIApp, *, service: Any, root: Path | None = None) -> None:
        self.app = app
        self.service = service
        self.root = root
        self.engines: dict[str, EmbeddingEngine] = {}  # one embedding engine per model, kept while serving

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in PATHS:
            await self.app(scope, receive, send)
            return
        body, more = await self._read(receive)
        request = self._json(body) if not more and b'"docs"' in body else None  # most requests: no parse
        if not isinstance(request, dict) or "docs" not in request:
            await self.app(scope, _replay(body, receive, more), send)
            return
        try:
            grounding = await asyncio.to_thread(self._ground, request)
        except ApiError as e:
            for message in _error(e):
                await send(message)
            return
        new_body = json.dumps(request).encode()
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(new_body)).encode())]}
        await self.app(scope, _replay(new_body, receive, False), _Cite(send, grounding))

    async def _read(self, receive: Receive) -> tuple[bytes, bool]:
        """The body up to the server's limit; `more` when it is larger (the route refuses it then)."""
        limit = int(getattr(getattr(self.service, "config", None), "max_body", 4 << 20))
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(parts), False
            chunk = message.get("body", b"")
            parts.append(chunk)
            size += len(chunk)
            if not message.get("more_body"):
                return b"".join(parts), False
            if size > limit:
                return b"".join(parts), True

    @staticmethod
    def _json(body: bytes) -> Any:
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            return None  # the route says what is wrong with it

    def _n_ctx(self) -> int:
        pool = getattr(self.service, "pool", None)
        loaded = getattr(pool, "loaded", None)
        n_ctx = getattr(loaded, "n_ctx", 0) or getattr(getattr(pool, "load_settings", None), "n_ctx", 0)
        return int(n_ctx or 4096)

    def _ground(self, request: dict[str, Any]) -> Grounding:
        name = request.pop("docs")
        try:
            path = collection_path(check_name(name if isinstance(name, str) else ""))
        except CollectionError as e:
            raise ApiError(400, f"docs: {e}", param="docs", reason="invalid") from None
        if not path.exists():
            raise ApiError(404, f"there is no document collection {name!r} (ggufdesk docs add {name} PATH...)",
                           code="collection_not_found", param="docs", reason="invalid")
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise ApiError(400, "docs needs `messages` with a user message to search for", param="messages",
                           reason="invalid")
        user = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
        question = _text(user.get("content")) if user else ""
        if not question:
            raise ApiError(400, "docs needs a user message with text to search for", param="messages",
                           reason="invalid")
        user["content"] = question  # type: ignore[index]
        max_tokens = request.get("max_completion_tokens") or request.get("max_tokens") or 1024
        try:
            with Collection(path) as coll:
                retriever = Retriever(coll, embed=self._engine(coll))
                return Attached(retriever).apply(request, question, n_ctx=self._n_ctx(),
                                                 max_tokens=int(max_tokens) if isinstance(max_tokens, int) else 1024)
        except KnownError as e:
            raise ApiError(500, f"searching {name!r} failed: {e}", code="docs_failed", reason="docs") from None

    def _engine(self, coll: Collection) -> EmbeddingEngine | None:
        model = coll.embed_model
        if not coll.has_vectors or not Path(model).is_file():
            return None
        if model not in self.engines:
            self.engines[model] = EmbeddingEngine(model)
        return self.engines[model]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _replay(body: bytes, receive: Receive, more: bool) -> Receive:
    """A receive that hands the route the body read already, then (if there is more) the rest."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return again


class _Cite:
    """A send that adds the citations to the answer: into the JSON object, or as a chunk before [DONE]."""

    def __init__(self, send: Send, grounding: Grounding) -> None:
        self.send = send
        self.extra = grounding.stats()
        self.start: Message | None = None
        self.stream = False
        self.ok = False
        self.parts: list[bytes] = []
        self.head: dict[str, Any] = {}

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            self.ok = message["status"] == 200
            self.stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            if self.stream or not self.ok:
                await self.send(message)
            else:
                self.start = message  # its content-length changes: sent with the body
            return
        if message["type"] != "http.response.body" or not self.ok:
            await self.send(message)
        elif self.stream:
            await self.send({**message, "body": self._in_stream(message.get("body", b""))})
        else:
            self.parts.append(message.get("body", b""))
            if not message.get("more_body"):
                await self._whole()

    def _in_stream(self, body: bytes) -> bytes:
        if not self.head and body.startswith(b"data: {"):
            try:
                first = json.loads(body[6:].split(b"\n\n", 1)[0])
                self.head = {k: first[k] for k in ("id", "object", "created", "model") if k in first}
            except ValueError:
                pass
        marker = b"data: [DONE]"
        if marker not in body:
            return body
        chunk = {**self.head, "choices": [], **self.extra}
        extra = b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
        return body.replace(marker, extra + marker, 1)

    async def _whole(self) -> None:
        body = b"".join(self.parts)
        try:
            obj = json.loads(body)
            if isinstance(obj, dict):
                body = json.dumps({**obj, **self.extra}, ensure_ascii=False).encode()
        except ValueError:
            pass
        assert self.start is not None
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        await self.send({**self.start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body})
