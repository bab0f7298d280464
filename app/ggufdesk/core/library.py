"""The local model library: every GGUF on this machine the app can use, found in place and never copied.

Sources: the shared Hugging Face cache, files the user added by path (or drag-and-drop), LM Studio's
models folder (``publisher/repo/file.gguf``) and Ollama's store (manifests whose model layer points
to a GGUF blob ``blobs/sha256-<hex>``).
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ggufdesk.core.atomic import locked, write_atomic
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import split_names, split_parts
from ggufdesk.core.projector import is_projector_name, projector_beside
from ggufdesk.core.quants import quant_from_name

log = logging.getLogger("ggufdesk.library")

GGUF_MAGIC = b"GGUF"
MIN_BYTES = 24  # magic, version and the two counts: anything shorter (a 0-byte file) is not a model
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_lock = threading.Lock()


@dataclass(frozen=True)
class LocalModel:
    path: Path  # the file to load (the first part of a split set)
    name: str
    size: int  # all parts
    source: str  # "hf-cache" | "user" | "lmstudio" | "ollama"
    quant: str | None
    parts: int = 1
    id: str = ""  # the stable library id (set by entries(); "" from a single source's listing)

    def as_json(self) -> dict[str, object]:
        return {"id": self.id, "path": str(self.path), "name": self.name, "size": self.size, "source": self.source,
                "quant": self.quant, "parts": self.parts}


def _is_gguf(path: Path) -> bool:
    """Starts with the GGUF magic and is long enough to hold a header (never a 0-byte file)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC and os.fstat(f.fileno()).st_size >= MIN_BYTES
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop on some Pythons
        return False


def _usable(name: str) -> bool:
    """A model, not a vision projector or a later part of a split set."""
    base = name.rsplit("/", 1)[-1].lower()
    sp = split_parts(base)
    return base.endswith(".gguf") and not is_projector_name(base) and (sp is None or sp[1] == 1)


def _split_size(first: Path) -> tuple[int, int]:
    names = split_names(first.name)
    if len(names) == 1:
        return first.stat().st_size, 1
    total, count = 0, len(names)
    for name in names:
        part = first.with_name(name)
        if not part.exists():
            raise FileNotFoundError(part)
        total += part.stat().st_size
    return total, count


def _entry(path: Path, name: str, source: str, quant: str | None = None) -> LocalModel | None:
    if not _is_gguf(path):
        log.info("skipping %s: empty or not a GGUF file", path)
        return None
    try:
        size, parts = _split_size(path)
    except OSError:
        return None  # an incomplete split set is not usable
    return LocalModel(path, name, size, source, quant or quant_from_name(path.name), parts)


# ----------------------------------------------------------------------------------- sources


def hf_cache_models(cache_dir: str | Path | None = None) -> list[LocalModel]:
    """GGUF files in the shared Hugging Face cache (every revision, each blob once)."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:  # scan_cache_dir's own default is bound at import; read the constant now
        info = scan_cache_dir(cache_dir or constants.HF_HUB_CACHE)
    except CacheNotFound:
        return []
    except (OSError, ValueError) as e:  # an unreadable cache folder: the other sources still count
        log.warning("cannot read the Hugging Face cache: %s", e)
        return []
    out: list[LocalModel] = []
    seen: set[Path] = set()
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: "main" not in r.refs):
            for f in sorted(rev.files, key=lambda f: f.file_name):
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                if not _usable(rel) or f.blob_path in seen:
                    continue
                seen.add(f.blob_path)
                entry = _entry(f.file_path, f"{repo.repo_id}/{rel}", "hf-cache")
                if entry is not None:
                    out.append(entry)
    return out


def lmstudio_roots(home: Path | None = None) -> list[Path]:
    home = home or Path.home()
    roots = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    if os.environ.get("LMSTUDIO_MODELS_DIR"):
        roots.insert(0, Path(os.environ["LMSTUDIO_MODELS_DIR"]))
    return roots


def lmstudio_models(roots: list[Path] | None = None) -> list[LocalModel]:
    """LM Studio's layout: <root>/<publisher>/<repo>/<file>.gguf."""
    out = []
    for root in roots if roots is not None else lmstudio_roots():
        if not root.is_dir():
            continue
        for path in sorted(root.glob("*/*/*.gguf")):
            if _usable(path.name):
                rel = path.relative_to(root).as_posix()
                if (e := _entry(path, rel, "lmstudio")) is not None:
                    out.append(e)
    return out


def ollama_root(home: Path | None = None) -> Path:
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env) if env else (home or Path.home()) / ".ollama" / "models"


def _ollama_blob(root: Path, digest: str) -> Path | None:
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexd):
        return None
    return root / "blobs" / f"sha256-{hexd}"


