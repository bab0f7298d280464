"""Planner accuracy: predicted vs measured RAM (llama.cpp's buffers and the process's RSS) and decode tok/s.

Run: .venv/bin/python bench/planner.py [--quick]
     .venv/bin/python bench/planner.py --moe [--small | --held-out] [--rounds N]   (issue 27: MoE decode)
Each case loads the model in a fresh subprocess (mmap off, the engine's own load path), reads
llama.cpp's reported buffer sizes, the RSS growth after a prefill + decode, and the decode speed.

--moe writes two synthetic models with random f16 weights (tests/fixtures/moe.py): a mixture of
experts with shared experts (qwen2moe: 16 layers, 64 experts, 4 used, ~1.6 GB) and a dense llama of
about the same size, remeasures the RAM bandwidth first (a figure cached while the machine was busy
makes every prediction low by the same factor), and checks decode predictions within 15% for both;
it also prints the efficiency that would make each exact. --small: tiny versions, to check it runs.
--held-out: another pair (a qwen3moe without shared experts, 24 layers, 32 experts, 8 used; a 24-layer
dense llama) on which no planner constant was fitted: the check that the per-matmul cost generalises.
--moe --calibrated: both pairs predicted after the starter was measured in the same round, as the
product predicts once a user has run a model (hardware.record_decode_run): the recorded bandwidth, and
for comparison the formula scaled by the starter's measured / predicted speed and a small f16 reference's
run. --moe --calibrated --quantized: the common case instead, two dense shapes quantized to Q4_K_M.
--probe [--rounds N]: all of those models, a second held-out set and the two real models, predicted after
the engine's decode probe of this CPU (what the product predicts once the wizard or `ggufdesk probe
--decode` ran it), the probe rerun in every round; and a third held-out set (held_out_3_models).
--probe --only PREFIX: just the models whose label starts with PREFIX (e.g. "held-out-3").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def worker(path: str, n_ctx: int, n_ubatch: int, prompt_len: int, n_decode: int, flash: str) -> dict:
    """Load, prefill prompt_len tokens, decode n_decode tokens; report memory and speed.

    Each decode step feeds the next token of a random sequence (as a text's tokens differ), and still
    computes the greedy pick from the logits. Until 2026-12-03 it fed the greedy pick back; on random
    weights that repeats one token for good (48 of 48 the same on a 32-expert mixture), so a mixture
    of experts routed every token to the same experts and read them from the CPU's cache: its speed
    was flattered (the dense models read every weight per token either way)."""

    import llama_cpp
    import numpy as np

    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.runtime import native

    llama_cpp.llama_backend_init()
    log = native.LlamaLog(maxlen=100000)
    r0 = rss()
    s = LoadSettings(n_ctx=n_ctx, n_batch=max(512, n_ubatch), n_ubatch=n_ubatch, use_mmap=False,
                     n_threads=2, n_threads_batch=2, flash_attn=flash)
    # the engine's own load path (use_mmap=False maps to llama.cpp's load_mode NONE)
    lm = native.load_model(path, s, log)
    r_load = rss()
    ctx = lm.ctx.ctx
    n_vocab = lm.n_vocab
    rng = np.random.default_rng(0)
    toks = rng.integers(10, min(n_vocab, 250), size=prompt_len).astype(np.int32)
    t0 = time.perf_counter()
    for i in range(0, prompt_len, s.n_batch):
        chunk = toks[i:i + s.n_batch]
        arr = (llama_cpp.llama_token * len(chunk))(*chunk.tolist())
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
        assert rc == 0, rc
    t_prefill = time.perf_counter() - t0
    feed = rng.integers(10, min(n_vocab, 250), size=n_decode).tolist()
    one = (llama_cpp.llama_token * 1)()
    times = []
    for i in range(n_decode):
        one[0] = feed[i]
        t = time.perf_counter()
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        int(np.argmax(logits))  # a sampler's pass over the logits, as a real decode makes
        times.append(time.perf_counter() - t)
        assert rc == 0, rc
    r_end = rss()
    times.sort()
    med = times[len(times) // 2]
    lines = log.since(0)
    flash_on = any("flash_attn" in ln and "enabled" in ln for ln in lines)
    return {"memory": lm.memory, "rss_load": r_load - r0, "rss_end": r_end - r0,
            "prefill_tok_s": prompt_len / t_prefill, "decode_tok_s": 1 / med, "flash_on": flash_on,
            "log_tail": [ln for ln in lines if "buffer size" in ln or "cells" in ln]}


CASES_CTX = (1024, 4096, 16384)
PROMPT, DECODE = 512, 48


def models(tmp: Path) -> list[tuple[str, Path]]:
    from ggufdesk.core.starter import starter_model_path
    from tests.fixtures.ggufs import TinySpec, write_tiny_llama

    out = [("gemma3-270m Q4_K_M", starter_model_path())]
    out.append(("tiny 512x8 f16", write_tiny_llama(tmp / "t512.gguf", TinySpec(
        n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1536, dtype="f16", n_ctx_train=32768, seed=3))))
    out.append(("tiny 1024x8 f16", write_tiny_llama(tmp / "t1024.gguf", TinySpec(
        n_embd=1024, n_layer=8, n_head=16, n_head_kv=4, n_ff=2816, dtype="f16", n_ctx_train=32768, seed=4))))
    return out


def moe_models(tmp: Path, small: bool, held_out: bool = False) -> list[tuple[str, Path]]:
    from tests.fixtures.ggufs import TinySpec, write_tiny_llama
    from tests.fixtures.moe import MoeSpec, write_moe

    if small:
        moe = MoeSpec(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=2,
                      n_ff_exp=256, n_ff_shexp=256)
        dense = TinySpec(n_embd=512, n_layer=4, n_head=8, n_head_kv=4, n_ff=1536, dtype="f16", n_ctx_train=8192)
    elif held_out:  # chosen before the per-matmul cost was fitted on the pair below, and never fitted on:
        # a qwen3moe without shared experts, more layers, twice the experts per token; a deeper, narrower dense
        moe = MoeSpec(n_layer=24, n_embd=768, n_head=12, n_head_kv=4, head_dim=64, n_expert=32, n_expert_used=8,
                      n_ff_exp=384, n_ff_shexp=0)
        dense = TinySpec(n_embd=1536, n_layer=24, n_head=12, n_head_kv=4, n_ff=4096, dtype="f16", n_ctx_train=8192)
    else:  # the issue's shapes: ~1.6 GB each
        moe = MoeSpec(n_layer=16, n_embd=1024, n_head=16, n_head_kv=4, head_dim=64, n_expert=64, n_expert_used=4,
                      n_ff_exp=256, n_ff_shexp=512)
        dense = TinySpec(n_embd=2048, n_layer=16, n_head=16, n_head_kv=4, n_ff=5632, dtype="f16", n_ctx_train=8192)
    shared = "+shared" if moe.n_ff_shexp else ""
    return [(f"moe {moe.n_expert}x{moe.n_expert_used}{shared} f16", write_moe(tmp / "moe.gguf", moe)),
            (f"dense {dense.n_embd}x{dense.n_layer} f16", write_tiny_llama(tmp / "dense.gguf", dense))]


def moe_main(small: bool, held_out: bool = False, rounds: int = 1) -> int:
    """Decode predicted vs measured for a mixture of experts and a dense model of the same size; with
    rounds > 1 the two are measured in turn (the order alternating), every run printed, the median
    measured speed compared."""
    import statistics

    from ggufdesk.core import hardware, planner
    from ggufdesk.core.gguf_meta import read_gguf

    wait_quiet()
    hw = hardware.probe(remeasure=True)
    print(f"machine: {hw.cpu.name}, {hw.cpu.cores_physical} cores, RAM read {hw.ram_bandwidth_gbs} GB/s "
          f"(best measured here; recorded runs, not used here: {hw.calibration}); 2 threads, mmap off")
    print(f"{'model':30s} {'GB':>5s} {'GB/token':>9s} | {'decode tok/s pred/meas':>22s} {'ratio':>6s} | "
          f"{'effective GB/s':>14s} {'efficiency':>10s}")
    worst = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        models = moe_models(Path(tmp), small, held_out)
        runs: dict[str, list[float]] = {label: [] for label, _ in models}
        for rnd in range(rounds):
            for label, path in models[::-1] if rnd % 2 else models:
                info = read_gguf(path)
                load = wait_quiet()
                m = measure(path, 2048)
                runs[label].append(m["decode_tok_s"])
                per_token = planner.decode_bytes(info).per_token
                # the formula alone: runs recorded on this machine (perhaps while it was busy) left out
                pred = 1 / planner.decode_seconds(info, hw, n_gpu_layers=0, depth=PROMPT + DECODE // 2,
                                                  calibration=hardware.Calibration())
                eff_gbs = per_token * m["decode_tok_s"] / 1e9
                print(f"{label:30s} {info.weight_bytes / 1e9:5.2f} {per_token / 1e9:9.3f} | {pred:10.1f} /"
                      f"{m['decode_tok_s']:9.1f} {pred / m['decode_tok_s']:6.3f} | {eff_gbs:14.1f} "
                      f"{eff_gbs / hw.ram_bandwidth_gbs:10.2f}  load {load:.1f}  round {rnd + 1}", flush=True)
                if rnd == rounds - 1:
                    r = pred / statistics.median(runs[label])
                    worst = r if abs(r - 1) > abs(worst - 1) else worst
                    if rounds > 1:
                        print(f"{label:30s} median of {rounds}: {statistics.median(runs[label]):.1f} tok/s, "
                              f"predicted / median {r:.3f}")
    print(f"worst decode ratio {worst:.3f} (target 0.85-1.15); the 'efficiency' column is the EFF_CPU_FLOAT "
          "that would make a run exact (planner.py, now 0.90)")
    ok = abs(worst - 1) <= 0.15
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


def calibrated(info: Any, best_tok_s: float) -> Any:
    """The calibration a recorded run of `info` at best_tok_s gives (what hardware.record_decode_run's
    run becomes), without writing this machine's calibration file."""
    from ggufdesk.core import hardware, planner

    run = {"where": "cpu", "bytes_per_token": planner.weight_bytes_per_token(info), "tok_s": best_tok_s,
           "matmuls": planner.matmuls_per_token(info)}
    return hardware.Calibration(cpu_gbs=hardware.run_gbs(run))


def calibrated_main(rounds: int) -> int:
    """Issue 27's decode predictions as the product makes them after one real run: the starter (the
    model the wizard offers first) is measured in each round beside both pairs, and each pair's models
    are predicted four ways: the formula alone; the bandwidth the starter's run gives (what the product
    predicts once it recorded that run: hardware.calibration()); the formula scaled by the starter's
    measured / predicted speed (the formula tells float weights from quantized ones, which one bandwidth
    cannot); and the bandwidth of a small f16 reference's run (a calibration by weight class). Each uses
    its model's best run so far, as the product keeps the best run. Exit 0 when the product's is within 15%."""
    import statistics

    from ggufdesk.core import hardware, planner
    from ggufdesk.core.gguf_meta import read_gguf
    from ggufdesk.core.starter import starter_model_path
    from tests.fixtures.ggufs import TinySpec, write_tiny_llama

    wait_quiet()
    hw = hardware.probe(remeasure=True)
    none = hardware.Calibration()
    depth = PROMPT + DECODE // 2
    print(f"machine: {hw.cpu.name}, {hw.cpu.cores_physical} cores, RAM read {hw.ram_bandwidth_gbs} GB/s; "
          "2 threads, mmap off; calibration: the starter's best run so far")
    with tempfile.TemporaryDirectory() as tmp:
        for sub in ("t", "h"):
            (Path(tmp) / sub).mkdir()
        pairs = moe_models(Path(tmp) / "t", False) + moe_models(Path(tmp) / "h", False, True)
        labels = ["tuned " + lb for lb, _ in pairs[:2]] + ["held-out " + lb for lb, _ in pairs[2:]]
        models = list(zip(labels, [p for _, p in pairs], strict=True))
        infos = {lb: read_gguf(p) for lb, p in models}
        formula = {lb: 1 / planner.decode_seconds(i, hw, n_gpu_layers=0, depth=depth, calibration=none)
                   for lb, i in infos.items()}
        # a small f16 reference in neither pair: what a per-class calibration (a float model's own run) gives
        ref_path = write_tiny_llama(Path(tmp) / "ref.gguf", TinySpec(
            n_embd=1024, n_layer=12, n_head=16, n_head_kv=4, n_ff=2816, dtype="f16", n_ctx_train=8192, seed=5))
        ref_info = read_gguf(ref_path)
        ref_runs: list[float] = []
        st_info = read_gguf(starter_model_path())
        st_formula = 1 / planner.decode_seconds(st_info, hw, n_gpu_layers=0, depth=depth, calibration=none)
        st_runs: list[float] = []
        meas: dict[str, list[float]] = {lb: [] for lb in labels}
        preds: dict[str, dict[str, list[float]]] = {lb: {"bandwidth": [], "factor": [], "f16 ref": []}
                                                     for lb in labels}
        for rnd in range(rounds):
            wait_quiet()
            st = measure(starter_model_path(), 2048)["decode_tok_s"]
            st_runs.append(st)
            best = max(st_runs)
            cal = calibrated(st_info, best)
            ref_runs.append(measure(ref_path, 2048)["decode_tok_s"])
            ref_cal = calibrated(ref_info, max(ref_runs))
            print(f"round {rnd + 1}: starter {st:.1f} tok/s (formula {st_formula:.1f}); best {best:.1f}: "
                  f"{cal.cpu_gbs:.1f} GB/s, speed factor {best / st_formula:.3f}; f16 reference "
                  f"{ref_runs[-1]:.1f} tok/s, best: {ref_cal.cpu_gbs:.1f} GB/s", flush=True)
            for lb, path in models[::-1] if rnd % 2 else models:
                load = wait_quiet()
                m = measure(path, 2048)["decode_tok_s"]
                meas[lb].append(m)
                bw = 1 / planner.decode_seconds(infos[lb], hw, n_gpu_layers=0, depth=depth, calibration=cal)
                fac = formula[lb] * best / st_formula
                preds[lb]["bandwidth"].append(bw)
                preds[lb]["factor"].append(fac)
                ref = 1 / planner.decode_seconds(infos[lb], hw, n_gpu_layers=0, depth=depth, calibration=ref_cal)
                preds[lb]["f16 ref"].append(ref)
                print(f"  {lb:36s} measured {m:6.1f} | formula {formula[lb]:6.1f} ({formula[lb] / m:.3f})"
                      f" bandwidth {bw:6.1f} ({bw / m:.3f}) factor {fac:6.1f} ({fac / m:.3f}) f16 ref {ref:6.1f}"
                      f" ({ref / m:.3f})  load {load:.1f}",
                      flush=True)
    print("medians, predicted / measured (target 0.85-1.15):")
    worst = {"formula": 1.0, "bandwidth": 1.0, "factor": 1.0, "f16 ref": 1.0}
    for lb in labels:
        med = statistics.median(meas[lb])
        r = {"formula": formula[lb] / med, "bandwidth": statistics.median(preds[lb]["bandwidth"]) / med,
             "factor": statistics.median(preds[lb]["factor"]) / med,
             "f16 ref": statistics.median(preds[lb]["f16 ref"]) / med}
        for k, v in r.items():
            worst[k] = v if abs(v - 1) > abs(worst[k] - 1) else worst[k]
        print(f"  {lb:36s} measured {med:6.1f}  " + "  ".join(f"{k} {v:.3f}" for k, v in r.items()))
    print("worst: " + "  ".join(f"{k} {v:.3f}" for k, v in worst.items()))
    ok = abs(worst["bandwidth"] - 1) <= 0.15  # the product's own prediction after the starter's run
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


def quantized_main(rounds: int) -> int:
    """The common case of the product's calibration: the starter run first, then a quantized model. The
    issue's two dense shapes are quantized to Q4_K_M with llama.cpp's own llama_model_quantize, measured
    beside the starter in each round, and predicted by the formula alone and after the starter's best run
    (the product's prediction once it recorded that run)."""
    import statistics

    import llama_cpp

    from ggufdesk.core import hardware, planner
    from ggufdesk.core.gguf_meta import read_gguf
    from ggufdesk.core.starter import starter_model_path
    from tests.fixtures.ggufs import TinySpec, write_tiny_llama

    wait_quiet()
    hw = hardware.probe(remeasure=True)
    none = hardware.Calibration()
    depth = PROMPT + DECODE // 2
    shapes = {"dense 2048x16": TinySpec(n_embd=2048, n_layer=16, n_head=16, n_head_kv=4, n_ff=5632, dtype="f16",
                                        n_ctx_train=8192),
              "dense 1536x24": TinySpec(n_embd=1536, n_layer=24, n_head=12, n_head_kv=4, n_ff=4096, dtype="f16",
                                        n_ctx_train=8192)}
    with tempfile.TemporaryDirectory() as tmp:
        models: dict[str, Path] = {}
        for name, spec in shapes.items():
            f16 = write_tiny_llama(Path(tmp) / "f16.gguf", spec)
            q = Path(tmp) / f"{name.replace(' ', '-')}-q4km.gguf"
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
            if llama_cpp.llama_model_quantize(str(f16).encode(), str(q).encode(), params) != 0:
                raise RuntimeError(f"llama.cpp could not quantize {name}")
            f16.unlink()
            models[name + " Q4_K_M"] = q
        st_info = read_gguf(starter_model_path())
        st: list[float] = []
        meas: dict[str, list[float]] = {n: [] for n in models}
        for rnd in range(rounds):
            wait_quiet()
            st.append(measure(starter_model_path(), 2048)["decode_tok_s"])
            for n, q in models.items():
                meas[n].append(measure(q, 2048)["decode_tok_s"])
            print(f"round {rnd + 1}: starter {st[-1]:.1f}; " + "; ".join(f"{n} {meas[n][-1]:.1f}" for n in meas),
                  flush=True)
        cal = calibrated(st_info, max(st))
        worst = 1.0
        for n, q in models.items():
            info = read_gguf(q)
            m = statistics.median(meas[n])
            f = 1 / planner.decode_seconds(info, hw, n_gpu_layers=0, depth=depth, calibration=none)
            c = 1 / planner.decode_seconds(info, hw, n_gpu_layers=0, depth=depth, calibration=cal)
            worst = c / m if abs(c / m - 1) > abs(worst - 1) else worst
            print(f"{n}: {planner.weight_bytes_per_token(info) / 1e6:.0f} MB/token, measured {m:.1f} (median of "
                  f"{rounds}); formula {f:.1f} ({f / m:.3f}); after the starter's run {c:.1f} ({c / m:.3f})")
    ok = abs(worst - 1) <= 0.15
    print(f"worst after the starter's run {worst:.3f} (target 0.85-1.15): " + ("PASS" if ok else "MISS"))
    return 0 if ok else 1


def probe_models(tmp: Path) -> list[tuple[str, Path]]:
    """Every model --probe predicts: the issue's pair, the first held-out pair, a second held-out set
    chosen before the decode probe's terms were fitted (2026-12-03, sixth session) and never fitted on,
    the two dense shapes quantized to Q4_K_M, and the two real models."""
    import llama_cpp

    from ggufdesk.core import starter
    from tests.fixtures.ggufs import TinySpec, write_tiny_llama
    from tests.fixtures.moe import MoeSpec, write_moe

    out = [("tuned " + lb, p) for lb, p in moe_models(tmp / "t", False)]
    out += [("held-out " + lb, p) for lb, p in moe_models(tmp / "h", False, True)]

    def dense(w: int, n_layer: int, ff: int) -> TinySpec:
        return TinySpec(n_embd=w, n_layer=n_layer, n_head=w // 64, n_head_kv=max(1, w // 256), n_ff=ff, dtype="f16",
                        n_ctx_train=8192, seed=11)

    def q4km(name: str, spec: TinySpec) -> Path:
        f16, q = write_tiny_llama(tmp / "f16.gguf", spec), tmp / f"{name}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(q).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not quantize {name}")
        f16.unlink()
        return q

    out += [("held-out-2 dense 1280x20 f16", write_tiny_llama(tmp / "h2d.gguf", dense(1280, 20, 3456))),
            ("held-out-2 moe 24x6 f16", write_moe(tmp / "h2m.gguf", MoeSpec(
                n_layer=20, n_embd=640, n_head=10, n_head_kv=2, head_dim=64, n_expert=24, n_expert_used=6,
                n_ff_exp=320, n_ff_shexp=0))),
            ("held-out-2 dense 1792x12 Q4_K_M", q4km("h2q", dense(1792, 12, 4864))),
            ("dense 2048x16 Q4_K_M", q4km("tq", TinySpec(n_embd=2048, n_layer=16, n_head=16, n_head_kv=4, n_ff=5632,
                                                          dtype="f16", n_ctx_train=8192))),
            ("dense 1536x24 Q4_K_M", q4km("hq", TinySpec(n_embd=1536, n_layer=24, n_head=12, n_head_kv=4, n_ff=4096,
                                                          dtype="f16", n_ctx_train=8192))),
            ("real gemma3-270m Q4_K_M", starter.starter_model_path()),
            ("real smollm2-135m Q4_1", starter.model_path(starter.SMOLLM2))]
    return out + held_out_3_models(tmp)


