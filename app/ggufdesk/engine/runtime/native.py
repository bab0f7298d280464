"""llama.cpp through llama-cpp-python's low-level API: load a model and context, capture its log, abort."""
from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import llama_cpp
from llama_cpp import _internals as internals

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LOGITS_ROWS, LoadSettings

if TYPE_CHECKING:
    from _ctypes import CFuncPtr

    from ggufdesk.engine.runtime.rpc import Offload

log = logging.getLogger("ggufdesk.engine")

KV_TYPE_IDS = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30,
}
FLASH_ATTN_IDS = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
DEFAULT_OUTPUTS = LOGITS_ROWS  # the one source: core/settings.py (the planner counts the same)
_NOISE = ("llama_graph_n_input_tensors", "llama_model_loader: - kv", "llama_model_loader: - type")
_BUFFER_RE = re.compile(r"(\S+)\s+(model|KV|compute|output)\s+buffer size\s*=\s*([\d.]+)\s*MiB")


_REGISTERED_LOG_CALLBACKS: list[CFuncPtr] = []


class _Closable(Protocol):
    """What llama-cpp-python's wrappers (LlamaModel, LlamaContext) offer to free their C object
    (their close() is unannotated: calling it through this is typed)."""

    def close(self) -> None: ...


def free(*objects: _Closable) -> None:
    """Close llama-cpp-python wrappers, in order."""
    for obj in objects:
        obj.close()


class LlamaLog:
    """Captures llama.cpp's log (hidden otherwise) so a failed load can say why."""

    def __init__(self, maxlen: int = 4000) -> None:
        self.lines: deque[str] = deque(maxlen=maxlen)
        self._partial = ""
        self._lock = threading.Lock()
        self._count = 0  # lines ever captured; marks count from here, the deque forgets
        self.echo = os.environ.get("GGUFDESK_LLAMA_LOG") == "1"

        def on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            self._write(text.decode("utf-8", errors="replace"))

        self._callback = _callback = llama_cpp.llama_log_callback(on_log)
        # llama.cpp's log callback is process-wide and outlives this object: a collected callback
        # crashes the process at the next log line, so every one ever registered is kept alive.
        _REGISTERED_LOG_CALLBACKS.append(_callback)
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _write(self, text: str) -> None:
        if self.echo:
            os.write(2, text.encode())
        with self._lock:
            text = self._partial + text
            *done, self._partial = text.split("\n")
            kept = [ln for ln in done if ln.strip() and not ln.startswith(_NOISE)]
            self.lines.extend(kept)
            self._count += len(kept)

    def mark(self) -> int:
        with self._lock:
            return self._count

    def since(self, mark: int) -> list[str]:
        """Lines captured after `mark` (as many as are still kept)."""
        with self._lock:
            n = min(self._count - mark, len(self.lines))
            return list(self.lines)[len(self.lines) - n:] if n > 0 else []

    def reason(self, lines: list[str]) -> str:
        """The most telling lines of a failure: errors first, else the last lines."""
        bad = [ln for ln in lines if re.search(
            r"error|fail|invalid|not found|assert|does not|cannot|must|too (large|small)|mismatch", ln, re.I)]
        chosen = (bad or lines)[-4:]
        return "; ".join(ln.strip() for ln in chosen)


def memory_from_log(lines: list[str]) -> dict[str, int]:
    """llama.cpp's own buffer sizes: weights, KV cache, compute and output buffers, in bytes."""
    out = {"weights": 0, "kv": 0, "compute": 0, "output": 0, "gpu": 0}
    names = {"model": "weights", "KV": "kv", "compute": "compute", "output": "output"}
    for line in lines:
        m = _BUFFER_RE.search(line)
        if m:
            nbytes = int(float(m.group(3)) * 1024 * 1024)
            out[names[m.group(2)]] += nbytes
            if not m.group(1).upper().startswith("CPU"):
                out["gpu"] += nbytes
    return out


