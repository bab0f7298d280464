"""Memory and speed model: what a model needs where, the GPU layers that fit, and the tok/s to expect.

Memory follows llama.cpp's own allocation (checked against its reported buffer sizes, bench/planner.py):
- weights: tensors of layer i live where layer i lives. With n_gpu_layers = k, llama.cpp puts the
  *output* layer and the last k-1 repeating layers on the GPU (k = n_layer + 1 is "all").
  token_embd always stays on the CPU; a tied output (no output.weight) is a copy of token_embd on
  the output's device.
- KV cache: per layer, cells x (n_head_kv x head_dim_k x size(type_k) + ... v), cells = n_ctx
  rounded up to 256. Sliding-window layers use the window (rounded up to 256, + n_ubatch) unless
  swa_full, which is llama.cpp's C default (the engine uses it).
- compute buffer: the largest of two graph stages, fitted to llama.cpp's reservations:
  layer stage = n_ubatch x 4 B x (4 n_embd + 3 n_ff) + masks (n_ubatch x n_ctx x 2 B each; with
  flash attention off the KQ scores n_ubatch x n_ctx x (4 n_head + 4) B replace the masks),
  output stage = min(n_ubatch, n_outputs) x n_vocab x 4 B + 2 x n_ubatch x n_embd x 4 B, where
  n_outputs is the engine's cap on logits rows per decode (N_OUTPUTS; llama.cpp's n_outputs_max).
- process overhead: 8 MiB + 176 B per vocabulary entry (llama.cpp's vocab tables), measured.
Speed: decode time per token = T0 + sum over tensors read (bytes / rate) + KV read, where on the CPU
rate = min(RAM bandwidth x efficiency, threads x per-thread dequantize rate);
prefill = 2 x params FLOPs per token / (compute x efficiency). Efficiencies were fitted on this project's
test machine (bench/planner.py) and are replaced by the machine's own figures once real runs are
recorded (hardware.record_decode_run; probe() reads them into HardwareInfo.calibration, and every
function here is pure: it reads no file).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import gguf

from ggufdesk.core import quants
from ggufdesk.core.errors import KnownError, SettingsError
from ggufdesk.core.gguf_meta import GGUFInfo, TensorInfo
from ggufdesk.core.hardware import ATTN_CPU_S, MATMUL_CPU_S, T0_CPU_S, Calibration, HardwareInfo
from ggufdesk.core.projector import ProjectorInfo
from ggufdesk.core.settings import LOGITS_ROWS

MiB = 1 << 20
GiB = 1 << 30
OVERHEAD_BASE = 8 * MiB
OVERHEAD_PER_VOCAB = 176
RAM_MARGIN = (1 * GiB, 0.10)  # keep at least this much RAM free: max(1 GiB, 10 % of total)
VRAM_MARGIN = (512 * MiB, 0.05)
CUDA_CONTEXT = 512 * MiB  # CUDA runtime + cuBLAS per GPU in use: 515 MiB measured on an H200 (bench/gpu.py)
# decode efficiencies (fraction of measured RAM read bandwidth llama.cpp reaches), fitted here
EFF_CPU_FLOAT, EFF_CPU_QUANT, EFF_GPU = 0.90, 0.62, 0.75
# ...unless the cores cannot keep up: weight bytes one decode thread gets through per second
# (dequantize + dot), measured with llama.cpp on a 2-core AVX2 EPYC (bench/planner.py): f16 layers
# ran at 33 GB/s on 2 threads and the Q4_K/Q8_0 starter at 21 GB/s, both below what RAM delivers.
PER_THREAD_FLOAT, PER_THREAD_QUANT = 16.5, 10.5  # GB/s
# The CPU's fixed cost per token: hardware.T0_CPU_S + MATMUL_CPU_S per weight matrix (see matmuls());
# its attention: hardware.ATTN_CPU_S per layer, query head and cached token (see _kv_seconds()).
# On a GPU the fixed cost is kernel launches, which grow with depth: 1.04 ms/token for a 16-layer
# 1.5 GB f16 model on an H200 of which 0.42 ms is reading weights (bench/gpu.py) -> ~0.1 + 0.033/layer.
T0_GPU_BASE, T0_GPU_LAYER = 0.1e-3, 0.033e-3
EFF_PREFILL_CPU, EFF_PREFILL_GPU = 1.0, 0.35
MIN_COMFORTABLE_TOK_S = 5.0
FLOAT_TYPES = {"F32", "F16", "BF16"}
FITS = ("full_gpu", "partial", "cpu", "too_large")
MAX_CTX = 1 << 24


def type_size(name: str) -> float:
    """Bytes per element of a ggml type name (KV cache types: 'f16', 'q8_0', ...)."""
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name.upper()]]
    except KeyError:
        raise SettingsError(f"unknown KV cache type {name!r}") from None
    return size / block


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """Bytes per kind and place; ram/vram sums include the process overhead and CUDA context."""

    weights_cpu: int = 0
    weights_gpu: int = 0
    kv_cpu: int = 0
    kv_gpu: int = 0
    compute_cpu: int = 0
    compute_gpu: int = 0
    output: int = 0
    overhead: int = 0
    cuda_context: int = 0
    projector_cpu: int = 0  # a vision projector's weights and encoder buffer (libmtmd's, not llama.cpp's buffers)
    projector_gpu: int = 0

    @property
    def ram(self) -> int:
        return self.weights_cpu + self.kv_cpu + self.compute_cpu + self.output + self.overhead + self.projector_cpu

    @property
    def vram(self) -> int:
        return self.weights_gpu + self.kv_gpu + self.compute_gpu + self.cuda_context + self.projector_gpu

    @property
    def buffers(self) -> int:
        """What llama.cpp reports as its model + KV + compute + output buffers."""
        return (self.weights_cpu + self.weights_gpu + self.kv_cpu + self.kv_gpu + self.compute_cpu
                + self.compute_gpu + self.output)

    def resident_ram(self, info: GGUFInfo, n_ubatch: int) -> int:
        """RSS after real use: the logits rows of the compute buffer are never touched by us."""
        untouched = max(0, self.compute_cpu - _layer_stage(info, n_ubatch, 0, 1, True))
        return self.ram - untouched

    def __add__(self, o: Memory) -> Memory:
        return Memory(**{k: getattr(self, k) + getattr(o, k) for k in Memory.__dataclass_fields__})


def _layer_stage(info: GGUFInfo, n_ubatch: int, n_kv: int, n_masks: int, flash: bool) -> int:
    width = max(info.n_embd, info.n_head * info.head_dim_k)
    ffn = n_ubatch * 4 * (4 * width + 3 * info.n_ff)
    if flash:
        return ffn + n_masks * n_ubatch * n_kv * 2
    attn = n_ubatch * n_kv * (4 * info.n_head + 4) + n_ubatch * 4 * 6 * width
    return max(ffn, attn)


N_OUTPUTS = LOGITS_ROWS  # the engine's cap on logits rows per decode (core/settings.py)


def compute_buffer(info: GGUFInfo, *, n_ctx: int, n_ubatch: int, flash: bool, with_output: bool = True,
                   n_outputs: int = N_OUTPUTS) -> int:
    n_kv = pad(n_ctx)
    n_masks = 2 if any(info.swa_layers) else 1
    layer = _layer_stage(info, n_ubatch, n_kv, n_masks, flash)
    rows = min(n_ubatch, n_outputs)
    out = rows * info.n_vocab * 4 + 2 * n_ubatch * info.n_embd * 4 if with_output else 0
    return max(layer, out)


def pad(n: int, to: int = 256) -> int:
    return -(-n // to) * to


def kv_cells(info: GGUFInfo, n_ctx: int, n_ubatch: int, swa_full: bool) -> list[int]:
    full = pad(n_ctx)
    swa = full if swa_full else pad(min(full, info.n_swa + n_ubatch))
    return [swa if s else full for s in info.swa_layers]


def kv_bytes_per_layer(info: GGUFInfo, n_ctx: int, *, type_k: str = "f16", type_v: str = "f16",
                       n_ubatch: int = 512, swa_full: bool = True) -> list[int]:
    tk, tv = type_size(type_k), type_size(type_v)
    cells = kv_cells(info, n_ctx, n_ubatch, swa_full)
    return [int(c * (info.n_head_kv[i] * info.head_dim_k * tk + info.n_head_kv[i] * info.head_dim_v * tv))
            for i, c in enumerate(cells)]


def _output_tensors(info: GGUFInfo) -> list[TensorInfo]:
    out = [t for t in info.tensors if t.layer is None and t.name != "token_embd.weight"]
    if info.tensor("output.weight") is None and (emb := info.tensor("token_embd.weight")) is not None:
        out.append(emb)  # tied output: llama.cpp duplicates token_embd onto the output's device
    return out


def memory(info: GGUFInfo, *, n_ctx: int, n_gpu_layers: int = 0, n_ubatch: int = 512,
           type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto",
           swa_full: bool = True, gpu: bool = False, n_cpu_moe: int = 0) -> Memory:
    """Memory of one loaded model, split between CPU and GPU as llama.cpp does it.

    n_cpu_moe: the routed-expert tensors of the first N layers stay on the CPU wherever their layer
    is (llama.cpp's --n-cpu-moe, a tensor buffer override)."""
    n_layer = info.n_layer
    ngl = 0 if not gpu else (n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1))
    first_gpu = n_layer + 1 - ngl  # layers >= first_gpu (and the output, if ngl >= 1) are on the GPU
    on_gpu = [i >= first_gpu for i in range(n_layer)]
    output_gpu = ngl >= 1
    w_cpu, w_gpu = _layer_weights(info, on_gpu, n_cpu_moe)
    o_cpu, o_gpu = _outer_weights(info, output_gpu)
    kv = kv_bytes_per_layer(info, n_ctx, type_k=type_k, type_v=type_v, n_ubatch=n_ubatch, swa_full=swa_full)
    cb = compute_buffer(info, n_ctx=n_ctx, n_ubatch=n_ubatch, flash=flash_attn != "off")
    any_cpu_layer = not all(on_gpu)
    compute_cpu = cb if (any_cpu_layer or not output_gpu) else 2 * n_ubatch * info.n_embd * 4
    return Memory(
        weights_cpu=w_cpu + o_cpu, weights_gpu=w_gpu + o_gpu,
        kv_cpu=sum(b for b, g in zip(kv, on_gpu) if not g), kv_gpu=sum(b for b, g in zip(kv, on_gpu) if g),
        compute_cpu=compute_cpu, compute_gpu=cb if ngl else 0, output=info.n_vocab * 4,
        overhead=OVERHEAD_BASE + OVERHEAD_PER_VOCAB * info.n_vocab,
        cuda_context=CUDA_CONTEXT if ngl else 0,
    )


