"""Mixture of experts in the planner: decode reads the dense part, the shared experts and the active
routed experts; memory holds all of them; a model too big for VRAM gets the experts-on-the-CPU split."""
from __future__ import annotations

import pytest

from ggufdesk.core import planner
from ggufdesk.core.gguf_meta import read_gguf
from tests.core.test_planner import GiB, hw
from tests.fixtures.moe import MoeSpec, write_moe_header

SPEC = MoeSpec()  # qwen3moe-shaped: 48 layers, 128 experts, 8 used, shared experts; Q4_K, ~17 GB


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return read_gguf(write_moe_header(tmp_path_factory.mktemp("moe") / "qwen3moe-shaped.gguf", SPEC))


def test_decode_bytes_are_dense_plus_shared_plus_the_active_share_of_routed(info):
    dense = shared = routed = 0
    for t in info.tensors:
        if t.name == "token_embd.weight":
            continue
        if "_exps" in t.name:
            routed += t.n_bytes
        elif "_shexp" in t.name:
            shared += t.n_bytes
        else:
            dense += t.n_bytes
    assert shared > 0 and routed > 10 * dense
    want = dense + shared + routed * 8 / 128
    got = planner.decode_bytes(info)
    assert (got.dense, got.shared, got.routed_total) == (dense, shared, routed)
    assert planner.weight_bytes_per_token(info) == pytest.approx(want, rel=0.01)


def test_memory_holds_every_expert(info):
    m = planner.memory(info, n_ctx=4096)
    assert m.weights_cpu == info.weight_bytes
    gpu = planner.memory(info, n_ctx=4096, n_gpu_layers=-1, gpu=True, n_cpu_moe=48)
    routed = sum(t.n_bytes for t in info.tensors if "_exps" in t.name)
    assert gpu.weights_gpu + gpu.weights_cpu == info.weight_bytes
    assert gpu.weights_cpu == routed + info.tensor("token_embd.weight").n_bytes


def test_the_experts_split_fits_where_whole_layers_do_not_and_is_faster(info):
    machine = hw(ram_avail=64 * GiB, vram_free=[8 * GiB], bw=40.0)
    whole = planner.plan(info, machine, n_ctx=4096, n_cpu_moe=0)  # whole layers only
    assert whole.fit == "partial" and whole.n_gpu_layers < info.n_layer
    moe = planner.plan(info, machine, n_ctx=4096)
    assert moe.n_cpu_moe > 0 and moe.n_gpu_layers == info.n_layer + 1 and moe.fit == "partial"
    assert moe.vram_bytes <= moe.vram_budget  # all layers on the GPU: whole layers could not fit this
    full = planner.memory(info, n_ctx=4096, n_gpu_layers=-1, gpu=True)
    assert full.vram > moe.vram_budget
    assert moe.pred_decode_tok_s > whole.pred_decode_tok_s
    assert moe.layer_split_decode_tok_s == pytest.approx(whole.pred_decode_tok_s)
    assert "experts on the CPU" in moe.explanation
    fewer = planner.memory(info, n_ctx=4096, n_gpu_layers=-1, gpu=True, n_cpu_moe=moe.n_cpu_moe - 1)
    assert fewer.vram + fewer.cuda_context > moe.vram_budget or fewer.vram > moe.vram_budget  # the fewest


def test_dense_models_and_roomy_gpus_get_no_experts_split(info, tmp_path):
    from tests.fixtures import ggufs

    roomy = planner.plan(info, hw(ram_avail=64 * GiB, vram_free=[40 * GiB]), n_ctx=4096)
    assert roomy.fit == "full_gpu" and roomy.n_cpu_moe == 0
    dense = read_gguf(ggufs.write_tiny_llama(tmp_path / "d.gguf"))
    assert planner.experts_split(dense, lambda n: True) is None
    assert planner.decode_bytes(dense).routed_total == 0


def test_experts_on_the_cpu_are_read_at_ram_speed(info):
    machine = hw(ram_avail=64 * GiB, vram_free=[40 * GiB], bw=40.0)
    gpu = planner.decode_seconds(info, machine, n_gpu_layers=-1)
    half = planner.decode_seconds(info, machine, n_gpu_layers=-1, n_cpu_moe=24)
    cpu = planner.decode_seconds(info, machine, n_gpu_layers=-1, n_cpu_moe=48)
    assert gpu < half < cpu


def test_a_token_multiplies_only_the_active_experts(info):
    """Per layer: q, k, v, output, the router, 3 matrices per active expert, 3 shared: the fixed cost
    a mixture of experts pays per token (hardware.MATMUL_CPU_S each) grows with the experts used."""
    per_layer = 4 + 1 + 3 * SPEC.n_expert_used + 3
    assert planner.matmuls_per_token(info) == SPEC.n_layer * per_layer + 1  # + the output matrix
