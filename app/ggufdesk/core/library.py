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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import split_names, split_parts
from ggufdesk.core.quants import quant_from_name

log = logging.getLogger("ggufdesk.library")

GGUF_MAGIC = b"GGUF"
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

    def as_json(self) -> dict[str, object]:
        return {"path": str(self.path), "name": self.name, "size": self.size, "source": self.source,
                "quant": self.quant, "parts": self.parts}


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _usable(name: str) -> bool:
    """A model, not a vision projector or a later part of a split set."""
    base = name.rsplit("/", 1)[-1].lower()
    sp = split_parts(base)
    return base.endswith(".gguf") and not base.startswith("mmproj") and (sp is None or sp[1] == 1)


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
    out, seen = [], set()
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: "main" not in r.refs):
            for f in sorted(rev.files, key=lambda f: f.file_name):
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                if not _usable(rel) or f.blob_path in seen:
                    continue
                seen.add(f.blob_path)
                e = _entry(f.file_path, f"{repo.repo_id}/{rel}", "hf-cache")
                if e is not None:
                    out.append(e)
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
            if _usable(path.name) and _is_gguf(path):
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
        if blob is None or not _is_gguf(blob):
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

    d = Path(user_data_dir("ggufdesk", appauthor=False))
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def add_path(path: str | Path) -> LocalModel:
    """Remember a GGUF the user picked or dropped; it is used where it is."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise KnownError(f"{path}: no such file")
    if not _is_gguf(p):
        raise KnownError(f"{path}: not a GGUF file")
    entry = _entry(p, p.name, "user")
    if entry is None:
        raise KnownError(f"{path}: some parts of this split model are missing")
    with _lock:
        f = _data_file("library.json")
        data = _read_json(f)
        paths = [x for x in data.get("paths", []) if isinstance(x, str)]
        if str(p) not in paths:
            paths.append(str(p))
        data["paths"] = paths
        _write_json(f, data)
    return entry


def remove_path(path: str | Path) -> None:
    p = str(Path(path).expanduser().resolve())
    with _lock:
        f = _data_file("library.json")
        data = _read_json(f)
        data["paths"] = [x for x in data.get("paths", []) if x != p]
        _write_json(f, data)


def user_models() -> list[LocalModel]:
    paths = _read_json(_data_file("library.json")).get("paths", [])
    out = []
    for s in paths:
        p = Path(s)
        if isinstance(s, str) and p.is_file() and _is_gguf(p) and (e := _entry(p, p.name, "user")):
            out.append(e)
    return out


def list_models(*, cache_dir: str | Path | None = None, home: Path | None = None) -> list[LocalModel]:
    """Everything usable, each file once (a file found twice keeps the app's source over "user")."""
    found = (hf_cache_models(cache_dir) + lmstudio_models(lmstudio_roots(home))
             + ollama_models(ollama_root(home)) + user_models())
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
    with _lock:
        f = _data_file("verified.json")
        data = _read_json(f)
        data = {k: v for k, v in data.items() if Path(k).exists()}
        data[str(path)] = [size, mtime_ns, sha256]
        _write_json(f, data)
