"""The curated model catalog (models_catalog/catalog.toml): families, hub repos, draft pairings."""
from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.catalog")

REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "id": str, "family": str, "name": str, "params_b": (int, float), "repo": str,
    "context_length": int, "license": str, "tokenizer": str}


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    version: int
    entries: tuple[CatalogEntry, ...]
    warnings: tuple[str, ...] = field(default=())

    def get(self, entry_id: str) -> CatalogEntry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def draft_for(self, entry_id: str) -> CatalogEntry | None:
        e = self.get(entry_id)
        return self.get(e.draft) if e and e.draft else None

    def families(self) -> list[str]:
        return sorted({e.family for e in self.entries})


def default_path() -> Path:
    """models_catalog/catalog.toml at the source tree's root (editable install and tests)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "models_catalog" / "catalog.toml"
        if cand.is_file():
            return cand
    return here.parents[3] / "models_catalog" / "catalog.toml"


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
    if problems:
        return None, problems
    unknown = set(raw) - set(REQUIRED) - {"draft"}
    if unknown:
        problems.append(f"{where}: unknown keys {', '.join(sorted(unknown))} (ignored)")
    return CatalogEntry(**{k: raw[k] for k in REQUIRED}, draft=draft), problems


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
    return Catalog(version=version, entries=tuple(checked), warnings=tuple(warnings))


def _asdict(e: CatalogEntry) -> dict[str, Any]:
    return {k: getattr(e, k) for k in CatalogEntry.__dataclass_fields__}
