"""The library under hostile conditions: empty and broken files, unreadable or read-only folders,
symlink loops — one bad thing never hides the good models, and never a traceback."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ggufdesk.core import library
from ggufdesk.core.errors import KnownError
from tests.fixtures import hostile


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "userhome"
    h.mkdir()
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: h))
    monkeypatch.delenv("LMSTUDIO_MODELS_DIR", raising=False)
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    return h


def _lm(home: Path, name: str) -> Path:
    p = home / ".lmstudio" / "models" / "me" / "repo" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def test_zero_byte_and_non_gguf_files_are_not_listed(home, tiny_model):
    _lm(home, "empty-Q2_K.gguf").write_bytes(b"")
    _lm(home, "magic-only-Q2_K.gguf").write_bytes(b"GGUF")
    _lm(home, "page-Q4_0.gguf").write_text("<html>")
    _lm(home, "good-Q8_0.gguf").write_bytes(tiny_model.read_bytes())
    assert [m.name for m in library.list_models()] == ["me/repo/good-Q8_0.gguf"]
    with pytest.raises(KnownError, match="not a GGUF file"):
        library.add_path(_lm(home, "empty-Q2_K.gguf"))


def test_a_broken_header_does_not_empty_the_list(home, tiny_model, tmp_path):
    """The wizard plans each listed file; a corrupt one is refused alone (KnownError), not the list."""
    from ggufdesk.core.gguf_meta import read_gguf

    _lm(home, "good-Q8_0.gguf").write_bytes(tiny_model.read_bytes())
    _lm(home, "evil-Q4_K_M.gguf").write_bytes(hostile.CASES["nested_5000"]())
    models = library.list_models()
    assert len(models) == 2
    ok, bad = [], []
    for m in models:
        try:
            read_gguf(m.path)
            ok.append(m.name)
        except KnownError:
            bad.append(m.name)
    assert ok == ["me/repo/good-Q8_0.gguf"] and bad == ["me/repo/evil-Q4_K_M.gguf"]


def test_symlink_loop_in_add_is_a_plain_error(home, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    os.symlink(b, a)
    os.symlink(a, b)
    with pytest.raises(KnownError):
        library.add_path(a)
    with pytest.raises(KnownError):
        library.remove_path(a)
    _lm(home, "loop.gguf").symlink_to(_lm(home, "loop.gguf"))
    assert library.list_models() == []


def test_read_only_data_dir(home, tiny_model, monkeypatch):
    """Listing never writes; adding says plainly where it could not save."""
    blocker = home / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker))  # user_data_dir() cannot be created under a file
    assert library.list_models() == []
    with pytest.raises(KnownError, match="cannot save the model list"):
        library.add_path(tiny_model)


def test_unreadable_hf_cache_does_not_hide_other_models(home, tiny_model, monkeypatch):
    import huggingface_hub

    def boom(*a, **k):
        raise PermissionError(13, "Permission denied", "/hf/hub")

    monkeypatch.setattr(huggingface_hub, "scan_cache_dir", boom)
    _lm(home, "good-Q8_0.gguf").write_bytes(tiny_model.read_bytes())
    assert [m.name for m in library.list_models()] == ["me/repo/good-Q8_0.gguf"]