def ollama_models(root: Path | None = None) -> list[LocalModel]:
    """Ollama's store: manifests/<registry>/<namespace>/<name>/<tag> → the model layer's GGUF blob."""
    root = root or ollama_root()
    manifests = root / "manifests"
    out: list[LocalModel] = []
    if not manifests.is_dir():
        return out
    for mf in sorted(p for p in manifests.rglob("*") if p.is_file()):
        rel = mf.relative_to(manifests).parts
        if len(rel) != 4:
            continue
        registry, namespace, name, tag = rel
        try:
            manifest = json.loads(mf.read_text())
            layers = manifest.get("layers", [])
            model = next(layer for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
        except (OSError, ValueError, StopIteration, AttributeError):
            log.info("skipping unreadable Ollama manifest %s", mf)
            continue
        blob = _ollama_blob(root, str(model.get("digest", "")))
        if blob is None:
            continue
        quant = quant_from_name(tag)
        cfg = _ollama_blob(root, str((manifest.get("config") or {}).get("digest", "")))
        if cfg is not None and cfg.is_file():
            try:
                quant = str(json.loads(cfg.read_text()).get("file_type") or "").upper() or quant
            except (OSError, ValueError, AttributeError):
                pass
        short = name if namespace == "library" and registry == "registry.ollama.ai" else f"{namespace}/{name}"
        if (e := _entry(blob, f"{short}:{tag}", "ollama", quant)) is not None:
            out.append(e)
    return out


# ----------------------------------------------------------------------------------- user files


def _data_file(name: str) -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("ggufdesk", appauthor=False)) / name


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic write; a read-only data folder becomes a KnownError that says where."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, indent=1))
    except OSError as e:
        raise KnownError(f"cannot save the model list in {path.parent}: {e.strerror or e}") from e


