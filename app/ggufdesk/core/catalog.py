"""The curated model catalog (ggufdesk/catalog/catalog.toml, package data): families, hub repos, capabilities,
licences, draft pairings, and the files the hub listed when `python -m ggufdesk.catalog.refresh` last ran."""
from __future__ import annotations

import json
import logging
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.catalog")

REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
CAPABILITIES = ("reasoning", "tools", "vision", "moe")
OPTIONAL = {"draft", "capabilities", "active_params_b", "file", "mmproj"}
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "id": str, "family": str, "name": str, "params_b": (int, float), "repo": str,
    "context_length": int, "license": str, "tokenizer": str}


@dataclass(frozen=True, slots=True)
class CatalogFile:
    """One quant of a model as the hub listed it: the file (the first part of a split set), all
    parts' bytes, and the sha256 of each part (None: missing, the download verifies against the hub)."""

    quant: str
    file: str
    size: int
    parts: tuple[str, ...] = ()
    sha256: tuple[str | None, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogEntry:
    id: str
    family: str
    name: str
    params_b: float
    repo: str
    context_length: int
    license: str
    tokenizer: str
    draft: str | None = None
    capabilities: tuple[str, ...] = ()  # reasoning, tools, vision, moe
    active_params_b: float | None = None  # a mixture of experts: parameters read per token
    files: tuple[CatalogFile, ...] = ()  # empty until a refresh against the hub
    # a vision model's projector in the same repo (the one `ggufdesk download` fetches with the model,
    # core/projector.py pick_projector); None until a refresh, or for a model that reads text only
    mmproj: CatalogFile | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    version: int
    entries: tuple[CatalogEntry, ...]
    warnings: tuple[str, ...] = field(default=())
    refreshed: str = ""  # when the files were last read from the hub ("" = never)

    def get(self, entry_id: str) -> CatalogEntry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def draft_for(self, entry_id: str) -> CatalogEntry | None:
        e = self.get(entry_id)
        return self.get(e.draft) if e and e.draft else None

    def families(self) -> list[str]:
        return sorted({e.family for e in self.entries})


def capabilities_of(info: Any) -> tuple[str, ...]:
    """What a model file can do, read from its header (a GGUFInfo): reasoning and tools from its chat
    template, moe from its experts (vision needs a projector file beside it, which a header cannot say)."""
    from ggufdesk.core import reasoning, tools

    caps = []
    if reasoning.detect(info.chat_template) is not None:
        caps.append("reasoning")
    if tools.detect_format(info.chat_template).native:
        caps.append("tools")
    if info.n_expert:
        caps.append("moe")
    return tuple(caps)


def default_path() -> Path:
    """catalog/catalog.toml inside the package (editable, wheel and bundle installs alike)."""
    return Path(str(resources.files("ggufdesk") / "catalog" / "catalog.toml"))


def _check(raw: Any, i: int) -> tuple[CatalogEntry | None, list[str]]:
    where = f"model #{i + 1}"
    if not isinstance(raw, dict):
        return None, [f"{where}: not a table"]
    where = f"model #{i + 1} ({raw.get('id', '?')})"
    problems = []
    for key, typ in REQUIRED.items():
        v = raw.get(key)
        if v is None:
            problems.append(f"{where}: missing {key}")
        elif not isinstance(v, typ) or isinstance(v, bool):
            problems.append(f"{where}: {key} has the wrong type ({type(v).__name__})")
    if problems:
        return None, problems
    if not REPO_RE.match(raw["repo"]):
        problems.append(f"{where}: repo {raw['repo']!r} is not owner/name")
    if raw["context_length"] < 256:
        problems.append(f"{where}: context_length {raw['context_length']} is too small")
    if raw["params_b"] <= 0:
        problems.append(f"{where}: params_b must be positive")
    draft = raw.get("draft")
    if draft is not None and not isinstance(draft, str):
        problems.append(f"{where}: draft must be an id")
    caps = raw.get("capabilities", [])
    if not isinstance(caps, list) or not all(c in CAPABILITIES for c in caps):
        problems.append(f"{where}: capabilities must be a list of {', '.join(CAPABILITIES)}")
    active = raw.get("active_params_b")
    if active is not None and (isinstance(active, bool) or not isinstance(active, (int, float))
                               or not 0 < active <= raw["params_b"]):
        problems.append(f"{where}: active_params_b must be a positive number of at most params_b")
    if problems:
        return None, problems
    files, bad = _files(raw.get("file", []), where)
    problems += bad
    mmproj = None
    if raw.get("mmproj") is not None:
        proj, bad = _files([{"quant": "mmproj", **raw["mmproj"]}] if isinstance(raw["mmproj"], dict) else None,
                           f"{where} mmproj")
        problems += bad
        mmproj = proj[0] if proj else None
        if mmproj is not None and "vision" not in caps:
            problems.append(f"{where}: an mmproj without the vision capability")
    unknown = set(raw) - set(REQUIRED) - OPTIONAL
    if unknown:
        problems.append(f"{where}: unknown keys {', '.join(sorted(unknown))} (ignored)")
    return CatalogEntry(**{k: raw[k] for k in REQUIRED}, draft=draft, capabilities=tuple(caps),
                        active_params_b=active, files=files, mmproj=mmproj), problems


def _files(raw: Any, where: str) -> tuple[tuple[CatalogFile, ...], list[str]]:
    """A model's [[model.file]] tables; a bad one is reported and left out."""
    if not isinstance(raw, list):
        return (), [f"{where}: file must be an array of tables"]
    out, problems = [], []
    for k, f in enumerate(raw):
        what = f"{where} file #{k + 1}"
        parts = f.get("parts") if isinstance(f, dict) else None
        shas = f.get("sha256") if isinstance(f, dict) else None
        if not (isinstance(f, dict) and isinstance(f.get("quant"), str) and isinstance(f.get("file"), str)
                and isinstance(f.get("size"), int) and not isinstance(f.get("size"), bool) and f["size"] > 0):
            problems.append(f"{what}: needs quant, file and a size in bytes")
            continue
        parts = parts if isinstance(parts, list) and parts else [f["file"]]
        shas = shas if isinstance(shas, list) else [shas] if isinstance(shas, str) else []
        if len(shas) != len(parts) or not all(s == "missing" or SHA256_RE.match(s) for s in shas):
            problems.append(f"{what}: sha256 needs one 64-hex digest (or \"missing\") per part")
            continue
        out.append(CatalogFile(f["quant"], f["file"], f["size"], tuple(parts),
                               tuple(None if s == "missing" else s for s in shas)))
    return tuple(out), problems


def load(path: Path | None = None) -> Catalog:
    """Load and validate; bad entries are skipped and listed in `warnings`, never fatal."""
    path = path or default_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KnownError(f"the model catalog is missing ({path})") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise KnownError(f"the model catalog {path} cannot be read: {err}") from err
    warnings: list[str] = []
    version = data.get("version")
    if not isinstance(version, int):
        warnings.append("catalog has no integer version; assuming 1")
        version = 1
    raw = data.get("model", [])
    if not isinstance(raw, list):
        raw, warnings = [], warnings + ["catalog: `model` must be an array of tables"]
    entries: list[CatalogEntry] = []
    for i, r in enumerate(raw):
        e, problems = _check(r, i)
        warnings += problems
        if e is None:
            continue
        if any(x.id == e.id for x in entries):
            warnings.append(f"model #{i + 1}: duplicate id {e.id!r} (skipped)")
            continue
        entries.append(e)
    by_id = {e.id: e for e in entries}
    checked = []
    for e in entries:
        d = by_id.get(e.draft) if e.draft else None
        if e.draft and d is None:
            warnings.append(f"{e.id}: draft {e.draft!r} is not in the catalog (no draft used)")
            e = CatalogEntry(**{**_asdict(e), "draft": None})
        elif d is not None and d.tokenizer != e.tokenizer:
            warnings.append(f"{e.id}: draft {d.id!r} has tokenizer {d.tokenizer!r}, not {e.tokenizer!r} "
                            "(no draft used)")
            e = CatalogEntry(**{**_asdict(e), "draft": None})
        elif d is not None and d.params_b >= e.params_b:
            warnings.append(f"{e.id}: draft {d.id!r} is not smaller than the model (no draft used)")
            e = CatalogEntry(**{**_asdict(e), "draft": None})
        checked.append(e)
    for w in warnings:
        log.warning("catalog: %s", w)
    refreshed = data.get("refreshed", "")
    return Catalog(version=version, entries=tuple(checked), warnings=tuple(warnings),
                   refreshed=refreshed if isinstance(refreshed, str) else "")


def _asdict(e: CatalogEntry) -> dict[str, Any]:
    return {k: getattr(e, k) for k in CatalogEntry.__dataclass_fields__}


# ---- writing it back (catalog/refresh.py) -----------------------------------------------------------


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)  # a TOML basic string is a JSON string


