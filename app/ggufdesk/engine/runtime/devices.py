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


def ggml_devices() -> list[dict]:
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
        out = []
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