def token_piece(vocab: llama_cpp.llama_vocab_p, token: int, buf: ctypes.Array[ctypes.c_char], *,
                special: bool = False) -> bytes:
    """A token's text as bytes, read into `buf` (a scratch buffer), or a buffer as long as it needs.
    special: control tokens (BOS, <|im_start|>) as their text, where a generation's text has nothing."""
    n: int = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        big = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, big, -n, 0, special)
        return big.raw[:n]
    return buf.raw[:n]


class Aborter:
    """The abort callback for long batches; cancel() makes llama_decode return within one graph node."""

    def __init__(self) -> None:
        self.flag = threading.Event()

        def aborted(_data: ctypes.c_void_p) -> bool:
            return self.flag.is_set()

        self._callback = llama_cpp.ggml_abort_callback(aborted)  # keep a reference, see LlamaLog


@dataclass
class LoadedModel:
    """A model and its context, plus the facts the rest of the engine needs."""

    path: str
    model: internals.LlamaModel
    ctx: internals.LlamaContext
    settings: LoadSettings
    metadata: dict[str, str]
    memory: dict[str, int]
    load_s: float
    n_outputs: int = DEFAULT_OUTPUTS
    aborter: Aborter = field(default_factory=Aborter)

    @property
    def vocab(self) -> llama_cpp.llama_vocab_p:
        vocab: llama_cpp.llama_vocab_p = self.model.vocab  # (read per token: no conversion call)
        return vocab

    @property
    def arch(self) -> str:
        return self.metadata.get("general.architecture", "")

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx()

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab()

    @property
    def n_layer(self) -> int:
        return int(llama_cpp.llama_model_n_layer(self.model.model))

    @property
    def n_embd(self) -> int:
        """The width of the model's output embeddings (of its input ones where it does not say)."""
        m = self.model.model
        return int(llama_cpp.llama_model_n_embd_out(m) or llama_cpp.llama_model_n_embd(m))

    @property
    def bos_id(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self.vocab))

    def token_text(self, token: int) -> bytes:
        """A token's text as the vocabulary stores it (llama_vocab_get_text: not detokenized)."""
        return bytes(llama_cpp.llama_vocab_get_text(self.vocab, token) or b"")  # (NULL: none)

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template") or None

    def abortable(self, on: bool) -> None:
        """Install the abort callback for multi-token batches only: it costs a Python call per graph node."""
        if self.ctx.ctx is None:
            raise KnownError("the model was unloaded")
        cb = self.aborter._callback if on else llama_cpp.ggml_abort_callback()  # (no argument: NULL)
        llama_cpp.llama_set_abort_callback(self.ctx.ctx, cb, ctypes.c_void_p(0))

    def close(self) -> None:
        free(self.ctx, self.model)


def apply_offload(mparams: llama_cpp.llama_model_params, offload: Offload) -> list[object]:
    """RPC workers (engine/runtime/rpc.py Offload): the device list (NULL-terminated) and per-device layer
    counts as tensor_split. Returns the ctypes arrays, which must outlive the model load."""
    devs = (ctypes.c_void_p * (len(offload.devices) + 1))(*offload.devices, None)
    split = (ctypes.c_float * llama_cpp.llama_max_devices())(*offload.tensor_split)
    # llama-cpp-python annotates the field as an array; it is a c_void_p, which takes an address
    mparams.devices = ctypes.addressof(devs)  # type: ignore[assignment]
    mparams.tensor_split = split
    mparams.n_gpu_layers = offload.n_gpu_layers
    return [devs, split]


