"""A vision projector (mmproj-*.gguf) beside the text model, through llama.cpp's libmtmd.

libmtmd does what is model-specific: it preprocesses an image as its projector expects (resize,
pad, tiles), wraps it in the text model's own image markers (`<start_of_image>` ... for Gemma 3,
`<|vision_start|>` ... for Qwen), encodes it into embeddings of the text model's width, and decodes
those into a sequence of the KV cache (with non-causal attention where the model wants it).

We keep what the step loop needs: a prompt as tokens in which each image stands as `n_tokens`
placeholder ids (engine/batching/media.py), so the prefix cache compares prompts with images like any
other; and an embedding cache by the image file's sha256, so a conversation's second turn never
encodes its image again even when its KV cells were evicted.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import secrets
import time
from collections import OrderedDict
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from ggufdesk.core.errors import KnownError
from ggufdesk.core.images import Pixels
from ggufdesk.core.projector import ProjectorInfo, read_projector
from ggufdesk.engine.batching.media import ImageSpan, MediaPrompt, placeholder_id
from ggufdesk.engine.runtime.image_parts import vision_refusal
from ggufdesk.engine.runtime.native import LlamaLog, LoadedModel

log = logging.getLogger("ggufdesk.engine")

CACHE_BYTES = 256 * 1024 * 1024  # encoded images kept (a Gemma 3 image: 256 x 2560 floats = 2.6 MB)
_SIZE_RE = re.compile(r"(model size|compute buffer size)\s*=?\s*:?\s*([\d.]+)\s*MiB")
_NULL_CALLBACK = ctypes.cast(ctypes.c_void_p(), mtmd.mtmd_helper_post_decode_callback)  # a NULL function pointer


class EmbeddingCache:
    """Encoded images by the file's sha256, least recently used dropped first beyond max_bytes."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.encodes = 0

    def get(self, key: str) -> np.ndarray | None:
        a = self._items.get(key)
        if a is not None:
            self._items.move_to_end(key)
            self.hits += 1
        return a

    def put(self, key: str, embd: np.ndarray) -> None:
        self.encodes += 1
        if embd.nbytes > self.max_bytes:
            return
        old = self._items.pop(key, None)
        self.bytes -= old.nbytes if old is not None else 0
        self._items[key] = embd
        self.bytes += embd.nbytes
        while self.bytes > self.max_bytes:
            _, a = self._items.popitem(last=False)
            self.bytes -= a.nbytes

    def __len__(self) -> int:
        return len(self._items)


