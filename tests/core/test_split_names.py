"""One spelling of a split model's part names (gguf_meta.split_names), used everywhere."""
from __future__ import annotations

from ggufdesk.core.gguf_meta import split_names


def test_split_names_is_the_one_spelling_of_a_split_set():
    assert split_names("m/Q4/model-00002-of-00003.gguf") == [
        "m/Q4/model-00001-of-00003.gguf", "m/Q4/model-00002-of-00003.gguf", "m/Q4/model-00003-of-00003.gguf"]
    assert split_names("model-Q4_K_M.gguf") == ["model-Q4_K_M.gguf"]