def load_model(path: str, settings: LoadSettings, llama_log: LlamaLog, *,
               n_outputs: int = DEFAULT_OUTPUTS, offload: Offload | None = None) -> LoadedModel:
    """Load a GGUF and create its context; raises KnownError with llama.cpp's own reason.

    n_outputs is the most logits rows one decode call may ask for (a verification batch is
    [last] + K drafts). llama.cpp otherwise reserves logits for every micro-batch position:
    for Gemma 3's 262k vocabulary that is 512 MiB of a 514 MiB compute buffer we never use.
    """
    if not os.path.isfile(path):
        raise KnownError(f"model file not found: {path}")
    mark = llama_log.mark()
    t0 = time.perf_counter()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0x7FFFFFFF if settings.n_gpu_layers < 0 else settings.n_gpu_layers
    # this llama.cpp has no use_mmap/use_mlock fields (ctypes would silently accept them): load_mode
    mparams.load_mode = {(True, False): llama_cpp.LLAMA_LOAD_MODE_MMAP,
                         (True, True): llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK,
                         (False, True): llama_cpp.LLAMA_LOAD_MODE_MLOCK,
                         (False, False): llama_cpp.LLAMA_LOAD_MODE_NONE}[(settings.use_mmap, settings.use_mlock)]
    _keep = apply_offload(mparams, offload) if offload is not None else []  # arrays llama.cpp reads
    if settings.n_cpu_moe:  # routed experts of the first N layers in RAM, the rest of them on the GPU
        from ggufdesk.engine.runtime.devices import experts_on_cpu

        try:
            patterns, overrides = experts_on_cpu(settings.n_cpu_moe)
        except (OSError, AttributeError) as e:
            raise KnownError(f"cannot keep the experts on the CPU with this llama.cpp build: {e}") from None
        mparams.tensor_buft_overrides = ctypes.addressof(overrides)
        _keep += [patterns, overrides]
    try:
        model = internals.LlamaModel(path_model=path, params=mparams, verbose=True)
    except ValueError:
        why = llama_log.reason(llama_log.since(mark)) or "unknown reason"
        raise KnownError(f"llama.cpp could not load {os.path.basename(path)}: {why}") from None
    # An SPM vocab without its 256 byte tokens makes llama.cpp throw std::out_of_range (and
    # terminate) on the first character it cannot spell; find out now, while loading, not mid-chat.
    # (Not LlamaModel.tokenize: it allocates n_ctx_train tokens, and a GGUF claiming a context of
    # 2**31 - 1 made that a MemoryError with an empty message, issue 34.)
    probe = "\x01\u0378\U000e0001 probe".encode()
    out = (llama_cpp.llama_token * (len(probe) + 8))()
    llama_cpp.llama_tokenize(model.vocab, probe, len(probe), out, len(out), False, False)
    n_ctx_train = model.n_ctx_train()
    ctx_mark = llama_log.mark()
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = settings.n_ctx
    cparams.n_batch = settings.n_batch
    cparams.n_ubatch = settings.n_ubatch
    cparams.n_threads = settings.threads
    cparams.n_threads_batch = settings.threads_batch
    cparams.flash_attn_type = FLASH_ATTN_IDS[settings.flash_attn]
    cparams.type_k = KV_TYPE_IDS[settings.type_k]
    cparams.type_v = KV_TYPE_IDS[settings.type_v]
    cparams.no_perf = False
    cparams.n_outputs_max = max(1, n_outputs)
    # several sequences share one pool of n_ctx cells (engine/batching/prefix_cache.py): each may grow to
    # n_ctx, and a shared prefix is one set of cells tagged with several sequence ids
    cparams.n_seq_max = settings.n_parallel
    cparams.kv_unified = True
    try:
        ctx = internals.LlamaContext(model=model, params=cparams, verbose=True)
    except ValueError:
        free(model)
        why = llama_log.reason(llama_log.since(ctx_mark)) or "unknown reason"
        raise KnownError(f"llama.cpp could not create a context for {os.path.basename(path)} "
                         f"(n_ctx={settings.n_ctx}): {why}") from None
    lines = llama_log.since(mark)
    memory = memory_from_log(lines)
    if not memory["weights"]:
        memory["weights"] = llama_cpp.llama_model_size(model.model)
    lm = LoadedModel(path=path, model=model, ctx=ctx, settings=settings, metadata=model.metadata(),
                     memory=memory, load_s=time.perf_counter() - t0, n_outputs=max(1, n_outputs))
    if n_ctx_train and settings.n_ctx > n_ctx_train:
        log.warning("n_ctx %d exceeds the model's training context %d", settings.n_ctx, n_ctx_train)
    return lm