class Projector:
    """libmtmd's context for one loaded text model and its projector file."""

    def __init__(self, path: str, lm: LoadedModel, llama_log: LlamaLog, *, cache_bytes: int = CACHE_BYTES) -> None:
        if not os.path.isfile(path):
            raise KnownError(f"projector file not found: {path}")
        mtmd.mtmd_log_set(llama_log._callback, ctypes.c_void_p(0))
        mtmd.mtmd_helper_log_set(llama_log._callback, ctypes.c_void_p(0))
        self.path, self.lm = path, lm
        # a marker no user text can contain (llama-server's reason for a random one)
        self.marker = f"<__media_{secrets.token_hex(8)}__>"
        self._marker_bytes = self.marker.encode()
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = lm.settings.n_gpu_layers != 0
        params.n_threads = lm.settings.threads_batch or os.cpu_count() or 1
        params.print_timings = False
        params.warmup = True  # sizes the compute buffer now, so the load reports it
        params.media_marker = self._marker_bytes
        mark = llama_log.mark()
        t0 = time.perf_counter()
        ctx = mtmd.mtmd_init_from_file(path.encode(), lm.model.model, params)
        if not ctx:
            why = llama_log.reason(llama_log.since(mark)) or "unknown reason"
            raise KnownError(f"llama.cpp could not load the projector {os.path.basename(path)}: {why}")
        self.ctx = ctx
        self.load_s = time.perf_counter() - t0
        if not mtmd.mtmd_support_vision(ctx):
            self.close()
            raise KnownError(f"{os.path.basename(path)} is not a vision projector (it reads no images)")
        self.memory_bytes = _memory(llama_log.since(mark))
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(ctx))
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(lm.model.model))
        self.cache = EmbeddingCache(cache_bytes)
        self._count_cache: dict[tuple[int, int], int] = {}
        try:
            self.info: ProjectorInfo | None = read_projector(path)
        except KnownError:
            self.info = None

    def native_tokens(self) -> int:
        """Tokens an image of the projector's own size takes, its markers included."""
        side = self.info.image_size if self.info is not None and self.info.image_size else 896
        try:
            return self.count_image(side, side)
        except KnownError:
            return 0

    # ---- prompts --------------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.mrope:
            raise vision_refusal(
                f"{os.path.basename(self.path)} places image tokens with M-RoPE positions (the Qwen2-VL "
                "family); ggufdesk's step loop does not support that yet")

    def tokenize(self, text: str, images: list[Pixels], *, add_special: bool) -> MediaPrompt:
        """The prompt's tokens with each image's placeholders, and the image chunks to encode."""
        self.check_usable()
        bitmaps = [self._bitmap(px.width, px.height, px.rgb, px.sha256) for px in images]
        try:
            chunks = self._tokenize(text, bitmaps, add_special)
        finally:
            for b in bitmaps:
                mtmd.mtmd_bitmap_free(b)
        try:
            return self._prompt(chunks)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)

    def count_image(self, width: int, height: int) -> int:
        """Tokens one image of this size takes in a prompt, its markers included (no pixels needed:
        libmtmd counts on an empty bitmap)."""
        key = (width, height)
        if key not in self._count_cache:
            bm = self._bitmap(width, height, None, "count")
            try:
                chunks = self._tokenize(self.marker, [bm], False)
            finally:
                mtmd.mtmd_bitmap_free(bm)
            try:
                n = sum(int(mtmd.mtmd_input_chunk_get_n_tokens(mtmd.mtmd_input_chunks_get(chunks, i)))
                        for i in range(mtmd.mtmd_input_chunks_size(chunks)))
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
            self._count_cache[key] = n
        return self._count_cache[key]

    def _bitmap(self, width: int, height: int, rgb: bytes | None, key: str) -> int:
        bm: int | None  # libmtmd's mtmd_bitmap * (c_void_p: an int, None for NULL)
        if rgb is not None:
            buf = (ctypes.c_ubyte * len(rgb)).from_buffer_copy(rgb)  # libmtmd copies it
            bm = mtmd.mtmd_bitmap_init(width, height, buf)
        else:
            bm = mtmd.mtmd_bitmap_init(width, height, None)
        if not bm:
            raise vision_refusal(f"libmtmd refused a {width} x {height} image")
        mtmd.mtmd_bitmap_set_id(bm, key.encode())
        return bm

    def _tokenize(self, text: str, bitmaps: list[int], add_special: bool) -> int:
        raw = text.encode("utf-8")
        inp = mtmd.mtmd_input_text()
        inp.text, inp.text_len, inp.add_special, inp.parse_special = raw, len(raw), add_special, True
        arr = (ctypes.c_void_p * max(1, len(bitmaps)))(*bitmaps)
        chunks: int = mtmd.mtmd_input_chunks_init()  # mtmd_input_chunks * (c_void_p)
        rc = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
        if rc != 0:
            mtmd.mtmd_input_chunks_free(chunks)
            why = {1: "the number of images does not match the image markers in the prompt",
                   2: "the projector could not preprocess an image"}.get(rc, f"error {rc}")
            raise vision_refusal(f"the prompt with its images cannot be tokenized: {why}")
        return chunks

    def _prompt(self, chunks: int) -> MediaPrompt:
        tokens: list[int] = []
        spans: list[ImageSpan] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(c)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                tokens.extend(ptr[j] for j in range(n.value))
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise vision_refusal("only images are supported, not audio")
            key = (mtmd.mtmd_input_chunk_get_id(c) or b"").decode()
            n_tok = int(mtmd.mtmd_input_chunk_get_n_tokens(c))
            spans.append(ImageSpan(start=len(tokens), n_tokens=n_tok, key=key, handle=mtmd.mtmd_input_chunk_copy(c)))
            tokens.extend([placeholder_id(key)] * n_tok)
        prompt = MediaPrompt(tokens=tokens, spans=spans, projector=self)  # (frees the chunks when dropped)
        self._check_spans(spans, len(tokens))
        return prompt

    def _check_spans(self, spans: list[ImageSpan], n_prompt: int) -> None:
        n_ubatch = self.lm.settings.n_ubatch
        for s in spans:
            if self.non_causal and s.n_tokens > n_ubatch:
                raise vision_refusal(f"an image takes {s.n_tokens} tokens, and this model reads an image in one "
                                     f"micro-batch: load it with a micro-batch (n_ubatch) of at least {s.n_tokens}")
            if s.start + s.n_tokens >= n_prompt:
                raise vision_refusal("a prompt cannot end with an image: put text after it")

    # ---- encoding and decoding ------------------------------------------------------------------

    def embedding(self, span: ImageSpan) -> tuple[np.ndarray, bool]:
        """The image's embeddings (n_tokens x n_embd floats), and whether they came from the cache."""
        hit = self.cache.get(span.key)
        if hit is not None and hit.size == span.n_tokens * self.n_embd:
            return hit, True
        if not span.handle:
            raise KnownError("the image's data was released before it was encoded")  # a bug of ours
        rc = mtmd.mtmd_encode_chunk(self.ctx, span.handle)
        if rc != 0:
            raise KnownError(f"the projector could not encode the image (error {rc})")
        out = mtmd.mtmd_get_output_embd(self.ctx)
        embd = np.ctypeslib.as_array(out, shape=(span.n_tokens * self.n_embd,)).copy()
        self.cache.put(span.key, embd)
        return embd, False

    def decode(self, span: ImageSpan, embd: np.ndarray, *, n_past: int, seq_id: int) -> int:
        """Decode an image's embeddings into sequence seq_id from position n_past; llama_decode's
        return code (0 ok, 2 aborted by the abort callback)."""
        new_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_decode_image_chunk(
            self.ctx, self.lm.ctx.ctx, span.handle, embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            n_past, seq_id, self.lm.settings.n_batch, ctypes.byref(new_past), _NULL_CALLBACK, None)
        return int(rc)

    @staticmethod
    def release(span: ImageSpan) -> None:
        """Free the image's chunk (its preprocessed pixels): once decoded, or when the prompt is dropped."""
        chunk, span.handle = span.handle, None
        if chunk:
            mtmd.mtmd_input_chunk_free(chunk)

    def stats(self) -> dict[str, Any]:
        return {"encoded": self.cache.encodes, "cache_hits": self.cache.hits, "cached": len(self.cache),
                "cache_bytes": self.cache.bytes}

    def close(self) -> None:
        if self.ctx:
            mtmd.mtmd_free(self.ctx)
            self.ctx = None


def _memory(lines: list[str]) -> int:
    """The projector's weights and compute buffer in bytes, from libmtmd's log."""
    total = 0
    for line in lines:
        m = _SIZE_RE.search(line)
        if m and "metadata" not in line:
            total += int(float(m.group(2)) * 1024 * 1024)
    return total
