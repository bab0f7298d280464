"""The curated catalog: the shipped file is valid; bad entries are reported and skipped, never fatal."""
from __future__ import annotations

import pytest

from ggufdesk.core import catalog
from ggufdesk.core.errors import KnownError


def test_shipped_catalog_is_clean():
    c = catalog.load()
    assert c.warnings == ()
    assert {"Qwen", "Llama", "Gemma", "Mistral", "Phi", "DeepSeek", "OpenAI", "SmolLM"} <= set(c.families())
    assert max(e.params_b for e in c.entries) >= 70 and min(e.params_b for e in c.entries) < 1
    for e in c.entries:
        d = c.draft_for(e.id)
        if d is not None:
            assert d.tokenizer == e.tokenizer and d.params_b < e.params_b
        assert e.license and set(e.capabilities) <= set(catalog.CAPABILITIES)
        assert ("moe" in e.capabilities) == (e.active_params_b is not None)
        for f in e.files:  # written by the refresh from the hub: never guessed
            assert f.size > 0 and all(s is None or catalog.SHA256_RE.match(s) for s in f.sha256)
    assert catalog.default_path().parent.name == "catalog"
    for want in ("qwen3-30b-a3b", "gpt-oss-20b", "gemma-3-27b-it", "llama-3.2-1b-instruct",
                 "mistral-small-3.2-24b-instruct", "phi-4-mini-instruct", "deepseek-r1-distill-qwen-7b",
                 "smollm3-3b", "qwen3-0.6b", "qwen3-32b"):
        assert c.get(want) is not None, want
    assert {"reasoning", "tools", "vision", "moe"} <= {cap for e in c.entries for cap in e.capabilities}


def test_files_are_checked(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(GOOD + '''
[[model.file]]
quant = "Q4_K_M"
file = "Small-Q4_K_M.gguf"
size = 1000
sha256 = "missing"

[[model.file]]
quant = "Q8_0"
file = "Small-Q8_0.gguf"
size = 2000
sha256 = "not-a-digest"

[[model.file]]
quant = "F16"
file = "Small-F16.gguf"
size = -1
sha256 = "missing"

[[model.file]]
quant = "BF16"
file = "Small-BF16.gguf"
size = 3000
sha256 = [5]
''')
    c = catalog.load(p)
    small = c.get("small")
    assert [f.quant for f in small.files] == ["Q4_K_M"] and small.files[0].sha256 == (None,)
    assert [w for w in c.warnings if "file #" in w] == [
        'model #2 (small) file #2: sha256 needs one 64-hex digest (or "missing") per part',
        "model #2 (small) file #3: needs quant, file and a size in bytes",
        # a digest that is not text: a warning like the others (it used to raise TypeError out of load)
        'model #2 (small) file #4: sha256 needs one 64-hex digest (or "missing") per part']
    again = tmp_path / "again.toml"
    again.write_text(catalog.dumps(c, header="# test"))
    assert catalog.load(again).get("small").files == small.files


GOOD = '''
[[model]]
id = "big"
family = "F"
name = "Big"
params_b = 7.0
repo = "org/Big-GGUF"
context_length = 8192
license = "mit"
tokenizer = "t1"
draft = "small"

[[model]]
id = "small"
family = "F"
name = "Small"
params_b = 0.5
repo = "org/Small-GGUF"
context_length = 8192
license = "mit"
tokenizer = "t1"
'''


def test_bad_entries_are_reported(tmp_path):
    bad = GOOD + '''
[[model]]
id = "no-repo"
family = "F"
name = "x"
params_b = 1
context_length = 8192
license = "mit"
tokenizer = "t1"

[[model]]
id = "weird"
family = "F"
name = "x"
params_b = "seven"
repo = "not a repo"
context_length = 8192
license = "mit"
tokenizer = "t1"

[[model]]
id = "other-tok"
family = "F"
name = "x"
params_b = 3.0
repo = "org/x"
context_length = 8192
license = "mit"
tokenizer = "t2"
draft = "small"
colour = "blue"

[[model]]
id = "small"
family = "F"
name = "dup"
params_b = 0.5
repo = "org/dup"
context_length = 8192
license = "mit"
tokenizer = "t1"

[[model]]
id = "lost-draft"
family = "F"
name = "x"
params_b = 3.0
repo = "org/y"
context_length = 8192
license = "mit"
tokenizer = "t1"
draft = "nowhere"
'''
    p = tmp_path / "c.toml"
    p.write_text("version = 3\n" + bad)
    c = catalog.load(p)
    assert c.version == 3
    assert [e.id for e in c.entries] == ["big", "small", "other-tok", "lost-draft"]
    w = "\n".join(c.warnings)
    assert "no-repo" in w and "missing repo" in w
    assert "params_b has the wrong type" in w
    assert "unknown keys colour" in w
    assert "tokenizer 't1', not 't2'" in w and c.get("other-tok").draft is None
    assert "duplicate id 'small'" in w
    assert "'nowhere' is not in the catalog" in w
    assert c.draft_for("big").id == "small"


def test_unreadable_catalog_is_a_known_error(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("version = [")
    with pytest.raises(KnownError, match="cannot be read"):
        catalog.load(p)
    with pytest.raises(KnownError, match="missing"):
        catalog.load(tmp_path / "absent.toml")
    p.write_text("model = 5\n")
    c = catalog.load(p)
    assert c.entries == () and len(c.warnings) == 2