def _layer_weights(info: GGUFInfo, on_gpu: list[bool], n_cpu_moe: int) -> tuple[int, int]:
    """(CPU, GPU) bytes of the repeating layers' tensors: each where its layer is, except the routed
    experts of the first n_cpu_moe layers, which stay on the CPU."""
    w_gpu = w_cpu = 0
    for t in info.tensors:
        if t.layer is None or not 0 <= t.layer < info.n_layer:
            continue
        if on_gpu[t.layer] and not (is_routed_expert(t) and t.layer < n_cpu_moe):
            w_gpu += t.n_bytes
        else:
            w_cpu += t.n_bytes
    return w_cpu, w_gpu


def _outer_weights(info: GGUFInfo, output_gpu: bool) -> tuple[int, int]:
    """(CPU, GPU) bytes of the tensors outside the layers: token_embd on the CPU, the output layer where
    it goes (a tied output on the CPU shares token_embd's buffer; on the GPU it is a copy)."""
    emb = info.tensor("token_embd.weight")
    cpu = emb.n_bytes if emb else 0
    gpu = 0
    for t in _output_tensors(info):
        if output_gpu:
            gpu += t.n_bytes
        elif t.name != "token_embd.weight":
            cpu += t.n_bytes
    return cpu, gpu


# --------------------------------------------------------------------------- speed