def quantize(f16: Path, out: Path, ftype: int) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize), as a user's GGUF was made; the f16 file goes."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    if llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {f16.name}")
    f16.unlink()
    return out


def held_out_3_models(tmp: Path) -> list[tuple[str, Path]]:
    """A third held-out set, chosen on 2026-12-03 (seventh session) before looking into the starter's and
    the 1536x24 Q4_K_M's misses, and not measured until a change was made: other widths, weight types
    no held-out model had (Q8_0, Q6_K, a quantized mixture) and vocabularies of real size (65,536 with
    its own output; 151,936 tied, as Qwen's small models)."""
    import llama_cpp

    from ggufdesk.engine.runtime.decode_probe import Shape, write_model
    from tests.fixtures.ggufs import TinySpec, write_tiny_llama
    from tests.fixtures.moe import MoeSpec, write_moe

    def llama(w: int, n_layer: int, n_head: int, ff: int) -> TinySpec:
        return TinySpec(n_embd=w, n_layer=n_layer, n_head=n_head, n_head_kv=4, n_ff=ff, dtype="f16",
                        n_ctx_train=8192, seed=13)

    f = llama_cpp
    return [
        ("held-out-3 dense 1024x20 Q8_0", quantize(write_tiny_llama(tmp / "a.gguf", llama(1024, 20, 16, 2816)),
                                                   tmp / "h3a.gguf", f.LLAMA_FTYPE_MOSTLY_Q8_0)),
        ("held-out-3 dense 2560x8 Q6_K", quantize(write_tiny_llama(tmp / "b.gguf", llama(2560, 8, 20, 6912)),
                                                  tmp / "h3b.gguf", f.LLAMA_FTYPE_MOSTLY_Q6_K)),
        ("held-out-3 dense 768x30 f16 v65536", write_model(tmp / "h3c.gguf", Shape(
            768, 30, 12, 4, 2048, "F16", n_vocab=65536))),
        ("held-out-3 moe 32x4 Q4_K_M", quantize(write_moe(tmp / "d.gguf", MoeSpec(
            n_layer=16, n_embd=1024, n_head=16, n_head_kv=4, head_dim=64, n_expert=32, n_expert_used=4,
            n_ff_exp=512, n_ff_shexp=0)), tmp / "h3d.gguf", f.LLAMA_FTYPE_MOSTLY_Q4_K_M)),
        ("held-out-3 dense 1024x16 Q4_K_M v151936 tied", quantize(write_model(tmp / "e.gguf", Shape(
            1024, 16, 16, 4, 2816, "F16", n_vocab=151936, tied=True)), tmp / "h3e.gguf",
            f.LLAMA_FTYPE_MOSTLY_Q4_K_M)),
    ]