def dumps(cat: Catalog, *, header: str) -> str:
    """The catalog as TOML (`header`: the comment lines on top), in the shipped file's layout."""
    out = [header.rstrip("\n"), f"version = {max(cat.version, 2)}", f"updated = {_toml(cat.refreshed[:10] or '')}",
           f"refreshed = {_toml(cat.refreshed)}"]
    for e in cat.entries:
        out += ["", "[[model]]"]
        for key in ("id", "family", "name", "params_b", "active_params_b", "repo", "context_length", "license",
                    "tokenizer", "draft", "capabilities"):
            value = getattr(e, key)
            if value is not None:
                out.append(f"{key} = {_toml(list(value) if key == 'capabilities' else value)}")
        for f in e.files:
            out += ["", "[[model.file]]", f"quant = {_toml(f.quant)}", f"file = {_toml(f.file)}", f"size = {f.size}"]
            if len(f.parts) > 1:
                out.append(f"parts = {_toml(list(f.parts))}")
            shas = [s or "missing" for s in f.sha256]
            out.append(f"sha256 = {_toml(shas if len(shas) > 1 else shas[0])}")
        if e.mmproj is not None:
            p = e.mmproj
            out += ["", "[model.mmproj]", f"file = {_toml(p.file)}", f"size = {p.size}",
                    f"sha256 = {_toml(p.sha256[0] if p.sha256 and p.sha256[0] else 'missing')}"]
    return "\n".join(out) + "\n"