def is_routed_expert(t: TensorInfo) -> bool:
    """A routed-expert tensor (ffn_{gate,up,down,gate_up}_exps, ffn_*_chexps): a token reads only the
    experts its router picks. Shared experts (ffn_*_shexp) and the router (ffn_gate_inp) are read whole."""
    return "_exps" in t.name or "_chexps" in t.name


def is_shared_expert(t: TensorInfo) -> bool:
    return "_shexp" in t.name


def matmuls(t: TensorInfo, info: GGUFInfo) -> int:
    """Weight matrices one decoded token multiplies in tensor `t`: one per 2-D weight, one per active
    expert of a routed-expert tensor, none for norms, biases and the embedding lookup."""
    if len(t.shape) < 2 or t.name == "token_embd.weight":
        return 0
    if is_routed_expert(t) and info.n_expert_used:
        return info.n_expert_used
    return 1


def matmuls_per_token(info: GGUFInfo) -> int:
    """All of a model's weight matrix multiplications per decoded token (a tied output counts once)."""
    tied = info.tensor("output.weight") is None and info.tensor("token_embd.weight") is not None
    return sum(matmuls(t, info) for t in info.tensors) + int(tied)


def _read_bytes(t: TensorInfo, info: GGUFInfo) -> float:
    """Bytes of a tensor read per decoded token (MoE: only the active experts)."""
    if is_routed_expert(t) and info.n_expert and info.n_expert_used:
        return t.n_bytes * info.n_expert_used / info.n_expert
    return float(t.n_bytes)


@dataclass(frozen=True, slots=True)
class DecodeBytes:
    """Weight bytes a decoded token reads, by kind: dense tensors (attention, norms, router, dense FFN,
    the output), shared experts, and the routed experts it activates out of all of them."""

    dense: int
    shared: int
    routed_active: int
    routed_total: int

    @property
    def per_token(self) -> int:
        return self.dense + self.shared + self.routed_active


def decode_bytes(info: GGUFInfo) -> DecodeBytes:
    dense = shared = routed = active = 0.0
    for t in info.tensors:
        if t.name == "token_embd.weight":
            continue  # one row per token
        if is_routed_expert(t):
            routed += t.n_bytes
            active += _read_bytes(t, info)
        elif is_shared_expert(t):
            shared += t.n_bytes
        else:
            dense += t.n_bytes
    if info.tensor("output.weight") is None and (emb := info.tensor("token_embd.weight")):
        dense += emb.n_bytes  # a tied output reads the embedding matrix whole
    return DecodeBytes(int(dense), int(shared), int(active), int(routed))


def weight_bytes_per_token(info: GGUFInfo) -> int:
    """Weight bytes one decoded token reads (what a real run's speed is calibrated against)."""
    return decode_bytes(info).per_token


@dataclass(frozen=True)
class _Reader:
    """Seconds to read weight or cache bytes where they live: a calibrated bandwidth when this machine
    recorded runs, else the fitted efficiencies on its measured RAM (memory- or compute-bound)."""

    hw: HardwareInfo
    cal: Calibration

    def seconds(self, nbytes: float, on_gpu: bool, float_type: bool, ggml_type: str | None = None) -> float:
        if on_gpu:
            bw = max((g.bandwidth_gbs or 0.0) for g in self.hw.gpus) if self.hw.gpus else 0.0
            return nbytes / ((self.cal.gpu_gbs or (bw or 300.0) * EFF_GPU) * 1e9)
        return nbytes / (cpu_read_gbs(self.hw, float_type=float_type, calibration=self.cal, ggml_type=ggml_type) * 1e9)


