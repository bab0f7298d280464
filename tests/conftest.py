"""Shared fixtures: the developer's real settings and data stay out of tests; tiny and real models."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures import ggufs

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """Point platformdirs and the HF cache at a temp dir so no test touches the user's files."""
    home = tmp_path_factory.mktemp("home")
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(var, str(home / var.lower()))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(model_dir) -> Path:
    """Target: 2 layers, f32, seed 0."""
    return ggufs.write_tiny_llama(model_dir / "tiny-target.gguf", ggufs.TinySpec(seed=0))


@pytest.fixture(scope="session")
def tiny_draft(model_dir) -> Path:
    """Same vocab, different weights and depth: a compatible draft with low acceptance."""
    return ggufs.write_tiny_llama(model_dir / "tiny-draft.gguf", ggufs.TinySpec(seed=7, n_layer=1))


@pytest.fixture(scope="session")
def tiny_chatml(model_dir) -> Path:
    return ggufs.write_tiny_llama(
        model_dir / "tiny-chatml.gguf", ggufs.TinySpec(seed=1, chat_template=ggufs.CHATML_TEMPLATE)
    )


@pytest.fixture(scope="session")
def starter_model() -> Path:
    """The real Gemma 3 270M Q4_K_M from PyPI (slow tier)."""
    from ggufdesk.core.starter import starter_model_path

    return starter_model_path()
