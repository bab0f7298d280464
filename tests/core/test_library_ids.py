"""Library ids: stable, unique, never a path; names a request or a command may use for a model."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from ggufdesk.core import library, starter
from ggufdesk.core.errors import KnownError
from ggufdesk.core.library import LocalModel
from tests.core.test_library import ollama_store


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "userhome"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.delenv("LMSTUDIO_MODELS_DIR", raising=False)
    return h


def copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    return dst


@pytest.mark.parametrize("text,want", [
    ("Qwen2.5-0.5B-Instruct-Q4_K_M", "qwen2.5-0.5b-instruct-q4_k_m"), ("../../etc/passwd", "etc-passwd"),
    ("a/b\\c d", "a-b-c-d"), ("...", "model"), ("x..y", "x.y"), ("llama3.2:1b", "llama3.2:1b")])
def test_slug_never_makes_a_path(text, want):
    assert library.slug(text) == want
    assert "/" not in want and ".." not in want


def test_entries_start_with_the_starters_then_every_source_with_unique_ids(home, tiny_model, tiny_chatml, tmp_path):
    ollama_store(home / ".ollama" / "models", "tiny", "latest", tiny_chatml)
    a = copy(tiny_model, tmp_path / "one" / "Tiny-F32.gguf")
    b = copy(tiny_chatml, tmp_path / "two" / "tiny-f32.gguf")  # the same stem: made unique
    library.add_path(a)
    library.add_path(b)
    models = library.entries()
    ids = [m.id for m in models]
    installed = [s.id for s in starter.installed()]
    assert ids[:len(installed)] == installed and installed[0] == "smollm2-135m-instruct"
    assert ids[len(installed):] == ["tiny:latest", "tiny-f32", "tiny-f32-2"]
    assert library.entries() == models  # the same ids every time
    assert models[0].source == "starter" and models[0].as_json()["id"] == "smollm2-135m-instruct"


def test_find_takes_ids_stems_file_names_ollama_names_and_hf_names(home, tiny_model):
    models = [
        LocalModel(Path("/m/Qwen-Q4_K_M.gguf"), "org/Qwen-GGUF/Qwen-Q4_K_M.gguf", 1, "hf-cache", "Q4_K_M",
                   id="qwen-q4_k_m"),
        LocalModel(Path("/m/Qwen-Q8_0.gguf"), "org/Qwen-GGUF/Qwen-Q8_0.gguf", 1, "hf-cache", "Q8_0", id="qwen-q8_0"),
        LocalModel(Path("/b/sha256-1"), "llama3.2:latest", 1, "ollama", "Q4_K_M", id="llama3.2:latest"),
    ]
    assert library.find("qwen-q8_0", models).id == "qwen-q8_0"
    assert library.find("Qwen-Q8_0", models).id == "qwen-q8_0"
    assert library.find("Qwen-Q8_0.gguf", models).id == "qwen-q8_0"
    assert library.find("llama3.2", models).id == "llama3.2:latest"  # Ollama: no tag means latest
    assert library.find("hf.co/org/Qwen-GGUF:Q8_0", models).id == "qwen-q8_0"
    assert library.find("hf.co/org/qwen-gguf", models).id == "qwen-q4_k_m"  # Q4_K_M when no quant is named
    assert library.find("hf.co/org/Qwen-GGUF:Q2_K", models) is None
    for bad in ("../Qwen-Q8_0.gguf", "/m/Qwen-Q8_0.gguf", "nothing", ""):
        assert library.find(bad, models) is None


def test_resolve_takes_a_path_an_id_or_nothing(home, tiny_model):
    library.add_path(tiny_model)
    assert library.resolve(str(tiny_model)) == str(tiny_model)
    assert library.resolve("tiny-target") == str(tiny_model.resolve())
    assert library.resolve(None) == str(starter.default_model_path())
    with pytest.raises(KnownError, match="neither a file nor a model in the library.*tiny-target"):
        library.resolve("nope")
    with pytest.raises(KnownError, match="no such file"):
        library.resolve("../nope.gguf")


def write_embedder(path: Path) -> Path:
    """A header-only-correct tiny BERT-like file: what facts() reads (architecture and pooling)."""
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_uint32("bert.block_count", 1)
    w.add_uint32("bert.context_length", 64)
    w.add_uint32("bert.embedding_length", 8)
    w.add_uint32("bert.feed_forward_length", 16)
    w.add_uint32("bert.attention.head_count", 2)
    w.add_uint32("bert.pooling_type", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_facts_say_chat_template_tools_and_embedding(tiny_model, tiny_chatml, tmp_path):
    def caps(p: Path) -> dict:
        return library.facts(LocalModel(p, p.name, p.stat().st_size, "user", None))["capabilities"]

    assert caps(tiny_model) == {"chat_template": False, "tools": False, "embedding": False, "vision": False}
    assert caps(tiny_chatml)["chat_template"] is True
    assert caps(write_embedder(tmp_path / "emb.gguf"))["embedding"] is True
    from tests.fixtures.vision import write_tiny_vision_pair

    vision_model, _ = write_tiny_vision_pair(tmp_path / "pair")  # its projector beside it
    assert caps(vision_model)["vision"] is True
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 40)
    assert library.facts(LocalModel(junk, "junk", 44, "user", None))["architecture"] is None
