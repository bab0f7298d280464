"""No test touches the developer's files (tests/conftest.py): not a test's own code, and not the engines
and servers a module shares, which start before any test's folders exist (an engine shared by
tests/engine/test_structured.py wrote its measured verification costs to the developer's cache)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import conftest


@pytest.fixture(scope="module")
def shared_cache() -> Path:
    """Where an engine a module shares would keep its verification costs."""
    from ggufdesk.engine.speculation.verify_cost import _store_path

    return _store_path()


def test_what_a_module_shares_keeps_its_files_in_the_tests_folders(shared_cache, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    assert base in shared_cache.parents
    for var in conftest.USER_DIRS:
        assert base in Path(os.environ[var]).parents, var


def test_the_starter_fixtures_read_the_developers_folders_for_a_moment_only():
    own = {var: os.environ[var] for var in conftest.USER_DIRS}
    with conftest._user_dirs():
        assert {var: os.environ.get(var) for var in conftest.USER_DIRS} == conftest._USER_ENV
    assert {var: os.environ[var] for var in conftest.USER_DIRS} == own


def test_a_failure_inside_the_moment_gives_the_tests_folders_back():
    own = dict(os.environ)
    with pytest.raises(RuntimeError), conftest._user_dirs():
        raise RuntimeError("assembling the starter failed")
    assert dict(os.environ) == own
