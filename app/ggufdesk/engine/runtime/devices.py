"""The ggml device list of the installed llama.cpp build (CUDA, Metal, Vulkan, CPU): name and memory.

NVML only knows NVIDIA cards; ggml knows whatever backend this build has. llama-cpp-python does not
bind these functions, so they are declared here against the libggml it ships.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger("ggufdesk.engine")

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type


def _libggml() -> ctypes.CDLL:
    import llama_cpp

    libdir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (libdir / name).exists():
            return ctypes.CDLL(str(libdir / name))
    raise OSError(f"libggml not found in {libdir}")


def ggml_devices() -> list[dict[str, str | int]]:
    """[{name, description, type, memory_free, memory_total}] for every device ggml can use; [] on error."""
    try:
        lib = _libggml()
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.restype = None
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)]
        out: list[dict[str, str | int]] = []
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            out.append({
                "name": (lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                "description": (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                "type": DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                "memory_free": int(free.value), "memory_total": int(total.value),
            })
        return out
    except (OSError, AttributeError) as e:
        log.warning("ggml device list unavailable: %s", e)
        return []


class _BuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override {const char * pattern; ggml_backend_buffer_type_t buft;}"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def experts_on_cpu(n_layers: int) -> tuple[list[bytes], ctypes.Array[_BuftOverride]]:
    """The tensor buffer overrides that keep the routed experts of layers 0..n_layers-1 in host memory
    (llama.cpp's --n-cpu-moe N): one pattern per layer, as llama.cpp's own option writes them, the
    CPU device's buffer type, NULL-terminated. Returns (the patterns, the array): both must outlive
    the model load, which reads them (llama_model_params.tensor_buft_overrides, a pointer in
    llama-cpp-python 0.3.36's struct, which binds no helper for it)."""
    lib = _libggml()
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    buft = lib.ggml_backend_dev_buffer_type(cpu) if cpu else None
    if not buft:
        raise OSError("ggml has no CPU buffer type")
    patterns = [rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps".encode() for i in range(n_layers)]
    arr = (_BuftOverride * (len(patterns) + 1))(*[_BuftOverride(p, buft) for p in patterns], _BuftOverride(None, None))
    return patterns, arr
