"""The local library finds models where other apps keep them, in place, each file once."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from ggufdesk.core import library
from ggufdesk.core.downloads import download
from ggufdesk.core.errors import KnownError
from tests.hubserver import write_blob


def ollama_store(root: Path, name: str, tag: str, model: Path, *, namespace: str = "library",
                 file_type: str | None = "Q4_K_M") -> Path:
    """Ollama's layout: manifests/registry.ollama.ai/<ns>/<name>/<tag> -> blobs/sha256-<hex>."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    data = model.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / f"sha256-{digest}").write_bytes(data)
    cfg = json.dumps({"model_format": "gguf", "model_family": "llama", "file_type": file_type}).encode()
    cfg_digest = hashlib.sha256(cfg).hexdigest()
    (blobs / f"sha256-{cfg_digest}").write_bytes(cfg)
    template = b"{{ .Prompt }}"
    t_digest = hashlib.sha256(template).hexdigest()
    (blobs / f"sha256-{t_digest}").write_bytes(template)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": f"sha256:{cfg_digest}", "size": len(cfg)},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
            {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{t_digest}",
             "size": len(template)},
        ],
    }
    mf = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    mf.parent.mkdir(parents=True, exist_ok=True)
    mf.write_text(json.dumps(manifest))
    return blobs / f"sha256-{digest}"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "userhome"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.delenv("LMSTUDIO_MODELS_DIR", raising=False)
    return h


def test_ollama_manifests_lead_to_gguf_blobs_in_place(home, tiny_model, tiny_draft):
    root = home / ".ollama" / "models"
    blob = ollama_store(root, "llama3.2", "3b", tiny_model)
    ollama_store(root, "phi", "mini-q8_0", tiny_draft, namespace="someone",
                 file_type=None)
    (root / "manifests" / "registry.ollama.ai" / "library" / "broken").mkdir(parents=True)
    (root / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest").write_text("{not json")
    found = {m.name: m for m in library.ollama_models()}
    assert set(found) == {"llama3.2:3b", "someone/phi:mini-q8_0"}
    m = found["llama3.2:3b"]
    assert m.path == blob and m.source == "ollama" and m.quant == "Q4_K_M"
    assert m.size == tiny_model.stat().st_size
    assert found["someone/phi:mini-q8_0"].quant == "Q8_0"  # from the tag when the config has none


def test_lmstudio_layouts_are_discovered(home, tiny_model, tmp_path):
    a = home / ".lmstudio" / "models" / "lmstudio-community" / "Qwen-GGUF" / "Qwen-Q4_K_M.gguf"
    b = home / ".cache" / "lm-studio" / "models" / "bartowski" / "Phi-GGUF" / "Phi-IQ3_M.gguf"
    proj = a.with_name("mmproj-model-f16.gguf")
    for p in (a, b, proj):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(tiny_model.read_bytes())
    not_gguf = a.with_name("notes-Q4_0.gguf")
    not_gguf.write_text("hello")
    parts = [a.with_name(f"Big-Q6_K-{i:05d}-of-00002.gguf") for i in (1, 2)]
    for i, p in enumerate(parts):
        write_blob(p, 5000 + i, seed=i)
    found = {m.name: m for m in library.lmstudio_models()}
    assert set(found) == {"lmstudio-community/Qwen-GGUF/Qwen-Q4_K_M.gguf",
                          "bartowski/Phi-GGUF/Phi-IQ3_M.gguf",
                          "lmstudio-community/Qwen-GGUF/Big-Q6_K-00001-of-00002.gguf"}
    assert found["bartowski/Phi-GGUF/Phi-IQ3_M.gguf"].quant == "IQ3_M"
    big = found["lmstudio-community/Qwen-GGUF/Big-Q6_K-00001-of-00002.gguf"]
    assert big.parts == 2 and big.size == 10001 and big.quant == "Q6_K"
    parts[1].unlink()  # an incomplete split set is not offered
    assert "lmstudio-community/Qwen-GGUF/Big-Q6_K-00001-of-00002.gguf" not in {
        m.name for m in library.lmstudio_models()}


def test_user_added_paths_persist_and_are_validated(home, tiny_model, tmp_path):
    entry = library.add_path(tiny_model)
    assert entry.source == "user" and entry.path == tiny_model.resolve()
    library.add_path(tiny_model)  # once only
    assert [m.path for m in library.user_models()] == [tiny_model.resolve()]
    bad = tmp_path / "fake.gguf"
    bad.write_text("not a model")
    with pytest.raises(KnownError, match="not a GGUF"):
        library.add_path(bad)
    with pytest.raises(KnownError, match="no such file"):
        library.add_path(tmp_path / "missing.gguf")
    library.remove_path(tiny_model)
    assert library.user_models() == []


def test_list_models_merges_every_source_once(hub, home, tiny_model, tiny_chatml):
    hub.add_repo("org/tiny-GGUF", {"tiny-F32.gguf": tiny_model, "README.md": tiny_model})
    got = download("org/tiny-GGUF", "tiny-F32.gguf")
    ollama_store(home / ".ollama" / "models", "tiny", "latest", tiny_chatml)
    lm = home / ".lmstudio" / "models" / "me" / "r" / "x-Q8_0.gguf"
    lm.parent.mkdir(parents=True)
    lm.write_bytes(tiny_model.read_bytes())
    library.add_path(got.path)  # the same file as the cache entry: listed once
    library.add_path(lm)
    models = library.list_models()
    by_source = {m.source: m for m in models}
    assert set(by_source) == {"hf-cache", "ollama", "lmstudio"}
    assert by_source["hf-cache"].name == "org/tiny-GGUF/tiny-F32.gguf"
    assert by_source["hf-cache"].quant == "F32"
    assert len({os.path.realpath(m.path) for m in models}) == len(models) == 3
    assert all(m.as_json()["size"] > 0 for m in models)


def test_missing_places_give_an_empty_library(home):
    assert library.list_models() == []