def engine_threads(hw: HardwareInfo) -> int:
    """The threads the engine decodes on by default: the physical cores (a hybrid CPU's performance
    cores), no more than this process may use (core/settings.py `default_threads`)."""
    cores = hw.cpu.cores_performance or hw.cpu.cores_physical
    return max(1, min(cores, hw.cpu.cores_usable or cores))


def cpu_read_gbs(hw: HardwareInfo, *, float_type: bool = False, calibration: Calibration | None = None,
                 ggml_type: str | None = None) -> float:
    """GB of weights a CPU decode reads per second here: the engine's decode probe of this CPU when it
    ran (per weight type), else this machine's recorded runs, else the fitted efficiency on its measured
    RAM or its cores' rate, whichever is lower."""
    cal = hw.calibration if calibration is None else calibration
    if probed := _probed_gbs(cal, ggml_type, float_type):
        return probed
    if cal.cpu_gbs:
        return cal.cpu_gbs
    eff = EFF_CPU_FLOAT if float_type else EFF_CPU_QUANT
    per_thread = PER_THREAD_FLOAT if float_type else PER_THREAD_QUANT
    threads = engine_threads(hw)
    return max(min(hw.ram_bandwidth_gbs * eff, threads * per_thread), 1e-3)


def _probed_gbs(cal: Calibration, ggml_type: str | None, float_type: bool) -> float | None:
    """The decode probe's rate for a weight type: its own when probed; a float type: F16's; another
    quantized type: the probed one of its kernel family (K-quants, the legacy _0/_1 blocks, the IQ
    types) nearest to it in bits per weight (Q2_K: like Q3_K; Q4_1, Q5_1: like Q4_0 or Q5_0; IQ4_NL:
    like IQ4_XS), else the nearest of any family. The kernels of one family cost alike per byte; across
    families they differ by 2x here (Q4_K 14.6 GB/s, IQ4_XS 6.4, both 4.5 bits)."""
    types = dict(cal.cpu_type_gbs)
    if ggml_type in types:
        return types[ggml_type]
    if float_type or not types:
        return cal.cpu_float_gbs if float_type else cal.cpu_quant_gbs
    quant = {k: v for k, v in types.items() if k not in FLOAT_TYPES}
    if not quant or ggml_type is None:
        return cal.cpu_quant_gbs
    kin = {k: v for k, v in quant.items() if _family(k) == _family(ggml_type)} or quant
    return kin[min(kin, key=lambda k: abs(_bits(k) - _bits(ggml_type)))]


def _family(ggml_type: str) -> str:
    if ggml_type.startswith(("IQ", "TQ")):
        return "iq"
    return "k" if ggml_type.endswith("_K") else "legacy" if ggml_type[-2:] in ("_0", "_1") else ggml_type


def _bits(ggml_type: str) -> float:
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]]
    except KeyError:
        return 4.5  # a type this gguf does not know: read it like Q4_K
    return 8 * size / block


def cpu_attention_s(hw: HardwareInfo, n_head: int) -> float:
    """Seconds one layer's attention takes per query head and cached token on the CPU: ATTN_CPU_S of
    thread time split over the threads (heads are shared out between them, so no more threads than
    heads help)."""
    return ATTN_CPU_S / max(1, min(engine_threads(hw), n_head or 1))


def _gpu_layers(info: GGUFInfo, hw: HardwareInfo, n_gpu_layers: int) -> int:
    """How many of the n_layer + 1 (output) layers llama.cpp puts on the GPU."""
    if not hw.gpus or n_gpu_layers == 0:
        return 0
    return info.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, info.n_layer + 1)


def decode_seconds(info: GGUFInfo, hw: HardwareInfo, *, n_gpu_layers: int, depth: int = 0,
                   type_k: str = "f16", type_v: str = "f16", calibration: Calibration | None = None,
                   n_cpu_moe: int = 0) -> float:
    """Predicted seconds per decoded token with `depth` tokens already in the KV cache.

    `calibration` (default: the one probe() put into `hw`) replaces the fitted efficiencies;
    n_cpu_moe: the routed experts of the first N layers are read on the CPU (see memory())."""
    ngl = _gpu_layers(info, hw, n_gpu_layers)
    first_gpu = info.n_layer + 1 - ngl
    read = _Reader(hw, hw.calibration if calibration is None else calibration)
    all_gpu = ngl >= info.n_layer + 1 and not (n_cpu_moe and any(is_routed_expert(x) for x in info.tensors))
    # kernel launches; a calibrated GPU bandwidth comes from whole-token times, so they are inside it
    t = 0.0 if not ngl or (all_gpu and read.cal.gpu_gbs) else T0_GPU_BASE + T0_GPU_LAYER * (ngl - 1)
    t += T0_CPU_S if first_gpu > 0 else 0.0  # some layer (or the output) runs on the CPU
    for tt in info.tensors:
        if tt.name == "token_embd.weight":
            continue  # one row per token
        on_gpu = tt.layer >= first_gpu if tt.layer is not None else ngl >= 1
        on_gpu = on_gpu and not (tt.layer is not None and tt.layer < n_cpu_moe and is_routed_expert(tt))
        t += read.seconds(_read_bytes(tt, info), on_gpu, tt.ggml_type in FLOAT_TYPES, tt.ggml_type)
        t += 0.0 if on_gpu else MATMUL_CPU_S * matmuls(tt, info)
    if info.tensor("output.weight") is None and (emb := info.tensor("token_embd.weight")):
        t += read.seconds(emb.n_bytes, ngl >= 1, emb.ggml_type in FLOAT_TYPES, emb.ggml_type)
        t += 0.0 if ngl else MATMUL_CPU_S
    return t + _kv_seconds(info, read, depth, type_size(type_k), type_size(type_v), first_gpu)