def _update(name: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Read the data file `name`, change its entries, write it back, one writer at a time across threads
    and the processes that share it (the window, the CLI, a server: core/atomic.py's `locked`, so
    neither loses the other's entry). Raises KnownError where it cannot."""
    f = _data_file(name)
    with _lock:
        try:
            with locked(f):
                data = _read_json(f)
                change(data)
                _write_json(f, data)
        except (OSError, TimeoutError) as e:
            raise KnownError(f"cannot save the model list in {f.parent}: {e}") from e


def _resolve(path: str | Path) -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: "Symlink loop" (Python < 3.13)
        raise KnownError(f"{path}: cannot follow this path ({e})") from None


def add_path(path: str | Path) -> LocalModel:
    """Remember a GGUF the user picked or dropped; it is used where it is."""
    p = _resolve(path)
    if not p.is_file():
        raise KnownError(f"{path}: no such file")
    if not _is_gguf(p):
        raise KnownError(f"{path}: not a GGUF file (empty, or it does not start with the GGUF header)")
    entry = _entry(p, p.name, "user")
    if entry is None:
        raise KnownError(f"{path}: some parts of this split model are missing")

    def add(data: dict[str, Any]) -> None:
        paths = [x for x in data.get("paths", []) if isinstance(x, str)]
        data["paths"] = paths if str(p) in paths else [*paths, str(p)]
    _update("library.json", add)
    return entry


def remove_path(path: str | Path) -> None:
    p = str(_resolve(path))
    _update("library.json", lambda data: data.update(paths=[x for x in data.get("paths", []) if x != p]))


def user_models() -> list[LocalModel]:
    paths = _read_json(_data_file("library.json")).get("paths", [])
    out = []
    for s in paths if isinstance(paths, list) else []:
        if not isinstance(s, str):
            continue
        p = Path(s)
        try:
            ok = p.is_file()
        except OSError:
            ok = False
        if ok and (e := _entry(p, p.name, "user")):
            out.append(e)
    return out


def list_models(*, cache_dir: str | Path | None = None, home: Path | None = None) -> list[LocalModel]:
    """Everything usable, each file once (a file found twice keeps the app's source over "user")."""
    found: list[LocalModel] = []
    sources: tuple[Callable[[], list[LocalModel]], ...] = (
        lambda: hf_cache_models(cache_dir), lambda: lmstudio_models(lmstudio_roots(home)),
        lambda: ollama_models(ollama_root(home)), user_models)
    for source in sources:
        try:
            found += source()
        except OSError as e:  # one unreadable folder must not hide the models found elsewhere
            log.warning("skipping a model folder: %s", e)
    out, seen = [], set()
    for m in found:
        key = os.path.realpath(m.path)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


# ----------------------------------------------------------------------------------- verified blobs


def verified_sha(path: Path, size: int, mtime_ns: int) -> str | None:
    """The sha256 we checked for this exact file (path, size, mtime), if any."""
    rec = _read_json(_data_file("verified.json")).get(str(path))
    if isinstance(rec, list) and len(rec) == 3 and rec[0] == size and rec[1] == mtime_ns:
        return str(rec[2])
    return None


def remember_verified(path: Path, size: int, mtime_ns: int, sha256: str) -> None:
    def remember(data: dict[str, Any]) -> None:
        for gone in [k for k in data if not Path(k).exists()]:
            del data[gone]
        data[str(path)] = [size, mtime_ns, sha256]
    try:
        _update("verified.json", remember)
    except KnownError as e:  # only a cache of checks done: the file is checked again next time
        log.warning("%s", e)


# ----------------------------------------------------------------------------------- ids and lookups

ID_STRAY = re.compile(r"[^a-z0-9._:-]+")
HF_NAME = re.compile(r"^(?:hf\.co/|huggingface\.co/)?(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$", re.IGNORECASE)


def slug(text: str) -> str:
    """Lower case; anything but letters, digits, '.', '_', ':' and '-' becomes '-' (never '/' or '..')."""
    s = ID_STRAY.sub("-", text.lower()).strip("-.:")
    s = re.sub(r"\.{2,}", ".", s)
    return s or "model"


def _base_id(m: LocalModel) -> str:
    if m.source == "ollama":  # "llama3.2:1b" and "someone/phi:mini" are what Ollama's users type
        return slug(m.name.replace("/", "-"))
    name = m.name.rsplit("/", 1)[-1]
    sp = split_parts(name)
    return slug(sp[0] if sp else name[:-5] if name.lower().endswith(".gguf") else name)


def starter_models() -> list[LocalModel]:
    """The offline starters that are installed (a starter still to be assembled is listed at its target)."""
    from ggufdesk.core import starter

    return [LocalModel(path=starter.target(s), name=s.label, size=s.size_bytes, source="starter",
                       quant=quant_from_name(s.filename), id=s.id) for s in starter.installed()]


def entries(*, cache_dir: str | Path | None = None, home: Path | None = None) -> list[LocalModel]:
    """Every model the app can use, each with a stable id: the starters first, then list_models().

    An id is the file's stem in lower case (Ollama's name:tag), made unique with -2, -3... in the
    order the sources are read; a starter's id is fixed (`smollm2-135m-instruct`, `gemma-3-270m`).
    """
    out = starter_models()
    taken = {m.id for m in out}
    starters = {os.path.realpath(m.path) for m in out}
    for m in list_models(cache_dir=cache_dir, home=home):
        if os.path.realpath(m.path) in starters:
            continue
        base = mid = _base_id(m)
        n = 2
        while mid in taken:
            mid, n = f"{base}-{n}", n + 1
        taken.add(mid)
        out.append(replace(m, id=mid))
    return out


def _match_rank(m: LocalModel, key: str, low: str) -> int | None:
    """How well `key` names `m`: 0 its id exactly ... 4 its id once made a slug; None not at all."""
    files = (m.path.name.lower(), m.name.rsplit("/", 1)[-1].lower())
    if m.id == key:
        return 0
    if m.id == low:
        return 1
    if m.source == "ollama" and m.name.lower() in (low, f"{low}:latest"):
        return 2
    if low in files or f"{low}.gguf" in files:
        return 3
    if key and slug(low) == m.id:
        return 4
    return None


def find(name: str, models: list[LocalModel]) -> LocalModel | None:
    """The model `name` means: an id, a file name or stem (any case), Ollama's name[:tag], or
    hf.co/owner/repo[:QUANT] for a file in the Hugging Face cache. Never a path."""
    key = name.strip()
    low = key.lower()
    ranked = [(r, i, m) for i, m in enumerate(models) if (r := _match_rank(m, key, low)) is not None]
    if ranked:
        return min(ranked, key=lambda t: (t[0], t[1]))[2]
    hf = HF_NAME.match(key)
    if hf is None:
        return None
    repo = hf["repo"].lower() + "/"
    quant = (hf["quant"] or "").upper()
    same = [m for m in models if m.source == "hf-cache" and m.name.lower().startswith(repo)]
    if quant:
        same = [m for m in same if (m.quant or "").upper() == quant]
    return min(same, key=lambda m: (m.quant or "").upper() != "Q4_K_M", default=None)


def id_for(path: str | Path, models: list[LocalModel] | None = None) -> str:
    """The library id of a model file; a file outside the library gets its stem as an id, the same way."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        real = str(path)
    for m in entries() if models is None else models:
        try:
            if os.path.realpath(m.path) == real:
                return m.id
        except (OSError, ValueError):
            continue
    p = Path(path)
    from ggufdesk.core import starter

    known = starter.by_filename(p.name)  # a starter's file, wherever it is: its fixed id
    return known.id if known is not None else _base_id(LocalModel(p, p.name, 0, "user", None))


def file_for(m: LocalModel) -> Path:
    """The file to load for a library entry (a starter is assembled or verified the first time)."""
    if m.source == "starter":
        from ggufdesk.core import starter

        s = starter.by_id(m.id)
        if s is not None:
            return starter.model_path(s)
    return m.path


def resolve(model: str | None, models: list[LocalModel] | None = None) -> str:
    """What a command's MODEL argument names, as a file to load: a path, hf://..., a library id or
    name (see find()), or nothing (the default starter, the chat one when installed)."""
    from ggufdesk.core import starter

    if not model:
        return str(starter.default_model_path())
    if model.startswith("hf://"):
        return model
    path = Path(model).expanduser()
    try:
        if path.is_file():
            return str(path)
    except OSError:
        pass
    models = entries() if models is None else models
    hit = find(model, models)
    if hit is not None:
        return str(file_for(hit))
    if "/" in model or os.sep in model or model.lower().endswith(".gguf"):
        raise KnownError(f"{model}: no such file")
    ids = ", ".join(m.id for m in models) or "none yet"
    raise KnownError(f"{model!r} is neither a file nor a model in the library (ids: {ids}); "
                     "see `ggufdesk library`")


# ----------------------------------------------------------------------------------- facts for listings

_facts: dict[tuple[str, int, int], dict[str, Any]] = {}


def facts(m: LocalModel) -> dict[str, Any]:
    """What a listing shows beyond the file: architecture, parameters, context, capabilities.

    Read from the header once per (path, size, mtime); an unreadable header gives the file facts only.
    """
    from ggufdesk.core.gguf_meta import embedding_only, read_gguf
    from ggufdesk.core.tools import detect_format

    try:
        st = m.path.stat()
    except OSError:
        st = None
    key = (str(m.path), st.st_size if st else -1, st.st_mtime_ns if st else -1)
    with _lock:
        cached = _facts.get(key)
    if cached is not None:
        return cached
    out: dict[str, Any] = {"architecture": None, "family": None, "parameters": None, "context_length": None,
                           "capabilities": {"chat_template": False, "tools": False, "embedding": False,
                                            "vision": False},
                           "mmproj": None, "projector_missing": None}
    if st is None:  # a starter still to be assembled
        from ggufdesk.core import starter

        s = starter.by_id(m.id) if m.source == "starter" else None
        if s is not None:
            out["capabilities"]["chat_template"] = s.chat
        return out
    try:
        info = read_gguf(m.path)
    except (KnownError, OSError) as e:
        log.info("cannot read the header of %s: %s", m.path, e)
        return out
    arch, md = info.architecture, info.metadata
    mmproj = projector_beside(m.path)
    out.update(architecture=arch, family=str(md.get("general.basename") or arch), parameters=info.n_params,
               context_length=info.context_length,
               capabilities={"chat_template": info.chat_template is not None,
                             "tools": detect_format(info.chat_template).native,
                             "embedding": embedding_only(arch, md.get(f"{arch}.pooling_type")),
                             "vision": mmproj is not None},
               mmproj=str(mmproj) if mmproj else None,
               projector_missing=projector_hint(str(m.path)) if mmproj is None and vision_repo(m.path) else None)
    with _lock:
        _facts[key] = out
    return out


# ----------------------------------------------------------------------------------- vision projectors

_HF_CACHE_DIR = re.compile(r"models--(?P<owner>[^/\\]+?)--(?P<name>[^/\\]+)[/\\]snapshots[/\\]")


def hub_origin(path: str | Path) -> tuple[str, str] | None:
    """(repo id, file in the repo) of a file in the Hugging Face cache, else None."""
    m = _HF_CACHE_DIR.search(str(path))
    if m is None:
        return None
    rest = str(path)[m.end():].replace("\\", "/").split("/", 1)
    return (f"{m['owner']}/{m['name']}", rest[1]) if len(rest) == 2 else None


def vision_repo(path: str | Path) -> str | None:
    """The hub repo of a cached model file that the catalog lists as a vision model, else None."""
    origin = hub_origin(path)
    if origin is None:
        return None
    from ggufdesk.core import catalog

    try:
        cat = catalog.load()
    except KnownError:
        return None
    repo = origin[0].lower()
    hit = next((e for e in cat.entries if e.repo.lower() == repo and "vision" in e.capabilities), None)
    return hit.repo if hit else None


def projector_hint(model: str) -> str:
    """How to get a model's projector: for a file from the hub, the download that fetches it beside."""
    origin = hub_origin(model)
    if origin is not None:
        return (f"`ggufdesk download {origin[0]} {origin[1]}` fetches its projector beside it "
                "(or pass --mmproj FILE)")
    return "Put its mmproj-*.gguf beside the model file, or pass --mmproj FILE."
