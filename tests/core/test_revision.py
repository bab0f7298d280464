"""A revision is a branch, tag, commit or hub ref, never a path (issue 34, finding 11): `download --revision ../../x`
had written huggingface_hub's refs file outside the cache."""
from __future__ import annotations

import json

import pytest

from ggufdesk.cli import main
from ggufdesk.core.downloads import check_revision
from ggufdesk.core.errors import KnownError


@pytest.mark.parametrize("rev", ["main", "v1.0", "refs/pr/1", "a" * 40, "feature/x-y_z", "release-2024.1"])
def test_good_revisions_pass(rev):
    assert check_revision(rev) == rev


@pytest.mark.parametrize("rev", ["../../x", "..", "refs/../x", "/abs", "a\\b", "x..y", ".hidden", "a/.b", "a b",
                                 "main.lock", "a//b", "a/", "", "a\0b", "@{u}", "a~1", "a^", "a:b", "a?b", "a*b",
                                 "a[b", "x" * 300, "a\nb"])
def test_revisions_that_could_be_paths_are_refused(rev):
    with pytest.raises(KnownError, match="revision"):
        check_revision(rev)


def test_download_refuses_a_path_revision_and_writes_nothing_outside_the_cache(capsys, hub, tiny_model, tmp_path,
                                                                                monkeypatch):
    from huggingface_hub import constants

    from ggufdesk.core import downloads

    hub.add_repo("org/tiny-GGUF", {"tiny-F32.gguf": tiny_model})
    cache = tmp_path / "cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    real = downloads._metadata  # a hub (or mirror) that answers for any revision name
    monkeypatch.setattr(downloads, "_metadata", lambda repo, name, rev, *a: real(repo, name, None, *a))
    before = {p for p in tmp_path.rglob("*")}
    rc = main(["download", "org/tiny-GGUF", "tiny-F32.gguf", "--revision", "../../x", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 1 and "revision" in d["error"]
    outside = {p for p in tmp_path.rglob("*") if cache not in p.parents and p != cache} - before
    assert not outside
    rc = main(["download", "org/tiny-GGUF", "--revision", "../../x", "--json"])
    assert rc == 1 and "revision" in json.loads(capsys.readouterr().out)["error"]