def _kv_seconds(info: GGUFInfo, read: _Reader, depth: int, tk: float, tv: float, first_gpu: int) -> float:
    """Attention over `depth` cached tokens in every layer (a sliding-window layer: its window). On a GPU:
    reading their keys and values. On the CPU the attention's compute per query head and cached token,
    measured whole (reading the keys and values is inside it): the bytes alone predicted a tenth of it."""
    t = 0.0
    attn = cpu_attention_s(read.hw, info.n_head) * info.n_head if depth and first_gpu else 0.0
    for i in range(info.n_layer if depth else 0):
        d = min(depth, info.n_swa) if info.swa_layers[i] else depth
        if i < first_gpu:
            t += attn * d
        else:
            t += read.seconds(d * info.n_head_kv[i] * (info.head_dim_k * tk + info.head_dim_v * tv), True, True)
    return t


def layer_params(info: GGUFInfo) -> int:
    return sum(math.prod(t.shape) for t in info.tensors if t.layer is not None)


def prefill_tok_s(info: GGUFInfo, hw: HardwareInfo, *, n_gpu_layers: int, prompt: int = 512) -> float:
    """Predicted prompt-processing speed: 2 FLOPs per weight + attention over half the prompt."""
    attn = 4 * info.n_head * info.head_dim_k * (prompt / 2) * info.n_layer
    flops = 2 * layer_params(info) + attn
    if flops <= 0:
        raise KnownError(f"{info.source}: the model has no layer weights and no attention; nothing to plan")
    cpu = hw.cpu_gflops * 1e9 * EFF_PREFILL_CPU
    if hw.gpus and n_gpu_layers != 0:
        g = max(hw.gpus, key=lambda g: g.vram_total)
        mult = 8 if (g.compute_capability or "0") >= "8" else 4 if (g.compute_capability or "0") >= "7" else 1
        gflops = (g.cuda_cores or 0) * (g.sm_clock_mhz or 0) * 2 * mult / 1e3
        if not gflops:
            gflops = (g.bandwidth_gbs or 300.0) * 100  # arithmetic intensity ~100 FLOP/byte
        frac = 1.0 if n_gpu_layers < 0 else min(n_gpu_layers, info.n_layer) / info.n_layer
        per_tok = flops * frac / (gflops * 1e9 * EFF_PREFILL_GPU) + flops * (1 - frac) / cpu
        return 1.0 / per_tok
    return cpu / flops


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: str
    quant: str | None
    n_ctx: int
    fit: str
    n_gpu_layers: int
    memory: Memory
    draft_memory: Memory | None
    ram_bytes: int
    ram_resident_bytes: int
    vram_bytes: int
    ram_budget: int
    vram_budget: int
    pred_decode_tok_s: float
    pred_decode_tok_s_full: float  # with the whole context filled
    pred_prefill_tok_s: float
    explanation: str
    advice: list[str] = field(default_factory=list)
    # a mixture of experts too big for VRAM: every layer on the GPU but the routed experts of the
    # first n_cpu_moe layers in RAM (llama.cpp's --n-cpu-moe); 0 = whole layers are split as usual
    n_cpu_moe: int = 0
    layer_split_decode_tok_s: float | None = None  # what the whole-layer split would have given
    # a vision model's projector (core/projector.py): its weights and encoder buffer (on the GPU with
    # any GPU layers, as libmtmd puts it), and the tokens one image takes in the context
    projector_bytes: int = 0
    image_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        m = self.memory
        d = {k: v for k, v in asdict(self).items() if k not in ("memory", "draft_memory")}
        d.update(weights_bytes=m.weights_cpu + m.weights_gpu, kv_bytes=m.kv_cpu + m.kv_gpu,
                 compute_bytes=m.compute_cpu + m.compute_gpu, breakdown=asdict(m),
                 draft_breakdown=asdict(self.draft_memory) if self.draft_memory else None)
        for k in ("pred_decode_tok_s", "pred_decode_tok_s_full", "pred_prefill_tok_s"):
            d[k] = round(d[k], 1)
        return d


def budgets(hw: HardwareInfo) -> tuple[int, int]:
    ram = hw.ram_available - max(RAM_MARGIN[0], int(hw.ram_total * RAM_MARGIN[1]))
    vram = sum(g.vram_free - max(VRAM_MARGIN[0], int(g.vram_total * VRAM_MARGIN[1])) for g in hw.gpus)
    return max(ram, 0), max(vram, 0)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GB" if n >= GiB else f"{n / MiB:.0f} MB"


