"""planner.memory pinned to the last byte over a grid of models and settings (dense, tied output, sliding
window, mixture of experts; GPU layers, KV types, flash attention, n_cpu_moe, micro-batch), so a refactor of
the planner cannot move a figure unnoticed. A deliberate change of a formula changes the digest: check the
new figures against llama.cpp (bench/planner.py), then put the digest this test prints in PINNED."""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json

import pytest

from ggufdesk.core import planner
from ggufdesk.core.gguf_meta import GGUFInfo, read_gguf
from tests.fixtures import ggufs
from tests.fixtures.moe import MoeSpec, write_moe_header

PINNED = "036fbb2ad3250d4fb5877c328bcf7aeb10cb151e5a33d09fb8999ad150b79a5c"  # 4608 settings
CONTEXTS = (512, 1000, 32768)
OFFLOADS = ((0, True), (1, True), (2, True), (-1, True), (99, True), (30, True), (-1, False), (2, False))
FLASH = ("auto", "off")
SWA_FULL = (True, False)
CPU_MOE = (0, 1, 30)
KV_TYPES = (("f16", "f16"), ("q8_0", "q4_0"))
UBATCHES = (512, 33)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, GGUFInfo]:
    d = tmp_path_factory.mktemp("pinned")
    tiny = read_gguf(ggufs.write_tiny_llama(d / "tiny.gguf"))
    return {
        "tiny": tiny,
        "tied-f16": read_gguf(ggufs.write_tiny_llama(d / "tied.gguf", ggufs.TinySpec(
            n_layer=3, tied_output=True, dtype="f16"))),
        "swa": dataclasses.replace(tiny, n_swa=256, swa_layers=(True, False)),
        "moe": read_gguf(write_moe_header(d / "moe.gguf", MoeSpec())),
    }


def _rows(models: dict[str, GGUFInfo]) -> list[list[object]]:
    rows: list[list[object]] = []
    for (name, info), n_ctx, (ngl, gpu), flash, swa_full, moe, (tk, tv), ub in itertools.product(
            models.items(), CONTEXTS, OFFLOADS, FLASH, SWA_FULL, CPU_MOE, KV_TYPES, UBATCHES):
        m = planner.memory(info, n_ctx=n_ctx, n_gpu_layers=ngl, n_ubatch=ub, type_k=tk, type_v=tv,
                           flash_attn=flash, swa_full=swa_full, gpu=gpu, n_cpu_moe=moe)
        rows.append([name, n_ctx, ngl, gpu, flash, swa_full, moe, tk, tv, ub, *dataclasses.astuple(m)])
    return rows


def test_memory_figures_are_pinned(models):
    rows = _rows(models)
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    print(f"planner.memory digest over {len(rows)} settings: {digest}")
    assert digest == PINNED


def test_a_few_pinned_rows_spelled_out(models):
    """Readable anchors for the digest: each model on the CPU, partly offloaded and fully offloaded."""
    got = {(name, ngl): dataclasses.astuple(planner.memory(
        info, n_ctx=1000, n_gpu_layers=ngl, type_k="q8_0", type_v="q4_0", swa_full=False, gpu=True, n_cpu_moe=1))
        for name, info in models.items() for ngl in (0, 2, -1)}
    assert got == SPELLED


# (model, n_gpu_layers): Memory's fields in order (weights_cpu, weights_gpu, kv_cpu, kv_gpu, compute_cpu,
# compute_gpu, output, overhead, cuda_context, projector_cpu, projector_gpu)
SPELLED: dict[tuple[str, int], tuple[int, ...]] = {
    ("tiny", 0): (533760, 0, 106496, 0, 2359296, 0, 1856, 8470272, 0, 0, 0),
    ("tiny", 2): (266752, 267008, 53248, 53248, 2359296, 2359296, 1856, 8470272, 536870912, 0, 0),
    ("tiny", -1): (118784, 414976, 0, 106496, 262144, 2359296, 1856, 8470272, 536870912, 0, 0),
    ("tied-f16", 0): (282368, 0, 159744, 0, 2359296, 0, 1856, 8470272, 0, 0, 0),
    ("tied-f16", 2): (207872, 133888, 106496, 53248, 2359296, 2359296, 1856, 8470272, 536870912, 0, 0),
    ("tied-f16", -1): (59392, 282368, 0, 159744, 262144, 2359296, 1856, 8470272, 536870912, 0, 0),
    ("swa", 0): (533760, 0, 93184, 0, 3407872, 0, 1856, 8470272, 0, 0, 0),
    ("swa", 2): (266752, 267008, 39936, 53248, 3407872, 3407872, 1856, 8470272, 536870912, 0, 0),
    ("swa", -1): (118784, 414976, 0, 93184, 262144, 3407872, 1856, 8470272, 536870912, 0, 0),
    ("moe", 0): (17302790144, 0, 40894464, 0, 39321600, 0, 607744, 35129344, 0, 0, 0),
    ("moe", 2): (16774569984, 528220160, 40042496, 851968, 39321600, 39321600, 607744, 35129344, 536870912, 0, 0),
    ("moe", -1): (514768896, 16788021248, 0, 40894464, 8388608, 39321600, 607744, 35129344, 536870912, 0, 0),
}
