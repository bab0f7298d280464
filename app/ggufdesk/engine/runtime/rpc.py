"""llama.cpp's RPC backend (ggml-rpc) through ctypes: serve this machine's memory, or use other machines'.

llama-cpp-python does not bind ggml-rpc; its wheel (built with GGML_RPC=ON) ships libggml-rpc, whose
exports we declare here against ggml/include/ggml-rpc.h of the vendored llama.cpp (protocol 7.x):
`ggml_backend_rpc_start_server(endpoint, cache_dir, n_threads, n_devices, devices)` blocks and serves;
`ggml_backend_rpc_add_server(endpoint)` returns a backend registry whose devices go into
`llama_model_params.devices`. Run `python -m ggufdesk.engine.runtime.rpc --port N` to serve (the `ggufdesk
worker` command does, in a child process, so that Ctrl-C and termination always work).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ggufdesk.core.errors import KnownError
from ggufdesk.core.rpc_wire import WorkerInfo, probe_worker
from ggufdesk.core.settings import LoadSettings

if TYPE_CHECKING:
    from typing import TypeAlias

    SizePtr: TypeAlias = ctypes._Pointer[ctypes.c_size_t]

P = ctypes.c_void_p
SizeP = ctypes.POINTER(ctypes.c_size_t)
GET_MEMORY = ctypes.CFUNCTYPE(None, P, SizeP, SizeP)  # ggml_backend_device_i.get_memory
DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL = 0, 1, 2, 3
_KEEP: list[object] = []  # ctypes callbacks and arrays llama.cpp holds on to: never collected


def _load(name: str) -> ctypes.CDLL:
    import llama_cpp

    libdir = Path(llama_cpp.__file__).parent / "lib"
    for file in (f"lib{name}.so", f"lib{name}.dylib", f"{name}.dll"):
        if (libdir / file).exists():
            return ctypes.CDLL(str(libdir / file))
    raise KnownError(f"this llama-cpp-python build has no {name} library in {libdir}; "
                     "rebuild it with -DGGML_RPC=ON (installer/llama_wheel.sh does)")


class _Ggml:
    """The ggml functions we call (libggml-rpc, libggml-base, libggml), declared and typed: device
    handles are addresses (int); a NULL handle is 0."""

    def __init__(self) -> None:
        import llama_cpp  # noqa: F401 - loads libggml and registers the backends first

        rpc, base, ggml = _load("ggml-rpc"), _load("ggml-base"), _load("ggml")
        rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                      ctypes.c_size_t, ctypes.POINTER(P)]
        rpc.ggml_backend_rpc_start_server.restype = None
        rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
        rpc.ggml_backend_rpc_add_server.restype = P
        base.ggml_backend_reg_dev_count.argtypes = [P]
        base.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
        base.ggml_backend_reg_dev_get.argtypes = [P, ctypes.c_size_t]
        base.ggml_backend_reg_dev_get.restype = P
        ggml.ggml_backend_dev_count.restype = ctypes.c_size_t  # the registry lives in libggml
        ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        ggml.ggml_backend_dev_get.restype = P
        base.ggml_backend_dev_type.argtypes = [P]
        base.ggml_backend_dev_type.restype = ctypes.c_int
        base.ggml_backend_dev_name.argtypes = [P]
        base.ggml_backend_dev_name.restype = ctypes.c_char_p
        base.ggml_backend_dev_memory.argtypes = [P, SizeP, SizeP]
        base.ggml_backend_dev_memory.restype = None
        self._rpc, self._base, self._ggml = rpc, base, ggml

    def dev_count(self) -> int:
        return int(self._ggml.ggml_backend_dev_count())

    def dev_get(self, i: int) -> int:
        return _address(self._ggml.ggml_backend_dev_get(i))

    def dev_type(self, dev: int) -> int:
        return int(self._base.ggml_backend_dev_type(dev))

    def devices(self) -> list[int]:
        """Every device llama.cpp registered, in its order."""
        return [self.dev_get(i) for i in range(self.dev_count())]

    def add_server(self, endpoint: str) -> int:
        """The backend registry of an RPC worker (0: none)."""
        return _address(self._rpc.ggml_backend_rpc_add_server(endpoint.encode()))

    def reg_devices(self, reg: int) -> list[int]:
        return [_address(self._base.ggml_backend_reg_dev_get(reg, i))
                for i in range(self._base.ggml_backend_reg_dev_count(reg))]

    def start_server(self, endpoint: str, threads: int, devices: ctypes.Array[ctypes.c_void_p]) -> None:
        """Serve `devices` at endpoint; returns only when the server could not be set up."""
        self._rpc.ggml_backend_rpc_start_server(endpoint.encode(), None, threads, len(devices), devices)


def _address(pointer: int | None) -> int:
    """A c_void_p result as ctypes gives it (int, None for NULL) as an int."""
    return int(pointer or 0)


def _libs() -> _Ggml:
    """The ggml libraries with the signatures we use declared."""
    return _Ggml()


def local_devices(lib: _Ggml) -> list[int]:
    """This machine's GPUs (what a model offloads to besides the workers); [] on a CPU-only build."""
    return [d for d in lib.devices() if lib.dev_type(d) in (DEV_GPU, DEV_IGPU)]