def plan(info: GGUFInfo, hw: HardwareInfo, *, n_ctx: int = 4096, draft: GGUFInfo | None = None,
         type_k: str = "f16", type_v: str = "f16", n_gpu_layers: int | None = None,
         n_ubatch: int = 512, flash_attn: str = "auto", swa_full: bool = True,
         n_cpu_moe: int | None = None, smaller_quants: tuple[str, ...] = (),
         projector: ProjectorInfo | None = None) -> Plan:
    """Where the model goes on this machine and how fast it will run.

    A mixture of experts that does not fit VRAM whole gets the split that keeps attention, shared
    experts and the output on the GPU and as many routed experts as needed in RAM, when that is
    predicted faster than splitting whole layers (n_cpu_moe None: chosen here; a number: as given).
    `smaller_quants`: the smaller files of this model that exist (the advice names them; none: it
    names none)."""
    _check_request(info, draft, n_ctx=n_ctx, n_ubatch=n_ubatch, n_gpu_layers=n_gpu_layers, type_k=type_k,
                   type_v=type_v, flash_attn=flash_attn)
    ram_budget, vram_budget = budgets(hw)
    has_gpu = bool(hw.gpus)
    kw: dict[str, Any] = dict(n_ctx=n_ctx, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
              swa_full=swa_full, gpu=has_gpu)

    proj_bytes = projector.memory_bytes(flash_attn != "off") if projector is not None else 0

    def total(ngl: int, ncm: int = 0) -> tuple[Memory, Memory | None]:
        m = memory(info, n_gpu_layers=ngl, n_cpu_moe=ncm, **kw)
        if proj_bytes:  # libmtmd puts it on the GPU when the model uses one
            m = replace(m, projector_gpu=proj_bytes) if has_gpu and ngl else replace(m, projector_cpu=proj_bytes)
        if draft is None:
            return m, None
        full = ngl < 0 or ngl >= info.n_layer + 1
        dm = memory(draft, n_gpu_layers=-1 if (has_gpu and full) else 0, **kw)
        if dm.cuda_context and m.cuda_context:
            dm = replace(dm, cuda_context=0)
        return m, dm

    def fits(ngl: int, ncm: int = 0) -> bool:
        m, dm = total(ngl, ncm)
        s = m + dm if dm else m
        return s.ram <= ram_budget and s.vram <= vram_budget

    def speed(ngl: int, ncm: int = 0, depth: int = 0) -> float:
        return 1 / decode_seconds(info, hw, n_gpu_layers=ngl, depth=depth, type_k=type_k, type_v=type_v,
                                  n_cpu_moe=ncm)

    top = info.n_layer + 1
    ngl, ncm, layer_speed = _placement(info, has_gpu, n_gpu_layers, n_cpu_moe, fits, speed)
    fit = _fit(fits(ngl, ncm), has_gpu and ngl >= top and not ncm, ngl)
    m, dm = total(ngl, ncm)
    s = m + dm if dm else m
    dec, dec_full = speed(ngl, ncm), speed(ngl, ncm, depth=n_ctx)
    pre = prefill_tok_s(info, hw, n_gpu_layers=ngl)
    quant = info.file_type or quants.quant_from_name(info.source)
    _check_figures(info, s, dec, dec_full, pre)
    p = Plan(model=info.source, quant=quant, n_ctx=n_ctx, fit=fit, n_gpu_layers=ngl, memory=m,
             draft_memory=dm, ram_bytes=s.ram, ram_resident_bytes=s.resident_ram(info, n_ubatch),
             vram_bytes=s.vram, ram_budget=ram_budget, vram_budget=vram_budget,
             pred_decode_tok_s=dec, pred_decode_tok_s_full=dec_full, pred_prefill_tok_s=pre,
             explanation="", n_cpu_moe=ncm, layer_split_decode_tok_s=layer_speed, projector_bytes=proj_bytes,
             image_tokens=projector.image_tokens if projector is not None else 0)
    return replace(p, explanation=explain(p, hw),
                   advice=advise(p, info, hw, type_k=type_k, smaller_quants=smaller_quants))


def _placement(info: GGUFInfo, has_gpu: bool, n_gpu_layers: int | None, n_cpu_moe: int | None,
               fits: Callable[..., bool], speed: Callable[..., float]) -> tuple[int, int, float | None]:
    """(GPU layers, layers with experts on the CPU, the layer split's decode speed when the experts
    split won): as asked, or the most layers that fit, then the experts split when it is faster."""
    top = info.n_layer + 1
    if n_gpu_layers is not None:
        ngl = top if n_gpu_layers < 0 else min(n_gpu_layers, top)
        ngl = ngl if has_gpu else 0
    else:
        ngl = next((k for k in range(top if has_gpu else 0, -1, -1) if fits(k, n_cpu_moe or 0)), 0)
    ncm, layer_speed = n_cpu_moe or 0, None
    if n_cpu_moe is None and n_gpu_layers is None and has_gpu and ngl < top:
        split = experts_split(info, lambda k: fits(top, k))
        if split is not None and (not fits(ngl) or speed(top, split) > speed(ngl)):
            ncm, layer_speed, ngl = split, speed(ngl), top
    return ngl, ncm, layer_speed


