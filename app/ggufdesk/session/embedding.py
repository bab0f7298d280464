"""An embedding model in an engine process of its own, as a plain `texts -> vectors` function.

Collections made with an embedding model remember which (its path); searching one embeds the query
with the same model. The engine starts on first use and stays until close().
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Sequence

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.link.client import EngineClient

log = logging.getLogger("ggufdesk.docs")
EMBED_CTX = 512  # tokens: a passage is ~250; longer inputs are cut (truncate), never refused


class EmbeddingEngine:
    """`engine(texts)` -> one unit-length vector per text. Thread-safe (one request at a time)."""

    def __init__(self, model: str | Path, *, n_ctx: int = EMBED_CTX) -> None:
        self.model = str(model)
        self.n_ctx = n_ctx
        self.dim = 0
        self._client: EngineClient | None = None
        self._lock = threading.Lock()

    def start(self) -> EmbeddingEngine:
        """Load the model now (not at the first texts); learns the vectors' size."""
        with self._lock:
            client = self._start()
            if not self.dim:  # a model that does not say: measure one
                self.dim = len(client.embed(["size"], truncate=True)[0])
        return self

    def _start(self) -> EngineClient:
        if self._client is not None:
            return self._client
        if not Path(self.model).is_file():
            raise KnownError(f"the embedding model {self.model} is not there (moved or deleted?)")
        from ggufdesk.core.settings import LoadSettings

        client = EngineClient()
        client.start()
        try:
            loaded = client.load(self.model, settings=LoadSettings(n_ctx=self.n_ctx, n_batch=self.n_ctx,
                                                                   n_ubatch=self.n_ctx))
        except BaseException:
            client.shutdown()
            raise
        if loaded is None:
            client.shutdown()
            raise KnownError(f"the embedding model {Path(self.model).name} could not be loaded")
        self.dim = int(getattr(loaded, "n_embd", 0) or 0)
        self._client = client
        return client

    def __call__(self, texts: list[str]) -> Sequence[Sequence[float]]:
        with self._lock:
            client = self._start()
            vectors = client.embed(list(texts), truncate=True)
        if vectors and not self.dim:
            self.dim = len(vectors[0])
        return vectors

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.shutdown()
                self._client = None

    def __enter__(self) -> EmbeddingEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
