"""`python -m ggufdesk.catalog.refresh` against the fake hub (tests/hubserver.py): files, sizes and sha256
come from the hub's metadata; a repo that cannot be read keeps its files and fails the run."""
from __future__ import annotations

import hashlib
import subprocess
import sys

from ggufdesk.catalog import refresh
from ggufdesk.core import catalog
from tests.fixtures import ggufs

SEED = '''# a test catalog
version = 2
updated = ""
refreshed = ""

[[model]]
id = "tiny-big"
family = "Tiny"
name = "Tiny Big"
params_b = 1.0
repo = "org/Tiny-Big-GGUF"
context_length = 2048
license = "apache-2.0"
tokenizer = "tiny"
draft = "tiny-small"
capabilities = ["reasoning", "tools"]

[[model]]
id = "tiny-small"
family = "Tiny"
name = "Tiny Small"
params_b = 0.1
repo = "org/Tiny-Small-GGUF"
context_length = 2048
license = "mit"
tokenizer = "tiny"
capabilities = []
'''


def _sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_refresh_writes_what_the_hub_says(hub, tmp_path):
    a = ggufs.write_tiny_llama(tmp_path / "a.gguf")
    b = ggufs.write_tiny_llama(tmp_path / "b.gguf", ggufs.TinySpec(seed=1))
    hub.add_repo("org/Tiny-Big-GGUF", {"Tiny-Big-Q8_0.gguf": a, "Tiny-Big-Q4_K_M.gguf": b,
                                       "Tiny-Big-IQ1_S.gguf": a, "README.md": tmp_path / "a.gguf"})
    hub.add_repo("org/Tiny-Small-GGUF", {"Tiny-Small-Q4_K_M-00001-of-00002.gguf": a,
                                         "Tiny-Small-Q4_K_M-00002-of-00002.gguf": b})
    seed = tmp_path / "catalog.toml"
    seed.write_text(SEED)
    assert refresh.main(["--catalog", str(seed), "--endpoint", hub.url]) == 0
    cat = catalog.load(seed)
    assert cat.warnings == () and cat.refreshed
    big, small = cat.get("tiny-big"), cat.get("tiny-small")
    assert [f.quant for f in big.files] == ["Q4_K_M", "Q8_0"]  # preferred order; IQ1_S is not offered
    q4 = big.files[0]
    assert (q4.file, q4.size, q4.sha256) == ("Tiny-Big-Q4_K_M.gguf", b.stat().st_size, (_sha(b),))
    split = small.files[0]
    assert split.parts == ("Tiny-Small-Q4_K_M-00001-of-00002.gguf", "Tiny-Small-Q4_K_M-00002-of-00002.gguf")
    assert split.size == a.stat().st_size + b.stat().st_size and split.sha256 == (_sha(a), _sha(b))
    assert big.capabilities == ("reasoning", "tools") and big.draft == "tiny-small"
    assert seed.read_text().startswith("# a test catalog")
    # rerunnable: a second run gives the same files
    assert refresh.main(["--catalog", str(seed), "--endpoint", hub.url]) == 0
    assert catalog.load(seed).get("tiny-big").files == big.files


def test_a_repo_the_hub_lacks_keeps_its_files_and_fails_the_run(hub, tmp_path, capsys):
    a = ggufs.write_tiny_llama(tmp_path / "a.gguf")
    hub.add_repo("org/Tiny-Big-GGUF", {"Tiny-Big-Q4_K_M.gguf": a})
    seed = tmp_path / "catalog.toml"
    seed.write_text(SEED)
    assert refresh.main(["--catalog", str(seed), "--endpoint", hub.url]) == 1
    assert "tiny-small" in capsys.readouterr().err
    cat = catalog.load(seed)
    assert cat.get("tiny-big").files and cat.get("tiny-small").files == ()


def test_the_module_runs_as_a_script(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(SEED.replace('capabilities = []', 'capabilities = ["flying"]'))
    r = subprocess.run([sys.executable, "-m", "ggufdesk.catalog.refresh", "--catalog", str(bad),
                        "--endpoint", "http://127.0.0.1:9"], capture_output=True, text=True)
    assert r.returncode == 2 and "capabilities" in r.stderr


def test_refresh_finds_a_vision_models_projector(hub, tmp_path):
    from tests.fixtures.vision import write_tiny_vision_pair

    model, mmproj = write_tiny_vision_pair(tmp_path / "v")
    hub.add_repo("org/Tiny-Big-GGUF", {"Tiny-Big-Q4_K_M.gguf": model, "mmproj-Tiny-Big-f16.gguf": mmproj,
                                       "mmproj-Tiny-Big-f32.gguf": mmproj})
    hub.add_repo("org/Tiny-Small-GGUF", {"Tiny-Small-Q4_K_M.gguf": model})
    seed = tmp_path / "catalog.toml"
    seed.write_text(SEED.replace('capabilities = ["reasoning", "tools"]', 'capabilities = ["vision"]'))
    assert refresh.main(["--catalog", str(seed), "--endpoint", hub.url]) == 0
    cat = catalog.load(seed)
    assert cat.warnings == ()
    big, small = cat.get("tiny-big"), cat.get("tiny-small")
    assert big.mmproj.file == "mmproj-Tiny-Big-f16.gguf" and big.mmproj.sha256 == (_sha(mmproj),)
    assert big.mmproj.size == mmproj.stat().st_size
    assert small.mmproj is None  # a text model lists none
    assert [f.file for f in big.files] == ["Tiny-Big-Q4_K_M.gguf"]  # the projector is not a quant