def remote_devices(endpoints: list[str]) -> list[int]:
    """The devices of each worker, in order. Check the workers first (core.rpc_wire): ggml-rpc
    aborts the process when one cannot be reached."""
    lib = _libs()
    out: list[int] = []
    for ep in endpoints:
        reg = lib.add_server(ep)
        if not reg:
            raise KnownError(f"RPC worker {ep} offers no devices")
        out += lib.reg_devices(reg)
    return out


def offload_devices(endpoints: list[str]) -> list[int]:
    """Local GPUs first, then the workers' devices: the order of LoadSettings.tensor_split shares."""
    return local_devices(_libs()) + remote_devices(endpoints)


@dataclass(slots=True, kw_only=True)
class Offload:
    """What llama_model_params gets when workers are used: devices, per-device layer counts, n_gpu_layers."""

    devices: list[int]
    tensor_split: list[float]
    n_gpu_layers: int
    plan: dict[str, Any] = field(default_factory=dict)  # distributed.Split.to_json() + the workers' probes


def check_workers(endpoints: list[str], *, timeout: float = 5.0) -> list[WorkerInfo]:
    """Every worker answers (else KnownError naming it), with its memory and round-trip time."""
    return [probe_worker(ep, timeout=timeout) for ep in endpoints]


def prepare_offload(path: str, settings: LoadSettings) -> Offload:
    """Check the workers, split the model over local GPUs and the workers, register their devices."""
    from ggufdesk.core import distributed, gguf_meta, hardware

    workers = check_workers(settings.rpc)
    info = gguf_meta.read_gguf(path)
    ngl = None if settings.n_gpu_layers == 0 else settings.n_gpu_layers
    from ggufdesk.engine.runtime.devices import ggml_devices

    hw = hardware.with_ggml_devices(hardware.probe(), ggml_devices())  # Metal/Vulkan GPUs too
    sp = distributed.split(info, hw, workers, n_ctx=settings.n_ctx, n_ubatch=settings.n_ubatch,
                           type_k=settings.type_k, type_v=settings.type_v, flash_attn=settings.flash_attn,
                           n_gpu_layers=ngl)
    if not sp.fits:
        raise KnownError(f"{os.path.basename(path)} does not fit on this machine and the workers "
                         f"({', '.join(settings.rpc)}): {'; '.join(sp.notes)}")
    devices = offload_devices(settings.rpc)
    if len(devices) != len(sp.tensor_split):
        raise KnownError(f"llama.cpp sees {len(devices)} offload devices, the workers reported "
                         f"{len(sp.tensor_split)}; check the workers and try again")
    return Offload(devices=devices, tensor_split=sp.tensor_split, n_gpu_layers=sp.n_gpu_layers,
                   plan={**sp.to_json(), "workers": [w.to_json() for w in workers]})


def _limit_memory(dev: int, limit: int) -> None:
    """Make a device report at most `limit` bytes (free and total) to RPC clients.

    The RPC server answers GET_DEVICE_MEMORY with the device's own get_memory; this wraps that
    function pointer (ggml_backend_device.iface.get_memory, the third pointer of ggml-backend-impl.h's
    ggml_backend_device_i) in this dedicated server process. It is what planners see: llama.cpp
    does not enforce it when allocating.
    """
    slot = P.from_address(dev + 2 * ctypes.sizeof(P))
    if not slot.value:
        raise KnownError("this llama.cpp device reports no memory: --mem cannot limit it")
    original = GET_MEMORY(slot.value)

    def limited(d: int, free: SizePtr, total: SizePtr) -> None:
        original(d, free, total)
        total[0] = min(total[0], limit) if total[0] else limit
        free[0] = min(free[0], limit) if free[0] else limit

    cb = GET_MEMORY(limited)
    _KEEP.extend([original, cb])
    slot.value = ctypes.cast(cb, P).value


def serve(host: str, port: int, *, mem: int = 0, threads: int = 0, cpu: bool = False) -> None:
    """Serve this machine's accelerators (else its CPU) over RPC; blocks until the process ends."""
    lib = _libs()
    devs = [] if cpu else local_devices(lib)
    if not devs:
        devs = [d for d in lib.devices() if lib.dev_type(d) == DEV_CPU][:1]
    if not devs:
        raise KnownError("llama.cpp found no device to serve")
    if mem:
        for d in devs:
            _limit_memory(d, mem)
    arr = (P * len(devs))(*devs)
    _KEEP.append(arr)
    if not threads:
        from ggufdesk.core.settings import default_threads

        threads = default_threads()
    lib.start_server(f"{host}:{port}", threads, arr)
    # start_server returns only when it could not set up (it printed why, e.g. the port is taken)
    raise KnownError(f"the RPC server could not listen on {host}:{port} (is the port in use?)")


def _die_with_parent() -> None:
    """Linux: end this server when the `ggufdesk worker` process that started it ends, however it ends."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() == 1:
            os._exit(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ggufdesk.engine.runtime.rpc")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mem", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the server blocks in C: let signals end it at once
    _die_with_parent()
    try:
        serve(args.host, args.port, mem=args.mem, threads=args.threads, cpu=args.cpu)
    except KnownError as e:
        print(f"ggufdesk worker: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
