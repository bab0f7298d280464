"""Malformed GGUF headers (tests/fixtures/hostile.py): each is refused with a clear error, fast and in
little memory, or read into numbers the planner can use — never a traceback."""
from __future__ import annotations

import resource
import time

import pytest

from ggufdesk.core import planner
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import GGUFFormatError, read_gguf
from tests.core.test_planner import hw
from tests.fixtures import hostile

READABLE = {"zero_heads", "bad_unicode_key", "layer_index_beyond_count"}


@pytest.mark.parametrize("name", sorted(hostile.CASES))
def test_hostile_header_is_refused_or_planned(name, tmp_path):
    path = hostile.write_case(name, tmp_path)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    if name in READABLE:
        info = read_gguf(path)
        p = planner.plan(info, hw(), n_ctx=4096)
        assert p.ram_bytes > 0 and p.pred_decode_tok_s > 0
    else:
        with pytest.raises(KnownError) as e:
            read_gguf(path)
        assert str(path) in str(e.value)
    # bounded: CPU seconds and peak memory growth (the 5e7-layer header took 99 s and 3.96 GB before)
    assert time.process_time() - t0 < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 300 * 1024  # KiB


def test_huge_block_count_refused_by_the_limit(tmp_path):
    with pytest.raises(GGUFFormatError, match="block_count is 50000000"):
        read_gguf(hostile.write_case("huge_block_count", tmp_path))


def test_overflowing_dims_are_not_zero_bytes(tmp_path):
    """np.prod wrapped around uint64 and gave 0 MiB and "fit: cpu"; now the tensor is refused."""
    for name in ("overflow_dims", "wrapping_dims"):
        with pytest.raises(GGUFFormatError, match="claims dimensions"):
            read_gguf(hostile.write_case(name, tmp_path))


def test_deep_nesting_is_refused_not_recursed(tmp_path):
    with pytest.raises(GGUFFormatError, match="nests arrays"):
        read_gguf(hostile.write_case("nested_5000", tmp_path))


def test_negative_head_size_refused(tmp_path):
    with pytest.raises(GGUFFormatError, match="key_length is -256"):
        read_gguf(hostile.write_case("negative_head_dim", tmp_path))


def test_valid_small_seed_reads(tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(hostile.valid_small())
    info = read_gguf(p)
    assert info.n_layer == 1 and info.n_embd == 32 and info.n_vocab == 16


def test_planner_refuses_inconsistent_infos(tmp_path):
    from dataclasses import replace

    p = tmp_path / "ok.gguf"
    p.write_bytes(hostile.valid_small())
    info = read_gguf(p)
    for bad in (replace(info, head_dim_k=-1), replace(info, n_vocab=float("nan")),
                replace(info, n_head_kv=(1, 2, 3))):
        with pytest.raises(KnownError, match="inconsistent"):
            planner.plan(bad, hw())
    with pytest.raises(KnownError):
        planner.plan(info, hw(), n_ctx=-5)
    with pytest.raises(KnownError):
        planner.plan(info, hw(), n_ctx=1 << 40)


def test_zero_byte_files_are_never_ranked(tmp_path):
    p = tmp_path / "m-Q4_K_M.gguf"
    p.write_bytes(hostile.valid_small())
    info = read_gguf(p)
    ranked = planner.rank_quants([("m-Q2_K.gguf", 0), ("m-Q4_K_M.gguf", info.file_bytes)], info, hw())
    assert [r.file for r in ranked] == ["m-Q4_K_M.gguf"]


def test_garbage_tensor_table_is_truncation_not_struct_error(tmp_path):
    """A tensor count that runs into garbage: truncated cleanly, not struct.error."""
    p = tmp_path / "t.gguf"
    p.write_bytes(hostile.header(hostile.llama_kvs(), [b"\x05\x00"], n_tensors=1))
    with pytest.raises(GGUFFormatError):
        read_gguf(p)