def _check_request(info: GGUFInfo, draft: GGUFInfo | None, *, n_ctx: int, n_ubatch: int,
                   n_gpu_layers: int | None, type_k: str, type_v: str, flash_attn: str) -> None:
    """plan()'s arguments, refused with a SettingsError (or the file's KnownError) before any figure."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not 16 <= n_ctx <= MAX_CTX:
        raise SettingsError(f"context length must be a whole number from 16 to {MAX_CTX}, got {n_ctx!r}")
    if isinstance(n_ubatch, bool) or not isinstance(n_ubatch, int) or not 1 <= n_ubatch <= 1 << 16:
        raise SettingsError(f"micro-batch size must be from 1 to 65536, got {n_ubatch!r}")
    if n_gpu_layers is not None and n_gpu_layers < -1:
        raise SettingsError(f"GPU layers must be -1 (all) or more, got {n_gpu_layers}")
    check_info(info)
    if draft is not None:
        check_info(draft)
    type_size(type_k), type_size(type_v)
    if type_v != "f16" and type_v != "f32" and flash_attn == "off":
        raise SettingsError("a quantized V cache needs flash attention; set flash attention to auto or on")


def _fit(fits: bool, all_on_gpu: bool, n_gpu_layers: int) -> str:
    if not fits:
        return "too_large"
    return "full_gpu" if all_on_gpu else "partial" if n_gpu_layers > 0 else "cpu"


def experts_split(info: GGUFInfo, fits: Callable[[int], bool]) -> int | None:
    """The fewest first layers whose routed experts must stay in RAM for the rest to fit the GPU
    (`fits(n)`: does the model fit with n?); None for a dense model or when even all do not fit."""
    if not any(t.layer is not None and is_routed_expert(t) for t in info.tensors):
        return None
    lo, hi = 1, info.n_layer  # fits() only grows with n: the first n that fits, by bisection
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def check_info(info: GGUFInfo) -> None:
    """Every number the memory and speed model uses is a whole number in range and consistent.

    gguf_meta checks what it reads from a file; this also covers infos built or scaled elsewhere.
    """
    def bad(what: str) -> KnownError:
        return KnownError(f"{info.source}: {what}; the model's metadata is inconsistent, cannot plan it")

    counts = {"n_layer": info.n_layer, "n_embd": info.n_embd, "n_ff": info.n_ff, "n_head": info.n_head,
              "head_dim_k": info.head_dim_k, "head_dim_v": info.head_dim_v, "n_swa": info.n_swa,
              "n_vocab": info.n_vocab, "n_expert": info.n_expert, "n_expert_used": info.n_expert_used}
    for k, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 1 << 31:
            raise bad(f"{k} = {v!r} is not a whole number from 0 to 2^31")
    if info.n_layer < 1:
        raise bad("the model has no layers")
    if len(info.n_head_kv) != info.n_layer or len(info.swa_layers) != info.n_layer:
        raise bad("the per-layer head and window lists do not match the layer count")
    if any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= 1 << 16 for h in info.n_head_kv):
        raise bad("a KV head count is negative or absurd")
    for t in info.tensors:
        if t.n_bytes < 0 or any(d <= 0 for d in t.shape):
            raise bad(f"tensor {t.name!r} has a negative size or a zero or negative dimension")


def _check_figures(info: GGUFInfo, m: Memory, *speeds: float) -> None:
    for v in (m.ram, m.vram, *speeds):
        if not math.isfinite(v) or v < 0:
            raise KnownError(f"{info.source}: the plan came out as {v!r}; the model's metadata is inconsistent")


def explain(p: Plan, hw: HardwareInfo) -> str:
    q = p.quant or "This model"
    ctx = f"{p.n_ctx // 1024}k context" if p.n_ctx >= 1024 else f"{p.n_ctx} tokens of context"
    speed = f"expect ~{p.pred_decode_tok_s:.0f} tok/s"
    if p.fit == "full_gpu":
        gpu = max(hw.gpus, key=lambda g: g.vram_total)
        return f"{q} fits fully on your {gpu.vram_total / GiB:.0f} GB GPU with {ctx}; {speed}."
    if p.fit == "partial" and p.n_cpu_moe:
        return (f"{q} runs with experts on the CPU: every layer on the GPU but the experts of "
                f"{p.n_cpu_moe} layers in RAM ({_gib(p.ram_bytes)}) with {ctx}; {speed}"
                + (f" (whole layers split: ~{p.layer_split_decode_tok_s:.1f} tok/s)."
                   if p.layer_split_decode_tok_s else "."))
    if p.fit == "partial":
        return (f"{q} fits with {p.n_gpu_layers} layers on the GPU and the rest in RAM "
                f"({_gib(p.ram_bytes)}) with {ctx}; {speed}.")
    if p.fit == "cpu":
        return f"{q} runs on the CPU in {_gib(p.ram_bytes)} of RAM with {ctx}; {speed}."
    need = _gib(p.ram_bytes + p.vram_bytes)
    have = _gib(p.ram_budget + p.vram_budget)
    return f"{q} does not fit: it needs {need} with {ctx} and this machine has {have} to spare."


def _smaller(quants_: tuple[str, ...]) -> str:
    """'a smaller quant (Q3_K_M, Q2_K)' when this model has smaller files; else 'a smaller model'."""
    return f"a smaller quant ({', '.join(quants_[:3])})" if quants_ else "a smaller model"


def advise(p: Plan, info: GGUFInfo, hw: HardwareInfo, *, type_k: str = "f16",
           smaller_quants: tuple[str, ...] = ()) -> list[str]:
    """Tips for this plan; a smaller quant is named only when one exists (`smaller_quants`)."""
    out = []
    m = p.memory
    kv = m.kv_cpu + m.kv_gpu
    small = compute_buffer(info, n_ctx=256, n_ubatch=512, flash=True)
    ctx_part = kv + max(0, m.compute_cpu - small) + max(0, m.compute_gpu - small)
    if p.fit in ("too_large", "partial") and ctx_part > 0.25 * (m.ram + m.vram):
        tip = "a q8_0 KV cache (with flash attention) halves the cache with almost no quality loss, or " \
            if type_k == "f16" else ""
        out.append(f"The context takes {_gib(ctx_part)}: {tip}use a shorter context.")
    if p.fit == "too_large":
        out.append(f"Pick {_smaller(smaller_quants)}" + (" or a smaller model." if smaller_quants else "."))
    if p.pred_decode_tok_s < MIN_COMFORTABLE_TOK_S:
        out.append(f"About {p.pred_decode_tok_s:.1f} tok/s is slower than reading speed; "
                   f"{_smaller(smaller_quants)} reads fewer bytes per token and is faster.")
    if info.context_length and p.n_ctx > info.context_length:
        out.append(f"The model was trained for {info.context_length} tokens of context; beyond that "
                   "quality drops.")
    return out


# --------------------------------------------------------------------------- quant ranking


def scaled(info: GGUFInfo, file_bytes: int, source: str, quant: str | None) -> GGUFInfo:
    """Another quant of the same model, estimated by scaling the known file's tensor sizes; the matrices
    in the known file's main weight type take the quant's (a CPU decodes each type at its own rate:
    decode_seconds reads them at the decode probe's rate for that type)."""
    ratio = file_bytes / info.file_bytes if info.file_bytes else 1.0
    old, new = _main_type(info), quants.main_type(quant)
    ts = tuple(replace(t, n_bytes=int(t.n_bytes * ratio),
                       ggml_type=new if new and t.ggml_type == old and len(t.shape) >= 2 else t.ggml_type)
               for t in info.tensors)
    return replace(info, source=source, tensors=ts, file_bytes=file_bytes, file_type=quant)


def _main_type(info: GGUFInfo) -> str | None:
    """The weight type holding most of a model's bytes."""
    by: dict[str, int] = {}
    for t in info.tensors:
        by[t.ggml_type] = by.get(t.ggml_type, 0) + t.n_bytes
    return max(by, key=lambda k: by[k]) if by else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    file: str
    quant: str | None
    size: int
    ppl_delta: float
    plan: Plan
    recommended: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "quant": self.quant, "size": self.size, "ppl_delta": self.ppl_delta,
                "quality": quants.describe(self.quant), "recommended": self.recommended,
                **{k: v for k, v in self.plan.to_json().items()
                   if k in ("fit", "n_gpu_layers", "n_cpu_moe", "ram_bytes", "vram_bytes", "pred_decode_tok_s",
                            "pred_prefill_tok_s", "explanation")}}


