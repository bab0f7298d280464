"""The decode probe: how fast this CPU's llama.cpp decodes, measured with llama.cpp itself.

The planner's fitted per-thread rates are one CPU's: on another (an Intel Xeon against the AMD EPYC they
were fitted on) the same f16 models decoded at 60% of the prediction, while the RAM probe read the same.
What decodes a token on a few cores is the cores' dequantize-and-dot rate, which only a decode shows. So
this writes small models with random weights (gguf), decodes a few tokens of each on the CPU with the
engine's own load path and thread count, and turns the times into the planner's terms:

- type_gbs: weight bytes per second through matrices of each weight type most GGUFs are made of (TYPES:
  F16, BF16, Q8_0, the K-quants Q6_K-Q3_K, Q5_0, Q4_0, IQ4_XS, MXFP4): a 2048-wide llama per type, as many
  layers as make it larger than the CPU's last cache (at least 600 MB), so that the weights come from
  RAM as a real model's do. Quantized blocks are random bytes with small scales, which llama.cpp
  multiplies exactly as it would a quantized model's (checked against llama.cpp's own quantizer: Q4_0
  7.5, Q5_0 6.4, Q4_K_M 13.6 GB/s, as the random blocks gave);
- float_gbs, quant_gbs: F16's and Q4_K's (what the planner uses for types not probed).

Attention is not probed: timed on a small model its cost per cached token was half what it is beside a
real model's weights (which push the cache out), and a model big enough to be real takes seconds per
thousand tokens of prompt to fill; the planner keeps its fitted hardware.ATTN_CPU_S.

Each time has the planner's fixed costs (hardware.cpu_fixed_s) taken out, so the figures plug straight
into planner.decode_seconds. Run as a module it prints one JSON line; it runs in its own process
(engine.link.decode_probe) and takes about 45 s on 2 cores. The models live in a temporary folder that is
removed however the probe ends.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ggufdesk.core import hardware, planner
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import read_gguf
from ggufdesk.core.settings import LoadSettings, default_threads


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    qtype: str  # a gguf.GGMLQuantizationType name
    n_vocab: int = 512
    tied: bool = False  # no output.weight: the output multiplies the token embedding


TYPES = hardware.DECODE_PROBE_TYPES
# where each probed type's block keeps its f16 scales (the other bytes may be anything); MXFP4's scale is
# one E8M0 byte (a power of two), set to 2^-7
SCALE_OFFSETS = {"Q8_0": (0,), "Q6_K": (208,), "Q5_K": (0, 2), "Q4_K": (0, 2), "Q3_K": (108,), "Q2_K": (80, 82),
                 "Q5_0": (0,), "Q4_1": (0, 2), "Q4_0": (0,), "IQ4_XS": (0,), "MXFP4": ()}
E8M0_OFFSETS = {"MXFP4": (0,)}
MIN_BYTES = 600 << 20
N_VOCAB = Shape.n_vocab
DECODE_TOKENS = 8  # after two warm-up tokens; one token's time varies by about 1% here


def last_cache_bytes() -> int:
    """The CPU's largest cache (Linux sysfs); 0 where it does not say."""
    best = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            txt = f.read_text().strip().upper()
            best = max(best, int(txt.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(txt[-1:], 0))
        except (OSError, ValueError):
            continue
    return best


def shape_for(qtype: str, min_bytes: int) -> Shape:
    """A 2048-wide llama in `qtype` with enough layers to hold min_bytes of weights."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    n_embd, n_ff, kv = 2048, 5632, 512
    per_layer = (2 * n_embd * n_embd + 2 * kv * n_embd + 3 * n_ff * n_embd) * size // block
    return Shape(n_embd, max(2, -(-min_bytes // per_layer)), 32, 8, n_ff, qtype)


def _f16(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Small random f16 values without drawing one float per weight: a random 1 MiB tile, repeated (the
    bytes are in distinct memory all the same, which is all the timing needs)."""
    n = int(np.prod(shape))
    tile = (rng.standard_normal(min(n, 1 << 19), dtype=np.float32) * 0.02).astype(np.float16)
    return np.resize(tile, n).reshape(shape)


def _quant(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Blocks of `qtype` (raw bytes, as gguf writes quantized data): random bytes with finite small
    scales, a random tile repeated."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    per_row = cols // block
    tile = rng.integers(0, 256, size=(min(rows * per_row, 4096), size), dtype=np.uint8)
    scale = np.frombuffer(np.array([1e-3], np.float16).tobytes(), np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        tile[:, off:off + 2] = scale
    for off in E8M0_OFFSETS.get(qtype, ()):
        tile[:, off] = 127 - 7
    return np.resize(tile, (rows * per_row, size)).reshape(rows, per_row * size)


def write_model(path: Path, s: Shape, seed: int = 0) -> Path:
    """A llama GGUF of shape `s` with random weights and a byte-level vocabulary of s.n_vocab tokens."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("ggufdesk-decode-probe")
    w.add_context_length(4096)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(s.n_embd // s.n_head)
    ft = gguf.LlamaFileType  # (llama.cpp's file type: only a label; MXFP4 has none in this gguf)
    names = ft.__members__
    w.add_file_type(names.get(f"MOSTLY_{s.qtype}") or names.get(f"MOSTLY_{s.qtype}_M") or ft.GUESSED)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581t{i}" for i in range(s.n_vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (len(tokens) - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    kv = s.n_embd // s.n_head * s.n_head_kv

    def matrix(name: str, rows: int, cols: int) -> None:
        if s.qtype == "F16":
            w.add_tensor(name, _f16((rows, cols), rng))
        elif s.qtype == "BF16":  # f16's values cut to bfloat16 (random bits would hold denormals and NaNs)
            bits = (_f16((rows, cols), rng).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(name, bits.view(np.uint8), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, _quant(s.qtype, rows, cols, rng), raw_dtype=gguf.GGMLQuantizationType[s.qtype])

    w.add_tensor("token_embd.weight", _f16((s.n_vocab, s.n_embd), rng))
    for i in range(s.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(s.n_embd, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(s.n_embd, np.float32))
        for name, rows, cols in (("attn_q", s.n_embd, s.n_embd), ("attn_k", kv, s.n_embd), ("attn_v", kv, s.n_embd),
                                 ("attn_output", s.n_embd, s.n_embd), ("ffn_gate", s.n_ff, s.n_embd),
                                 ("ffn_up", s.n_ff, s.n_embd), ("ffn_down", s.n_embd, s.n_ff)):
            matrix(p + name + ".weight", rows, cols)
    w.add_tensor("output_norm.weight", np.ones(s.n_embd, np.float32))
    if not s.tied:
        w.add_tensor("output.weight", _f16((s.n_vocab, s.n_embd), rng))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def token_seconds(path: Path, depth: int = 1, n_tokens: int = DECODE_TOKENS) -> float:
    """Median seconds per decoded token after a prompt of `depth` tokens, on the CPU, with the engine's
    load path and its default thread count (mmap off: the weights are read from RAM, as in a chat)."""
    import llama_cpp

    from ggufdesk.engine.runtime import native

    s = LoadSettings(n_ctx=depth + n_tokens + 256, n_gpu_layers=0, use_mmap=False)
    lm = native.load_model(str(path), s, native.LlamaLog(maxlen=200))
    try:
        ctx = lm.ctx.ctx
        prompt = [259 + i % (N_VOCAB - 259) for i in range(depth)]
        for i in range(0, depth, s.n_batch):
            chunk = prompt[i:i + s.n_batch]
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk))) != 0:
                raise KnownError("the decode probe's prompt did not decode")
        one = (llama_cpp.llama_token * 1)()
        times = []
        for i in range(n_tokens + 2):  # two warm-up tokens are not counted
            one[0] = 259 + i
            t = time.perf_counter()
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) != 0:
                raise KnownError("the decode probe's token did not decode")
            llama_cpp.llama_synchronize(ctx)  # (a no-op on a CPU; what a timed call waits for elsewhere)
            times.append(time.perf_counter() - t)
        return statistics.median(times[2:])
    finally:
        lm.close()


def gbs(t: float, info: Any, *, strict: bool = True) -> float:
    """Weight bytes per second of a token's time left after the planner's fixed costs. A token faster
    than those costs is an error for the probe's own models (too big for any cache: something is
    wrong); not `strict` (models small enough to sit in the CPU's cache, which say little about the
    machine: tests), its whole time is used instead."""
    left = t - hardware.cpu_fixed_s(planner.matmuls_per_token(info))
    if left <= 0:
        if strict:
            raise KnownError(f"the decode probe's token took {t * 1e3:.2f} ms, less than its fixed cost")
        left = t
    return round(planner.weight_bytes_per_token(info) / left / 1e9, 3)


def run(folder: Path | None = None, types: tuple[str, ...] = TYPES, min_bytes: int | None = None) -> dict[str, Any]:
    """Write each model in a temporary folder, time it, remove it; the rates and the times."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    start = time.perf_counter()
    size = min_bytes if min_bytes is not None else max(MIN_BYTES, 2 * last_cache_bytes())
    type_gbs: dict[str, float] = {}
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ggufdesk-probe-", dir=folder) as tmp:
        for qtype in types:  # one model on disk at a time
            path = write_model(Path(tmp) / f"{qtype}.gguf", shape_for(qtype, size))
            times[qtype] = token_seconds(path)
            type_gbs[qtype] = gbs(times[qtype], read_gguf(path), strict=min_bytes is None)
            path.unlink()
    return {"float_gbs": type_gbs.get("F16"), "quant_gbs": type_gbs.get("Q4_K"),
            "type_gbs": type_gbs, "times_ms": {k: round(v * 1e3, 3) for k, v in times.items()},
            "model_bytes": size, "threads": default_threads(), "build": llama_cpp.__version__,
            "took_s": round(time.perf_counter() - start, 2)}


def main(argv: list[str] | None = None) -> int:
    """`python -m ggufdesk.engine.runtime.decode_probe [FOLDER [MIN_BYTES]]`: one JSON line."""
    args = sys.argv[1:] if argv is None else argv
    try:
        folder = Path(args[0]) if args else None
        print(json.dumps(run(folder, min_bytes=int(args[1]) if len(args) > 1 else None)), flush=True)
    except (KnownError, OSError, ValueError) as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
