"""Ollama's /api/pull (our downloader, from a local hub) and /api/delete (only our own files)."""
from __future__ import annotations

import json

import httpx
import ollama
import pytest

from ggufdesk.core import library
from tests.fixtures import ggufs
from tests.server.serving import InProcess


@pytest.fixture
def server():
    s = InProcess(env={"FAKE_ENGINE_TOKENS_PER_S": "0"})
    yield s
    s.close()


@pytest.fixture
def repo(hub, tmp_path):
    q4 = ggufs.write_tiny_llama(tmp_path / "tiny-Q4_K_M.gguf")
    q8 = ggufs.write_tiny_llama(tmp_path / "tiny-Q8_0.gguf", ggufs.TinySpec(seed=3))
    hub.add_repo("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": q8})
    return "org/tiny-GGUF"


def test_pull_streams_progress_and_lands_in_the_library(server, repo):
    with httpx.stream("POST", server.url + "/api/pull", json={"model": f"hf.co/{repo}:Q8_0"}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    statuses = [x["status"] for x in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    pulled = [x for x in lines if "digest" in x]
    assert pulled[-1]["completed"] == pulled[-1]["total"] > 0 and pulled[-1]["digest"].startswith("sha256:")
    names = [m.name for m in library.hf_cache_models()]
    assert names == ["org/tiny-GGUF/tiny-Q8_0.gguf"]
    client = ollama.Client(host=server.url)
    assert client.pull(f"hf.co/{repo}").status == "success"  # Q4_K_M by default, not streamed
    assert len(library.hf_cache_models()) == 2


def test_pull_refuses_what_it_cannot_fetch(server, repo):
    client = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3.2")
    assert err.value.status_code == 400 and "hf.co/" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.pull(f"hf.co/{repo}:IQ2_XS")
    assert err.value.status_code == 404 and "Q8_0" in err.value.error
    r = httpx.post(server.url + "/api/pull", json={"model": 5})
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_delete_removes_only_our_downloads(server, repo, tmp_path):
    client = ollama.Client(host=server.url)
    client.pull(f"hf.co/{repo}:Q8_0")
    mine = ggufs.write_tiny_llama(tmp_path / "mine.gguf")
    library.add_path(mine)
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("mine")
    assert err.value.status_code == 403 and mine.exists()
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("no-such-model")
    assert err.value.status_code == 404
    assert client.delete("tiny-Q8_0").status == "success"
    assert library.hf_cache_models() == []