def rank_quants(files: list[tuple[str, int]], ref: GGUFInfo, hw: HardwareInfo, *, n_ctx: int = 4096,
                min_tok_s: float = MIN_COMFORTABLE_TOK_S, workload: str = "chat") -> list[Ranked]:
    """Best first: fits, then comfortable speed, then quality (lowest perplexity delta), then speed.

    workload "long_docs" prefers prefill speed among near-equal quality, "chat" decode speed.
    """
    out = []
    files = [(name, size) for name, size in files if size > 0]  # an empty file is not a model
    for name, size in files:
        q = quants.quant_from_name(name)
        info = ref if size == ref.file_bytes else scaled(ref, size, name, q)
        smaller = tuple(quants.quant_from_name(n) or n for n, s in sorted(files, key=lambda f: -f[1])
                        if s < size)
        out.append(Ranked(file=name, quant=q, size=size, ppl_delta=quants.quality_loss(q),
                          plan=plan(info, hw, n_ctx=n_ctx, smaller_quants=smaller)))
    order = {f: i for i, f in enumerate(FITS)}
    speed: Callable[[Ranked], float] = (
        (lambda r: r.plan.pred_prefill_tok_s) if workload == "long_docs" else (lambda r: r.plan.pred_decode_tok_s))

    def key(r: Ranked) -> tuple[Any, ...]:
        ok = r.plan.fit != "too_large"
        fast = r.plan.pred_decode_tok_s >= min_tok_s
        fits_gpu = order[r.plan.fit] if hw.gpus else 0
        return (not ok, not fast, fits_gpu, round(r.ppl_delta, 2), -speed(r))

    out.sort(key=key)
    if out and out[0].plan.fit != "too_large":
        out[0] = replace(out[0], recommended=True)
    return out
