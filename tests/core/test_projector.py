"""core/projector.py and the image store: a projector's header, the one that pairs with a model, and
images kept by hash."""
from __future__ import annotations

import pytest

from ggufdesk.core import catalog
from ggufdesk.core.errors import KnownError
from ggufdesk.core.image_store import ImageStore, images_of
from ggufdesk.core.projector import is_projector_name, pick_projector, projector_beside, read_projector
from tests.fixtures.ggufs import write_tiny_llama
from tests.fixtures.vision import ProjectorSpec, animated_gif, png_bytes, write_tiny_projector, write_tiny_vision_pair


def test_read_projector(tmp_path):
    p = read_projector(write_tiny_projector(tmp_path / "mmproj.gguf", ProjectorSpec(image_size=96, n_merge=3)))
    assert p.projector_type == "gemma3" and p.image_size == 96 and p.patch_size == 8
    assert p.image_tokens == (96 // 8 // 3) ** 2 == 16
    assert p.weight_bytes > 0 and p.memory_bytes() > p.weight_bytes and not p.mrope
    assert p.compute_bytes(flash_attn=False) > p.compute_bytes()
    with pytest.raises(KnownError, match="not a vision projector"):
        read_projector(write_tiny_llama(tmp_path / "text.gguf"))
    broken = tmp_path / "mmproj-broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 50)
    with pytest.raises(KnownError):
        read_projector(broken)


def test_which_projector_pairs():
    names = ["gemma-3-4b-it-Q4_K_M.gguf", "mmproj-gemma-3-4b-it-f32.gguf", "mmproj-gemma-3-4b-it-f16.gguf",
             "mmproj-other-model-f16.gguf"]
    assert pick_projector(names, "gemma-3-4b-it-Q4_K_M.gguf") == "mmproj-gemma-3-4b-it-f16.gguf"
    assert pick_projector(["m.gguf", "mmproj-F32.gguf", "mmproj-BF16.gguf"], "m.gguf") == "mmproj-BF16.gguf"
    assert pick_projector(["m.gguf"], "m.gguf") is None
    assert is_projector_name("x/gemma-mmproj-f16.gguf") and not is_projector_name("mmproj.txt")


def test_the_projector_beside_a_model(tmp_path):
    model, mmproj = write_tiny_vision_pair(tmp_path / "one")
    assert projector_beside(model) == mmproj
    assert projector_beside(mmproj) is None
    # a folder of several models: only a projector named after the model is its own
    many = tmp_path / "many"
    many.mkdir()
    for name in ("alpha-Q4_K_M.gguf", "beta-Q4_K_M.gguf"):
        (many / name).write_bytes(model.read_bytes())
    (many / "mmproj-F16.gguf").write_bytes(mmproj.read_bytes())
    assert projector_beside(many / "alpha-Q4_K_M.gguf") is None
    (many / "mmproj-alpha-f16.gguf").write_bytes(mmproj.read_bytes())
    assert projector_beside(many / "alpha-Q4_K_M.gguf") == many / "mmproj-alpha-f16.gguf"
    assert projector_beside(many / "beta-Q4_K_M.gguf") is None


def test_the_catalog_checks_an_mmproj_table(tmp_path):
    base = '''version = 2
[[model]]
id = "v"
family = "V"
name = "V"
params_b = 1.0
repo = "o/V-GGUF"
context_length = 4096
license = "mit"
tokenizer = "t"
capabilities = [{caps}]

[model.mmproj]
file = "mmproj-V-f16.gguf"
size = 1000
sha256 = "{sha}"
'''
    f = tmp_path / "c.toml"
    f.write_text(base.format(caps='"vision"', sha="a" * 64))
    cat = catalog.load(f)
    assert cat.warnings == () and cat.get("v").mmproj.file == "mmproj-V-f16.gguf"
    f.write_text(base.format(caps="", sha="not-a-digest"))
    warnings = " ".join(catalog.load(f).warnings)
    assert "sha256" in warnings
    f.write_text(base.format(caps="", sha="b" * 64))
    assert "without the vision capability" in " ".join(catalog.load(f).warnings)
    # written back and read again the same
    f.write_text(base.format(caps='"vision"', sha="a" * 64))
    again = tmp_path / "again.toml"
    again.write_text(catalog.dumps(catalog.load(f), header="# test"))
    assert catalog.load(again).get("v").mmproj == catalog.load(f).get("v").mmproj


def test_the_image_store(tmp_path):
    store = ImageStore(tmp_path / "images")
    data = png_bytes()
    key = store.put(data)
    assert store.put(data) == key and store.get(key) == data
    path = store.path(key)
    assert path.parent.name == key[:2] and path.suffix == ".png"
    path.write_bytes(b"damaged")
    assert store.get(key) is None  # a damaged file reads as missing, never as another image
    with pytest.raises(KnownError, match="animation"):
        store.put(animated_gif())
    assert store.get("../../etc/passwd") is None and store.path("x" * 64) is None
    assert images_of({"images": [key, "not-a-hash", 3]}) == [key] and images_of({}) == []
