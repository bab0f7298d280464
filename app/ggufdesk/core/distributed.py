"""Spreading a model over this machine and RPC workers: which layers go where, and the speed to expect.

llama.cpp's rule (src/llama-model.cpp load_tensors): with n_gpu_layers = k the last k-1 repeating
layers and the output layer go to the offload devices (local GPUs, then each worker's devices, in the
order of `llama_model_params.devices`), the rest and the token embeddings stay on the local CPU.
Offloaded layer j goes to the first device whose cumulative `tensor_split` share exceeds j / k, so
per-device layer counts as `tensor_split` give exact placement. We give each device a share of the
offloaded bytes in proportion to its free memory (what llama.cpp does by default), and offload as
many layers as those devices hold.

Decode speed = the local part (planner) + each device's bytes at the CPU's per-byte rate (a worker is
assumed as fast per byte as this machine; ggml-rpc does not report remote speed) + the network: one
round trip per worker per token, the activations (n_embd x 4 B) each way, and the logits (n_vocab x
4 B) when the output layer is on a worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ggufdesk.core import planner
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import GGUFInfo
from ggufdesk.core.hardware import HardwareInfo
from ggufdesk.core.rpc_wire import WorkerInfo, parse_endpoint, parse_workers  # noqa: F401 - re-exported

MiB = 1 << 20
WORKER_MARGIN = 32 * MiB  # kept free on each worker device besides its compute buffer


@dataclass(frozen=True, slots=True, kw_only=True)
class Place:
    """One offload device and what it gets."""

    name: str  # "GPU0" | "RPC 10.0.0.2:50052 #0"
    endpoint: str | None  # None for a local GPU
    budget: int  # bytes it may hold (free memory less its compute buffer and margin)
    layers: tuple[int, ...]  # offloaded layer indices (n_layer = the output layer)
    bytes: int  # weights + KV cache placed on it
    weights: int = 0  # of which weights (what each decoded token reads)


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """Where a model goes across this machine and the workers, and the predicted decode speed."""

    n_gpu_layers: int  # llama.cpp's n_gpu_layers (offloaded layers, output included)
    tensor_split: list[float]  # per offload device: its layer count
    places: list[Place]
    cpu_layers: int  # repeating layers left on the local CPU
    ram_bytes: int
    fits: bool
    pred_decode_tok_s: float
    pred_local_tok_s: float  # the same model all on this machine (for comparison)
    network_s_per_token: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "n_gpu_layers": self.n_gpu_layers, "tensor_split": self.tensor_split,
            "devices": [{"name": p.name, "endpoint": p.endpoint, "budget": p.budget,
                         "layers": [min(p.layers), max(p.layers)] if p.layers else [],
                         "n_layers": len(p.layers), "bytes": p.bytes} for p in self.places],
            "cpu_layers": self.cpu_layers, "ram_bytes": self.ram_bytes, "fits": self.fits,
            "pred_decode_tok_s": round(self.pred_decode_tok_s, 2),
            "pred_local_tok_s": round(self.pred_local_tok_s, 2),
            "network_ms_per_token": round(self.network_s_per_token * 1e3, 3), "notes": self.notes,
        }


def _layer_costs(info: GGUFInfo, kv: list[int]) -> list[int]:
    """Bytes per offloadable layer: repeating layers (weights + KV), then the output layer."""
    lb = info.layer_bytes()
    out = sum(t.n_bytes for t in planner._output_tensors(info))
    return [lb[i] + kv[i] for i in range(info.n_layer)] + [out]


def _assign(costs: list[int], budgets: list[int], k: int) -> list[list[int]] | None:
    """Give the last k layers to the devices in order, each a share of the bytes in proportion
    to its budget; None if a device would get more than its budget."""
    n = len(costs)
    layers = list(range(n - k, n))
    total = sum(costs[i] for i in layers)
    cap = sum(budgets)
    if k and (cap <= 0 or total > cap):
        return None
    out: list[list[int]] = [[] for _ in budgets]
    d, used, target_cum, placed = 0, 0, budgets[0] / cap * total if k else 0, 0
    for i in layers:
        while d < len(budgets) - 1 and (placed + costs[i] / 2 > target_cum or budgets[d] == 0):
            d += 1
            target_cum += budgets[d] / cap * total
            used = 0
        if used + costs[i] > budgets[d]:
            return None
        out[d].append(i)
        used += costs[i]
        placed += costs[i]
    return out


def split(info: GGUFInfo, hw: HardwareInfo, workers: list[WorkerInfo], *, n_ctx: int = 4096,
          n_ubatch: int = 512, type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto",
          n_gpu_layers: int | None = None) -> Split:
    """Place the model's layers on local GPUs and the workers' devices, the rest on this CPU."""
    kv = planner.kv_bytes_per_layer(info, n_ctx, type_k=type_k, type_v=type_v, n_ubatch=n_ubatch)
    costs = _layer_costs(info, kv)
    cb = planner.compute_buffer(info, n_ctx=n_ctx, n_ubatch=n_ubatch, flash=flash_attn != "off")
    places = _offload_devices(hw, workers, cb)
    budgets = [max(0, b) for _, _, b in places]
    ram_budget, _ = planner.budgets(hw)
    notes: list[str] = []
    k, assigned = _offloaded_layers(costs, budgets, info.n_layer + 1, n_gpu_layers, notes)
    ram = planner.memory(info, n_ctx=n_ctx, n_gpu_layers=k, n_ubatch=n_ubatch, type_k=type_k,
                         type_v=type_v, flash_attn=flash_attn, gpu=bool(places)).ram
    fits = ram <= ram_budget and not notes
    if ram > ram_budget:
        need = ram - ram_budget
        notes.append(f"this machine would need {need / MiB:.0f} MiB more RAM; add workers or memory")
    wcosts = _layer_costs(info, [0] * info.n_layer)
    out_places = [Place(name=n, endpoint=e, budget=b, layers=tuple(a), bytes=sum(costs[i] for i in a),
                        weights=sum(wcosts[i] for i in a)) for (n, e, b), a in zip(places, assigned)]
    notes += [f"{p.name} gets no layers (free {p.budget / MiB:.0f} MiB after its compute buffer)"
              for p in out_places if p.endpoint and not p.layers]
    dec, net, local = predict_decode(info, hw, out_places, workers)
    return Split(n_gpu_layers=k, tensor_split=[float(len(a)) for a in assigned], places=out_places,
                 cpu_layers=info.n_layer - sum(1 for a in assigned for i in a if i < info.n_layer),
                 ram_bytes=ram, fits=fits, pred_decode_tok_s=dec, pred_local_tok_s=local,
                 network_s_per_token=net, notes=notes)


def _offload_devices(hw: HardwareInfo, workers: list[WorkerInfo], cb: int) -> list[tuple[str, str | None, int]]:
    """(name, endpoint or None for a local GPU, budget) per offload device in llama.cpp's order: the
    local GPUs, then each worker's devices; a budget is the free memory less the compute buffer `cb`
    and the margins (negative when the device cannot hold even that)."""
    places: list[tuple[str, str | None, int]] = []
    for g in hw.gpus:
        margin = max(planner.VRAM_MARGIN[0], int(g.vram_total * planner.VRAM_MARGIN[1]))
        places.append((f"GPU{g.index}", None, g.vram_free - margin - planner.CUDA_CONTEXT - cb))
    for w in workers:
        for j, (free, _total) in enumerate(w.devices):
            places.append((f"RPC {w.endpoint} #{j}", w.endpoint, free - cb - WORKER_MARGIN))
    return places


def _offloaded_layers(costs: list[int], budgets: list[int], top: int, n_gpu_layers: int | None,
                      notes: list[str]) -> tuple[int, list[list[int]]]:
    """(n_gpu_layers, layer indices per device): the count asked for (`top` = all, the output included),
    placed even past the budgets with a note in `notes` when they do not fit; else the most that fit."""
    if not budgets:
        return 0, []
    if n_gpu_layers is not None:
        k = top if n_gpu_layers < 0 else min(n_gpu_layers, top)
        fitted = _assign(costs, budgets, k)
        if fitted is None:
            notes.append(f"{k} offloaded layers do not fit the devices' free memory")
            fitted = _assign(costs, [10**18] * len(budgets), k)
        return k, fitted or [[] for _ in budgets]
    k = next((k for k in range(top, -1, -1) if _assign(costs, budgets, k) is not None), 0)
    return k, _assign(costs, budgets, k) or [[] for _ in budgets]


def network_seconds(info: GGUFInfo, places: list[Place], workers: list[WorkerInfo]) -> float:
    """Per decoded token: a round trip per worker holding layers, activations in and out, and
    the logits back when the output layer is remote."""
    by_ep = {w.endpoint: w for w in workers}
    t = 0.0
    for ep in dict.fromkeys(p.endpoint for p in places if p.endpoint and p.layers):
        w = by_ep[ep]
        rate = (w.link_gbs or 0.1) * 1e9  # unmeasured: assume a 1 Gbit/s LAN
        nbytes = 2 * info.n_embd * 4
        if any(info.n_layer in p.layers for p in places if p.endpoint == ep):
            nbytes += info.n_vocab * 4
        t += w.rtt_s + nbytes / rate
    return t


def predict_decode(info: GGUFInfo, hw: HardwareInfo, places: list[Place],
                   workers: list[WorkerInfo]) -> tuple[float, float, float]:
    """(predicted tok/s with this split, network seconds per token, predicted tok/s all local)."""
    cpu_hw = replace(hw, gpus=())
    local_s = planner.decode_seconds(info, cpu_hw, n_gpu_layers=0)
    # local GPUs: the planner's own figure for those layers, scaled to the bytes they hold
    total = max(1, planner.weight_bytes_per_token(info))
    gpu_bytes = sum(p.weights for p in places if p.endpoint is None)
    gpu_s = 0.0
    if gpu_bytes and hw.gpus:
        gpu_s = planner.decode_seconds(info, hw, n_gpu_layers=-1) * gpu_bytes / total
    remote_bytes = sum(p.weights for p in places if p.endpoint)
    local_bytes = max(0, total - gpu_bytes - remote_bytes)
    per_byte = local_s / total
    net = network_seconds(info, places, workers)
    t = local_bytes * per_byte + remote_bytes * per_byte + gpu_s + net
    t = max(t, 1e-6)
    return 1.0 / t, net, 1.0 / local_s


def after_worker_loss(model: str, settings: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """After an engine using workers stopped: (what to tell the user, settings to reload with).

    Names the workers that no longer answer; reloads on the ones left, or on this machine alone,
    when the model fits there; otherwise (note saying what is missing, None).
    """
    from ggufdesk.core import gguf_meta, hardware
    from ggufdesk.core.rpc_wire import probe_worker, reachable

    workers = list(settings.get("rpc") or [])
    lost = [w for w in workers if not reachable(w)]
    if not lost:
        return "", settings
    alive = [w for w in workers if w not in lost]
    note = f"lost RPC worker {', '.join(lost)}"
    try:
        info = gguf_meta.read_gguf(model)
        hw = hardware.probe()
        kw = dict(n_ctx=settings.get("n_ctx", 4096), n_ubatch=settings.get("n_ubatch", 512),
                  type_k=settings.get("type_k", "f16"), type_v=settings.get("type_v", "f16"),
                  flash_attn=settings.get("flash_attn", "auto"))
        sp = split(info, hw, [probe_worker(w, measure_link=False) for w in alive], **kw)
    except (KnownError, OSError, ValueError) as e:
        return f"{note}; cannot reload: {e}", None
    where = "on the remaining workers" if alive else "on this machine alone"
    if sp.fits:
        return f"{note}; reloading {where}", {**settings, "rpc": alive}
    return (f"{note}; the model does not fit {where} ({'; '.join(sp.notes)}): start the worker again "
            "or add another with --rpc"), None
