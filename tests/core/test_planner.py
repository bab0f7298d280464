"""Planner formulas on hand-computed cases: placement, KV (incl. sliding window), compute, fit, speed, ranking."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ggufdesk.core import hardware, planner, quants
from ggufdesk.core.errors import SettingsError
from ggufdesk.core.gguf_meta import read_gguf
from ggufdesk.core.hardware import CPUInfo, GPUInfo, HardwareInfo, calibration, cpu_fixed_s, record_decode_run
from tests.fixtures import ggufs

GiB, MiB = 1 << 30, 1 << 20
SPEC = ggufs.TinySpec()  # 2 layers, n_embd 64, 4 heads, 2 KV heads (head dim 16), n_ff 128, f32
N_VOCAB = len(ggufs.vocab()[0])


def hw(*, ram_avail=16 * GiB, vram_free: list[int] = (), bw=10.0) -> HardwareInfo:
    gpus = tuple(GPUInfo(index=i, name=f"GPU{i}", vram_total=f + GiB, vram_free=f, vram_used=GiB,
                         vram_used_by_others=0, bandwidth_gbs=500.0) for i, f in enumerate(vram_free))
    cpu = CPUInfo(name="test", arch="x86_64", cores_physical=4, cores_logical=8, flags=("avx2",))
    return HardwareInfo(gpus=gpus, cpu=cpu, ram_total=ram_avail + GiB, ram_available=ram_avail,
                        ram_bandwidth_gbs=bw, ram_bandwidth_source="measured", cpu_gflops=100.0)


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return read_gguf(ggufs.write_tiny_llama(tmp_path_factory.mktemp("m") / "t.gguf"))


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return read_gguf(ggufs.write_tiny_llama(tmp_path_factory.mktemp("m") / "tied.gguf",
                                            ggufs.TinySpec(tied_output=True)))


def test_kv_cache_bytes(info):
    # n_ctx 1000 -> 1024 cells; per layer 1024 x (2 heads x 16 dims x 2 B) for K and again for V
    assert planner.kv_bytes_per_layer(info, 1000) == [1024 * 128] * 2
    # q8_0: 34 bytes per 32 elements
    assert planner.kv_bytes_per_layer(info, 1024, type_k="q8_0", type_v="q8_0") == [1024 * 2 * 32 * 34 // 32] * 2
    with pytest.raises(SettingsError):
        planner.kv_bytes_per_layer(info, 1024, type_k="q3_z")


def test_sliding_window_layers(info):
    swa = replace(info, n_swa=256, swa_layers=(True, False))
    full = planner.kv_bytes_per_layer(swa, 4096, swa_full=True)
    assert full == [4096 * 128] * 2  # llama.cpp's C default: full-size SWA cache
    small = planner.kv_bytes_per_layer(swa, 4096, swa_full=False, n_ubatch=512)
    assert small == [768 * 128, 4096 * 128]  # window 256 + ubatch 512, padded to 256


def test_compute_buffer(info):
    # flash attention: layer stage 512 x 4 x (4 x 64 + 3 x 128) + mask 512 x 1024 x 2
    layer = 512 * 4 * (4 * 64 + 3 * 128) + 512 * 1024 * 2
    out = 512 * N_VOCAB * 4 + 2 * 512 * 64 * 4  # logits for every micro-batch row (no cap)
    assert planner.compute_buffer(info, n_ctx=1024, n_ubatch=512, flash=True, n_outputs=512) == max(layer, out)
    capped = 17 * N_VOCAB * 4 + 2 * 512 * 64 * 4  # the engine's cap: [last] + 16 drafts
    assert planner.compute_buffer(info, n_ctx=1024, n_ubatch=512, flash=True) == max(layer, capped)
    # without flash attention the KQ scores grow with the context: 512 x 8192 x (4 x 4 + 4)
    no_fa = 512 * 8192 * 20 + 512 * 4 * 6 * 64
    assert planner.compute_buffer(info, n_ctx=8192, n_ubatch=512, flash=False) == no_fa


def test_cpu_memory_and_overhead(info):
    m = planner.memory(info, n_ctx=1024)
    assert m.weights_cpu == info.weight_bytes and m.weights_gpu == 0 and m.vram == 0
    assert m.kv_cpu == 2 * 1024 * 128
    assert m.output == N_VOCAB * 4
    assert m.overhead == planner.OVERHEAD_BASE + planner.OVERHEAD_PER_VOCAB * N_VOCAB
    assert m.ram == m.weights_cpu + m.kv_cpu + m.compute_cpu + m.output + m.overhead


def test_gpu_layer_placement(info):
    lb = info.layer_bytes()
    out = info.tensor("output.weight").n_bytes + info.tensor("output_norm.weight").n_bytes
    emb = info.tensor("token_embd.weight").n_bytes
    # llama.cpp: n_gpu_layers=1 offloads only the output layer; 2 adds the last block; 3 is all
    m1 = planner.memory(info, n_ctx=1024, n_gpu_layers=1, gpu=True)
    assert (m1.weights_gpu, m1.kv_gpu) == (out, 0)
    m2 = planner.memory(info, n_ctx=1024, n_gpu_layers=2, gpu=True)
    assert (m2.weights_gpu, m2.kv_gpu) == (out + lb[1], 1024 * 128)
    m3 = planner.memory(info, n_ctx=1024, n_gpu_layers=-1, gpu=True)
    assert m3.weights_gpu == out + lb[0] + lb[1] and m3.weights_cpu == emb  # token_embd stays on the CPU
    assert m3.kv_cpu == 0 and m3.cuda_context == planner.CUDA_CONTEXT
    assert m3.compute_cpu == 2 * 512 * 64 * 4  # only the input embeddings' host buffer


def test_tied_output_duplicated_on_gpu_only(tied):
    emb = tied.tensor("token_embd.weight").n_bytes
    cpu = planner.memory(tied, n_ctx=512)
    assert cpu.weights_cpu == tied.weight_bytes  # shared on the CPU, counted once
    gpu = planner.memory(tied, n_ctx=512, n_gpu_layers=-1, gpu=True)
    assert gpu.weights_cpu == emb and gpu.weights_gpu == tied.weight_bytes  # a copy goes to the GPU


def test_fit_labels(info):
    p = planner.plan(info, hw(), n_ctx=1024)
    assert (p.fit, p.n_gpu_layers, p.vram_bytes) == ("cpu", 0, 0)
    assert "runs on the CPU" in p.explanation
    big = planner.plan(info, hw(vram_free=[8 * GiB]), n_ctx=1024)
    assert (big.fit, big.n_gpu_layers) == ("full_gpu", 3)
    assert "fits fully on your 9 GB GPU" in big.explanation
    # a GPU budget that holds the output and one block but not both blocks -> partial
    full = planner.memory(info, n_ctx=1024, n_gpu_layers=2, gpu=True).vram
    tight = full + planner.VRAM_MARGIN[0] + 1000
    part = planner.plan(info, hw(vram_free=[tight]), n_ctx=1024)
    assert (part.fit, part.n_gpu_layers) == ("partial", 2)
    none = planner.plan(info, hw(ram_avail=1000), n_ctx=1024)
    assert none.fit == "too_large" and "does not fit" in none.explanation
    forced = planner.plan(info, hw(vram_free=[8 * GiB]), n_ctx=1024, n_gpu_layers=1)
    assert (forced.fit, forced.n_gpu_layers) == ("partial", 1)


def test_draft_is_counted(info, tied):
    alone = planner.plan(info, hw(), n_ctx=2048)
    both = planner.plan(info, hw(), n_ctx=2048, draft=tied)
    d = planner.memory(tied, n_ctx=2048)
    assert both.ram_bytes == alone.ram_bytes + d.ram
    assert both.to_json()["draft_breakdown"]["kv_cpu"] == d.kv_cpu


def test_kv_advice_when_context_is_the_limit(info):
    m = planner.memory(info, n_ctx=65536)
    p = planner.plan(info, hw(ram_avail=m.ram // 2 + GiB + 1), n_ctx=65536)
    assert p.fit == "too_large"
    assert any("q8_0 KV cache" in a for a in p.advice)
    with pytest.raises(SettingsError, match="flash attention"):
        planner.plan(info, hw(), type_v="q8_0", flash_attn="off")


def test_decode_speed_formula(info):
    h = hw(bw=10.0)
    read = sum(t.n_bytes for t in info.tensors if t.name != "token_embd.weight")  # all f32
    expect = cpu_fixed_s(planner.matmuls_per_token(info)) + read / (10e9 * planner.EFF_CPU_FLOAT)
    assert planner.decode_seconds(info, h, n_gpu_layers=0) == pytest.approx(expect)
    # with 1000 tokens in the cache each layer's attention also works through them, per query head
    deep = planner.decode_seconds(info, h, n_gpu_layers=0, depth=1000)
    per_head = planner.cpu_attention_s(h, info.n_head)
    assert per_head == pytest.approx(hardware.ATTN_CPU_S / min(h.cpu.cores_physical, info.n_head))
    assert deep - expect == pytest.approx(info.n_layer * info.n_head * 1000 * per_head)
    # GPU layers read at GPU bandwidth: faster
    g = hw(vram_free=[8 * GiB])
    assert planner.decode_seconds(info, g, n_gpu_layers=-1) < expect


def test_calibration_replaces_the_default_efficiency(info):
    h = hw(bw=10.0)
    before = planner.decode_seconds(info, h, n_gpu_layers=0)
    record_decode_run(where="cpu", bytes_per_token=100 << 20, tok_s=1.0)  # 0.1 GB/s: a slow machine
    assert planner.decode_seconds(info, h, n_gpu_layers=0) == before  # pure: no file is read
    after = planner.decode_seconds(info, h, n_gpu_layers=0, calibration=calibration())
    assert planner.decode_seconds(info, replace(h, calibration=calibration()), n_gpu_layers=0) == after
    read = planner.weight_bytes_per_token(info)
    fixed = cpu_fixed_s(planner.matmuls_per_token(info))
    # a run recorded without its matrix count keeps the fixed cost inside its whole-token bandwidth
    assert after == pytest.approx(read / ((100 << 20) * 1.0) + fixed)
    assert after > before


def test_calibration_takes_the_matrices_fixed_cost_out_of_the_bandwidth(info):
    """A run's token time is bytes at the machine's bandwidth plus a fixed cost per matrix multiplied;
    the calibrated bandwidth is what is left after that cost, so a model that multiplies many small
    matrices (a mixture of experts) is not predicted at a dense model's speed."""
    big, n_big = 64 << 20, 300  # a recorded run of a model big enough to be bandwidth-bound
    record_decode_run(where="cpu", bytes_per_token=big, tok_s=1 / (big / 2e9 + cpu_fixed_s(n_big)), matmuls=n_big)
    assert calibration().cpu_gbs == pytest.approx(2.0)  # 2 GB/s once its matrices' fixed cost is out
    n, read = planner.matmuls_per_token(info), planner.weight_bytes_per_token(info)
    expect = read / 2e9 + cpu_fixed_s(n)
    assert planner.decode_seconds(info, hw(), n_gpu_layers=0, calibration=calibration()) == pytest.approx(expect)
    # a nonsense recorded count (a fixed cost above half the token's time) is not subtracted
    record_decode_run(where="cpu", bytes_per_token=big, tok_s=1 / (big / 1e9), matmuls=10**9)
    assert calibration().cpu_gbs == pytest.approx(2.0)


