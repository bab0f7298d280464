"""Facts about a served model for the listings (/v1/models, /api/tags, /api/show, /api/ps, /props)."""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from typing import Any

from ggufdesk.core import tools as T

log = logging.getLogger("ggufdesk.server")


def parameter_size(n: int) -> str:
    """Ollama's way of writing a parameter count: 270M, 1.5B, 8.0B."""
    if n >= 10**9:
        return f"{n / 1e9:.1f}B"
    if n >= 10**6:
        return f"{round(n / 1e6)}M"
    return f"{round(n / 1e3)}K" if n >= 1000 else str(n)


def describe(path: str, model_id: str) -> dict[str, Any]:
    """What a listing says about the GGUF at `path` (size, digest, family, quantization, capabilities...)."""
    try:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime
    except OSError:
        size, mtime = 0, 0.0
    return {"id": model_id, "path": path, "size_bytes": size, "modified": mtime,
            "digest": hashlib.sha256(f"{path}\0{size}\0{mtime}".encode()).hexdigest(), **_header(path, size, mtime)}


@functools.lru_cache(maxsize=64)
def _header(path: str, size: int, mtime: float) -> dict[str, Any]:
    """The header facts (cached per file version: a header read is milliseconds, but per request adds up)."""
    from ggufdesk.core.gguf_meta import embedding_only, read_gguf
    from ggufdesk.core.projector import projector_beside

    try:
        info = read_gguf(path)
    except Exception as e:  # noqa: BLE001 - a listing must not fail for one unreadable file
        log.info("cannot read the header of %s: %s", path, e)
        return {"family": "", "quant": "", "n_params": 0, "parameter_size": "", "context_length": 0,
                "chat_template": None, "capabilities": ["completion"], "embedding_only": False, "metadata": {}}
    arch = info.architecture
    only = embedding_only(arch, info.metadata.get(f"{arch}.pooling_type"))
    caps = ["embedding"] if only else ["completion"]
    if not only and T.detect_format(info.chat_template).native:
        caps.append("tools")
    if not only and projector_beside(path) is not None:
        caps.append("vision")  # (Ollama's word: loaded with its projector, the model reads images)
    small = {k: v for k, v in info.metadata.items()
             if isinstance(v, (int, float, str, bool)) and not (isinstance(v, str) and len(v) > 256)}
    return {"family": arch, "quant": info.file_type or "", "n_params": info.n_params,
            "parameter_size": parameter_size(info.n_params), "context_length": info.context_length,
            "chat_template": info.chat_template, "capabilities": caps, "embedding_only": only,
            "metadata": small}