def probe_main(rounds: int, only: str = "") -> int:
    """Decode predicted by the formula alone and after the engine's decode probe of this CPU (what the
    product predicts once the wizard ran it: engine/runtime/decode_probe.py), against measured. The probe
    is run again in every round, and each model is measured once per round, the order alternating."""
    import statistics

    from ggufdesk.core import hardware, planner
    from ggufdesk.core.gguf_meta import read_gguf
    from ggufdesk.engine.link import decode_probe

    wait_quiet()
    hw = hardware.probe(remeasure=True)
    none = hardware.Calibration()
    depth = PROMPT + DECODE // 2
    print(f"machine: {hw.cpu.name}, {hw.cpu.cores_physical} cores, RAM read {hw.ram_bandwidth_gbs} GB/s; "
          f"2 threads, mmap off, decode after a {PROMPT}-token prompt", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for sub in ("t", "h"):
            (Path(tmp) / sub).mkdir()
        models = [(lb, p) for lb, p in probe_models(Path(tmp)) if lb.startswith(only)]
        infos = {lb: read_gguf(p) for lb, p in models}
        formula = {lb: 1 / planner.decode_seconds(i, hw, n_gpu_layers=0, depth=depth, calibration=none)
                   for lb, i in infos.items()}
        meas: dict[str, list[float]] = {lb: [] for lb, _ in models}
        pred: dict[str, list[float]] = {lb: [] for lb, _ in models}
        for rnd in range(rounds):
            wait_quiet()
            r = decode_probe.measure(folder=Path(tmp))
            cal = hardware.Calibration(cpu_float_gbs=r["float_gbs"], cpu_quant_gbs=r["quant_gbs"],
                                       cpu_type_gbs=tuple(sorted(r["type_gbs"].items())))
            print(f"round {rnd + 1}: probe {r['type_gbs']} GB/s in {r['took_s']} s", flush=True)
            for lb, path in models[::-1] if rnd % 2 else models:
                load = wait_quiet()
                m = measure(path, 2048)["decode_tok_s"]
                c = 1 / planner.decode_seconds(infos[lb], hw, n_gpu_layers=0, depth=depth, calibration=cal)
                meas[lb].append(m)
                pred[lb].append(c)
                print(f"  {lb:36s} measured {m:6.1f} | formula {formula[lb]:6.1f} ({formula[lb] / m:.3f}) "
                      f"probe {c:6.1f} ({c / m:.3f})  load {load:.1f}", flush=True)
    print("medians, predicted / measured (target 0.85-1.15):")
    worst = {"formula": 1.0, "probe": 1.0}
    for lb, _ in models:
        med = statistics.median(meas[lb])
        r_ = {"formula": formula[lb] / med, "probe": statistics.median(pred[lb]) / med}
        for k, v in r_.items():
            worst[k] = v if abs(v - 1) > abs(worst[k] - 1) else worst[k]
        print(f"  {lb:36s} measured {med:6.1f}  formula {r_['formula']:.3f}  probe {r_['probe']:.3f}")
    print("worst: " + "  ".join(f"{k} {v:.3f}" for k, v in worst.items()))
    ok = abs(worst["probe"] - 1) <= 0.15
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


def wait_quiet(max_s: float = 120.0) -> float:
    """Decode speed on 2 shared cores is meaningless while others run: wait for a quiet machine."""
    t = time.time()
    while os.getloadavg()[0] > 0.6 * (os.cpu_count() or 1) and time.time() - t < max_s:
        time.sleep(5)
    return os.getloadavg()[0]


def measure(path: Path, n_ctx: int) -> dict:
    code = (f"import json,sys; sys.path.insert(0,{str(ROOT / 'bench')!r}); import planner; "
            f"r=planner.worker({str(path)!r},{n_ctx},512,{PROMPT},{DECODE},'auto'); r.pop('log_tail'); "
            "print('RESULT'+json.dumps(r))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"measurement failed: {p.stderr[-2000:]}")
    return json.loads(line[6:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one context length per model")
    ap.add_argument("--moe", action="store_true", help="decode of a mixture of experts and a dense model")
    ap.add_argument("--small", action="store_true", help="with --moe: tiny models, to check that it runs")
    ap.add_argument("--held-out", action="store_true",
                    help="with --moe: the held-out pair (other shapes; no planner constant was fitted on them)")
    ap.add_argument("--calibrated", action="store_true",
                    help="with --moe: both pairs predicted after a measured starter run (the product's calibration)")
    ap.add_argument("--quantized", action="store_true",
                    help="with --moe --calibrated: two dense shapes quantized to Q4_K_M, predicted after a starter run")
    ap.add_argument("--probe", action="store_true",
                    help="every model predicted after the engine's decode probe of this CPU (issue 27)")
    ap.add_argument("--only", default="", help="with --probe: the models whose label starts with this")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --moe: measure the pair this many times in turn, compare the medians")
    args = ap.parse_args()
    if args.probe:
        return probe_main(max(1, args.rounds), args.only)
    if args.moe and args.calibrated and args.quantized:
        return quantized_main(max(1, args.rounds))
    if args.moe and args.calibrated:
        return calibrated_main(max(1, args.rounds))
    if args.moe:
        return moe_main(args.small, args.held_out, max(1, args.rounds))
    from ggufdesk.core import hardware, planner
    from ggufdesk.core.gguf_meta import read_gguf

    wait_quiet()
    hw = hardware.probe(remeasure=True)
    print(f"machine: {hw.cpu.name}, {hw.cpu.cores_physical} cores, RAM read {hw.ram_bandwidth_gbs} GB/s "
          f"(best measured), {hw.cpu_gflops} GFLOPS; formula only (recorded runs left out); "
          "llama.cpp CPU, mmap off, 2 threads, "
          f"flash attention auto, n_ubatch 512, prompt {PROMPT}, decode {DECODE}")
    hdr = (f"{'model':20s} {'ctx':>6s} | {'buffers MiB pred/meas':>22s} {'ratio':>6s} | "
           f"{'RSS MiB pred/meas':>18s} {'ratio':>6s} | {'decode tok/s pred/meas':>22s} {'ratio':>6s}")
    print(hdr)
    print("-" * len(hdr))
    worst = {"buf": 1.0, "rss": 1.0, "dec": 1.0}
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in models(Path(tmp)):
            info = read_gguf(path)
            for n_ctx in CASES_CTX[1:2] if args.quick else CASES_CTX:
                load = wait_quiet()
                m = measure(path, n_ctx)
                mem = planner.memory(info, n_ctx=n_ctx)
                meas_buf = m["memory"]["weights"] + m["memory"]["kv"] + m["memory"]["compute"] + m["memory"]["output"]
                pred_rss = mem.resident_ram(info, 512)
                pred_dec = 1 / planner.decode_seconds(info, hw, n_gpu_layers=0, depth=PROMPT + DECODE // 2,
                                                      calibration=hardware.Calibration())
                r_buf, r_rss = mem.buffers / meas_buf, pred_rss / m["rss_end"]
                r_dec = pred_dec / m["decode_tok_s"]
                for k, r in (("buf", r_buf), ("rss", r_rss), ("dec", r_dec)):
                    if abs(r - 1) > abs(worst[k] - 1):
                        worst[k] = r
                print(f"{label:20s} {n_ctx:6d} | {mem.buffers / 2**20:10.1f} /{meas_buf / 2**20:9.1f} {r_buf:6.3f} | "
                      f"{pred_rss / 2**20:8.1f} /{m['rss_end'] / 2**20:7.1f} {r_rss:6.3f} | "
                      f"{pred_dec:10.1f} /{m['decode_tok_s']:9.1f} {r_dec:6.3f}  load {load:.1f}")
    print(f"worst ratios: buffers {worst['buf']:.3f} (target 0.90-1.10), RSS {worst['rss']:.3f} (target 0.90-1.10), "
          f"decode {worst['dec']:.3f} (target 0.85-1.15)")
    ok = abs(worst["buf"] - 1) <= 0.10 and abs(worst["rss"] - 1) <= 0.10 and abs(worst["dec"] - 1) <= 0.15
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


if __name__ == "__main__" and sys.argv[1:2] != ["--worker"]:
    sys.exit(main())
