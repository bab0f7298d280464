"""The curated model catalog (ggufdesk/catalog/catalog.toml, package data): families, hub repos, capabilities,
licences, draft pairings, and the files the hub listed when `python -m ggufdesk.catalog.refresh` last ran."""
from __future__ import annotations

import json
import logging
import re
import tomllib
from dataclasses import dataclass, field, replace
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
    """One [[model]] table as an entry (None if it cannot be used), and what is wrong with it."""
    where = f"model #{i + 1}"
    if not isinstance(raw, dict):
        return None, [f"{where}: not a table"]
    where = f"model #{i + 1} ({raw.get('id', '?')})"
    problems = _type_problems(raw, where) or _value_problems(raw, where)
    if problems:
        return None, problems
    caps = raw.get("capabilities", [])
    files, problems = _files(raw.get("file", []), where)
    mmproj, bad = _mmproj(raw.get("mmproj"), where, caps)
    problems += bad
    unknown = set(raw) - set(REQUIRED) - OPTIONAL
    if unknown:
        problems.append(f"{where}: unknown keys {', '.join(sorted(unknown))} (ignored)")
    return CatalogEntry(**{k: raw[k] for k in REQUIRED}, draft=raw.get("draft"), capabilities=tuple(caps),
                        active_params_b=raw.get("active_params_b"), files=files, mmproj=mmproj), problems


def _type_problems(raw: dict[str, Any], where: str) -> list[str]:
    """The required keys that are missing or of the wrong type."""
    problems = []
    for key, typ in REQUIRED.items():
        v = raw.get(key)
        if v is None:
            problems.append(f"{where}: missing {key}")
        elif not isinstance(v, typ) or isinstance(v, bool):
            problems.append(f"{where}: {key} has the wrong type ({type(v).__name__})")
    return problems


def _value_problems(raw: dict[str, Any], where: str) -> list[str]:
    """Values out of range, once every required key has its type."""
    problems = []
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
    return problems


def _mmproj(raw: Any, where: str, caps: list[str]) -> tuple[CatalogFile | None, list[str]]:
    """A model's [model.mmproj] table (None if absent or bad), and what is wrong with it."""
    if raw is None:
        return None, []
    proj, problems = _files([{"quant": "mmproj", **raw}] if isinstance(raw, dict) else None, f"{where} mmproj")
    mmproj = proj[0] if proj else None
    if mmproj is not None and "vision" not in caps:
        problems.append(f"{where}: an mmproj without the vision capability")
    return mmproj, problems


def _files(raw: Any, where: str) -> tuple[tuple[CatalogFile, ...], list[str]]:
    """A model's [[model.file]] tables; a bad one is reported and left out."""
    if not isinstance(raw, list):
        return (), [f"{where}: file must be an array of tables"]
    out, problems = [], []
    for k, f in enumerate(raw):
        got = _file(f, f"{where} file #{k + 1}")
        if isinstance(got, str):
            problems.append(got)
        else:
            out.append(got)
    return tuple(out), problems


def _file(f: Any, what: str) -> CatalogFile | str:
    """One [[model.file]] table, or what is wrong with it."""
    if not _names_a_file(f):
        return f"{what}: needs quant, file and a size in bytes"
    parts, shas = f.get("parts"), f.get("sha256")
    parts = parts if isinstance(parts, list) and parts else [f["file"]]
    shas = shas if isinstance(shas, list) else [shas] if isinstance(shas, str) else []
    if len(shas) != len(parts) or not all(_is_digest(s) for s in shas):
        return f"{what}: sha256 needs one 64-hex digest (or \"missing\") per part"
    return CatalogFile(f["quant"], f["file"], f["size"], tuple(parts),
                       tuple(None if s == "missing" else s for s in shas))


def _names_a_file(f: Any) -> bool:
    """A table with a quant and a file name (strings) and a size in bytes (a positive whole number)."""
    size = f.get("size") if isinstance(f, dict) else None
    return (isinstance(f, dict) and isinstance(f.get("quant"), str) and isinstance(f.get("file"), str)
            and isinstance(size, int) and not isinstance(size, bool) and size > 0)


def _is_digest(s: Any) -> bool:
    """A part's sha256 as the catalog writes it: 64 hex digits, or "missing"."""
    return isinstance(s, str) and (s == "missing" or SHA256_RE.match(s) is not None)


def load(path: Path | None = None) -> Catalog:
    """Load and validate; bad entries are skipped and listed in `warnings`, never fatal."""
    path = path or default_path()
    data = _read_toml(path)
    warnings: list[str] = []
    version = data.get("version")
    if not isinstance(version, int):
        warnings.append("catalog has no integer version; assuming 1")
        version = 1
    raw = data.get("model", [])
    if not isinstance(raw, list):
        raw, warnings = [], warnings + ["catalog: `model` must be an array of tables"]
    entries, bad = _entries(raw)
    checked, bad_drafts = _checked_drafts(entries)
    warnings += bad + bad_drafts
    for w in warnings:
        log.warning("catalog: %s", w)
    refreshed = data.get("refreshed", "")
    return Catalog(version=version, entries=tuple(checked), warnings=tuple(warnings),
                   refreshed=refreshed if isinstance(refreshed, str) else "")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KnownError(f"the model catalog is missing ({path})") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise KnownError(f"the model catalog {path} cannot be read: {err}") from err


def _entries(raw: list[Any]) -> tuple[list[CatalogEntry], list[str]]:
    """The usable [[model]] tables, the first of each id, and the problems of all of them."""
    entries: list[CatalogEntry] = []
    warnings: list[str] = []
    for i, r in enumerate(raw):
        e, problems = _check(r, i)
        warnings += problems
        if e is None:
            continue
        if any(x.id == e.id for x in entries):
            warnings.append(f"model #{i + 1}: duplicate id {e.id!r} (skipped)")
            continue
        entries.append(e)
    return entries, warnings


def _checked_drafts(entries: list[CatalogEntry]) -> tuple[list[CatalogEntry], list[str]]:
    """The entries with each draft that cannot serve its model dropped (with a warning why)."""
    by_id = {e.id: e for e in entries}
    checked, warnings = [], []
    for e in entries:
        problem = _draft_problem(e, by_id.get(e.draft) if e.draft else None)
        if problem is not None:
            warnings.append(problem)
            e = replace(e, draft=None)
        checked.append(e)
    return checked, warnings


def _draft_problem(e: CatalogEntry, d: CatalogEntry | None) -> str | None:
    """Why draft `d` (the entry named by e.draft, None if not in the catalog) cannot draft for `e`."""
    if e.draft and d is None:
        return f"{e.id}: draft {e.draft!r} is not in the catalog (no draft used)"
    if d is not None and d.tokenizer != e.tokenizer:
        return f"{e.id}: draft {d.id!r} has tokenizer {d.tokenizer!r}, not {e.tokenizer!r} (no draft used)"
    if d is not None and d.params_b >= e.params_b:
        return f"{e.id}: draft {d.id!r} is not smaller than the model (no draft used)"
    return None


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