def test_prefill_formula(info):
    p = planner.prefill_tok_s(info, hw(), n_gpu_layers=0, prompt=512)
    flops = 2 * planner.layer_params(info) + 4 * 4 * 16 * 256 * 2
    assert p == pytest.approx(100e9 * planner.EFF_PREFILL_CPU / flops)


def test_rank_quants(info):
    sizes = {"m-F16.gguf": 4000, "m-Q8_0.gguf": 2100, "m-Q4_K_M.gguf": 1200, "m-Q2_K.gguf": 800}
    ref = replace(info, file_bytes=info.weight_bytes)
    files = [(n, int(ref.file_bytes * s / 4000)) for n, s in sizes.items()]
    f16_ram = planner.plan(planner.scaled(ref, files[0][1], "x", "F16"), hw(), n_ctx=512).ram_bytes
    q8_ram = planner.plan(planner.scaled(ref, files[1][1], "x", "Q8_0"), hw(), n_ctx=512).ram_bytes
    h = hw(ram_avail=(f16_ram + q8_ram) // 2 + GiB + 2 * GiB // 10 * 0)  # F16 does not fit, Q8_0 does
    h = replace(h, ram_total=h.ram_available)  # margin = max(1 GiB, 10 %) = 1 GiB here
    ranked = planner.rank_quants(files, ref, h, n_ctx=512)
    assert [r.quant for r in ranked] == ["Q8_0", "Q4_K_M", "Q2_K", "F16"]
    assert ranked[0].recommended and ranked[-1].plan.fit == "too_large"
    assert ranked[0].to_json()["quality"] == "practically lossless"


def test_tips_name_only_quants_that_exist(info):
    slow = hw(bw=0.0001)  # every plan is slower than reading speed
    alone = planner.plan(info, slow, n_ctx=512)
    tip = next(a for a in alone.advice if "slower than reading speed" in a)
    assert "a smaller model reads fewer bytes" in tip and "quant" not in tip  # none is known
    ref = replace(info, file_bytes=info.weight_bytes)
    files = [("m-Q8_0.gguf", ref.file_bytes * 6), ("m-Q4_K_M.gguf", ref.file_bytes * 3),
             ("m-Q2_K.gguf", ref.file_bytes * 2)]
    tips = {r.quant: next(a for a in r.plan.advice if "reading speed" in a)
            for r in planner.rank_quants(files, ref, slow, n_ctx=512)}
    assert "a smaller quant (Q4_K_M, Q2_K) reads" in tips["Q8_0"]
    assert "a smaller quant (Q2_K) reads" in tips["Q4_K_M"]
    assert "a smaller model reads" in tips["Q2_K"]  # the smallest file: no smaller quant to offer


def test_quant_names():
    assert quants.quant_from_name("Qwen2.5-7B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quants.quant_from_name("google_gemma-3-4b-it-IQ4_XS.gguf") == "IQ4_XS"
    assert quants.quant_from_name("Llama-3.3-70B-Instruct-Q5_K_M-00001-of-00002.gguf") == "Q5_K_M"
    assert quants.quant_from_name("phi-4-bf16.gguf") == "BF16"
    assert quants.quant_from_name("readme.gguf") is None
    assert quants.quality_loss("Q8_0") < quants.quality_loss("Q4_K_M") < quants.quality_loss("Q2_K")


PROBED = {"F16": 20.0, "Q4_K": 15.0, "Q6_K": 12.0, "Q8_0": 14.0}


def test_planner_uses_the_probed_rate_of_each_weight_type():
    cal = hardware.Calibration(cpu_float_gbs=20.0, cpu_quant_gbs=15.0, cpu_gbs=1.0,
                               cpu_type_gbs=tuple(sorted(PROBED.items())))
    h = hw()
    assert planner.cpu_read_gbs(h, float_type=True, calibration=cal) == 20.0  # the probe over a recorded run
    assert planner.cpu_read_gbs(h, calibration=cal) == 15.0  # "a quantized model" in general: Q4_K's
    assert planner.cpu_read_gbs(h, calibration=cal, ggml_type="Q6_K") == 12.0
    assert planner.cpu_read_gbs(h, calibration=cal, ggml_type="Q8_0") == 14.0
    assert planner.cpu_read_gbs(h, calibration=cal, ggml_type="Q5_K") == 15.0  # 5.5 bits: nearest Q4_K's 4.5
    assert planner.cpu_read_gbs(h, calibration=cal, ggml_type="Q8_1") == 14.0
    assert planner.cpu_read_gbs(h, calibration=cal, ggml_type="BF16", float_type=True) == 20.0
    assert planner.cpu_read_gbs(h, calibration=cal, ggml_type="NOT_A_TYPE") == 15.0  # read like Q4_K
    assert planner.cpu_read_gbs(h, calibration=hardware.Calibration(cpu_gbs=1.0)) == 1.0  # no probe: the run


def test_an_unprobed_type_is_read_like_its_own_kernel_family():
    """Across families the kernels differ by 2x at the same bits (Q4_K vs IQ4_XS, both 4.5 bits)."""
    full = {"F16": 19.0, "Q8_0": 14.0, "Q6_K": 13.0, "Q5_K": 7.8, "Q4_K": 14.6, "Q3_K": 7.5, "Q5_0": 6.3,
            "Q4_0": 7.5, "IQ4_XS": 6.4}
    cal = hardware.Calibration(cpu_float_gbs=19.0, cpu_quant_gbs=14.6, cpu_type_gbs=tuple(sorted(full.items())))

    def gbs(t: str) -> float:
        return planner.cpu_read_gbs(hw(), calibration=cal, ggml_type=t)

    assert gbs("IQ4_NL") == 6.4 and gbs("IQ3_S") == 6.4  # the IQ family, not Q4_K's 14.6 at the same bits
    assert gbs("Q4_1") == 7.5 and gbs("Q5_1") == 6.3 and gbs("Q8_1") == 14.0  # the legacy blocks
    assert gbs("Q2_K") == 7.5  # the nearest K-quant (Q3_K)
    assert gbs("TQ2_0") == 6.4  # a family nobody probed here... the ternary types: IQ-like lookups


def test_another_quant_of_a_model_is_read_at_its_own_types_rate(info):
    """rank_quants scales the known file to each quant's size; its matrices take the quant's main type."""
    q = replace(info, tensors=tuple(replace(t, ggml_type="Q4_K") if len(t.shape) == 2 else t for t in info.tensors))
    q = replace(q, file_bytes=q.weight_bytes)
    q5 = planner.scaled(q, q.file_bytes, "m-Q5_K_M.gguf", "Q5_K_M")
    assert {t.ggml_type for t in q5.tensors if len(t.shape) == 2} == {"Q5_K"}
    assert {t.ggml_type for t in q5.tensors if len(t.shape) == 1} == {"F32"}
    assert planner.scaled(q, q.file_bytes, "m.gguf", None).tensors == q.tensors  # no quant in the name: as is
    cal = hardware.Calibration(cpu_quant_gbs=14.0, cpu_type_gbs=(("Q4_K", 14.0), ("Q5_K", 7.0)))
    t4, t5 = (planner.decode_seconds(m, hw(), n_gpu_layers=0, calibration=cal) for m in (q, q5))
    fixed = cpu_fixed_s(planner.matmuls_per_token(q))
    assert (t5 - fixed) / (t4 - fixed) == pytest.approx(2.0, rel=0.05)  # same bytes, the half-speed kernel
    assert [quants.main_type(n) for n in ("Q4_K_M", "Q3_K_XL", "IQ3_M", "Q8_0", "MXFP4", "F16", "readme")] == [
        "Q4_K", "Q3_K", "IQ3_S", "Q8_0", "MXFP4", "F16", None]


def test_a_probed_model_is_predicted_type_by_type(info):
    """The tiny model is all F32: read at the probe's float rate, plus the fixed costs."""
    cal = hardware.Calibration(cpu_float_gbs=2.0, cpu_quant_gbs=1.0, cpu_type_gbs=(("F16", 2.0), ("Q4_K", 1.0)))
    read = sum(t.n_bytes for t in info.tensors if t.name != "token_embd.weight")
    expect = cpu_fixed_s(planner.matmuls_per_token(info)) + read / 2e9
    assert planner.decode_seconds(info, hw(), n_gpu_layers=0, calibration=cal) == pytest.approx(expect)


def test_the_decode_probe_is_kept_per_machine_and_a_broken_file_is_ignored():
    hardware.record_decode_probe({"float_gbs": 20.0, "quant_gbs": 15.0, "type_gbs": dict(PROBED), "threads": 2})
    assert hardware.decode_probe() == {"float_gbs": 20.0, "quant_gbs": 15.0, "type_gbs": PROBED}
    assert calibration().cpu_type_gbs == tuple(sorted(PROBED.items()))
    path = hardware.cache_dir() / hardware.DECODE_PROBE_FILE
    (d,) = json.loads(path.read_text())["machines"].values()  # one entry per machine key; one alone reads too
    path.write_text(json.dumps(d))
    assert hardware.decode_probe() == {"float_gbs": 20.0, "quant_gbs": 15.0, "type_gbs": PROBED}
    path.write_text(json.dumps({**d, "key": "another machine"}))
    assert hardware.decode_probe() is None  # measured on other hardware: not this one's
    for broken in ('{"float_gbs": 20', "[]", json.dumps({**d, "quant_gbs": 0}), json.dumps({**d, "float_gbs": True})):
        path.write_text(broken)
        assert hardware.decode_probe() is None and calibration().cpu_float_gbs is None
    path.write_text(json.dumps({**d, "type_gbs": {"F16": "fast", "Q4_K": 15.0}}))
    assert hardware.decode_probe()["type_gbs"] == {"Q4_K": 15.0}  # a broken entry dropped, the rest kept
    with pytest.raises(ValueError, match="no usable rates"):
        hardware.record_decode_probe({"float_gbs": float("nan"), "quant_gbs": 1.0})


def test_the_cpu_attention_term_is_per_query_head_and_cached_token(info):
    h = hw()
    flat = planner.decode_seconds(info, h, n_gpu_layers=0, depth=0)
    deep = planner.decode_seconds(info, h, n_gpu_layers=0, depth=4096)
    assert deep - flat == pytest.approx(info.n_layer * info.n_head * 4096 * hardware.ATTN_CPU_S
                                        / min(h.cpu.cores_physical, info.n_head))
    one_thread = replace(h, cpu=replace(h.cpu, cores_physical=1))
    assert planner.cpu_attention_s(one_thread, info.n_head) == hardware.ATTN_CPU_S  # all on one thread
