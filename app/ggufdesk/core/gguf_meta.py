"""GGUF metadata and tensor table from a local file, a split set, or a remote file's header only."""
from __future__ import annotations

import logging
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

import gguf
import numpy as np

from ggufdesk.core.errors import KnownError, network_errors

log = logging.getLogger("ggufdesk.gguf")

# gguf's GGUFReader memory-maps the whole file (tensor data views included) and walks every array
# element through numpy: 8.9 s for the starter model's 262k-token vocabulary, and it cannot read a
# header-only prefix of a remote file. So we stream the header ourselves with gguf's own constants
# (value types, quant block sizes, key names, file types); tests check the result against GGUFReader.

CHUNK = 1 << 20
# Limits on what a header may claim. Real models stay far below them (the largest vocabularies are
# ~260k tokens, the deepest models a few hundred layers, headers a few tens of MB); a file beyond
# them is refused with a GGUFFormatError before any memory or time is spent on what it claims.
MAX_HEADER_BYTES = 256 << 20  # no real header is this big; a bigger one is a broken file
MAX_STRING = 64 << 20
MAX_NAME = 4096  # metadata keys and tensor names (llama.cpp's own limit for tensor names is 64)
MAX_COUNT = 1 << 31
MAX_KV = 100_000
MAX_TENSORS = 200_000
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DEPTH = 3  # arrays of arrays of arrays
MAX_WALKED = 2_000_000  # string-array items skipped one by one per header (vocab + merges: < 1M)
MAX_KEPT = 200_000  # array items kept in memory per header (real models: a few thousand)
MAX_TENSOR_BYTES = 1 << 50
KEEP_ARRAY = 4096  # arrays longer than this (the vocabulary) keep only their length
MAX_LAYERS = KEEP_ARRAY  # per-layer arrays are kept whole, so a model has at most this many layers
# Architectures that only encode (no causal LM head): they compute embeddings and cannot generate.
EMBEDDING_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert",
                             "modern-bert", "eurobert", "gemma-embedding", "t5encoder"})


def embedding_only(arch: str, pooling: object) -> bool:
    """A model that only computes embeddings: an encoder, or one whose `<arch>.pooling_type` is mean, CLS or last."""
    return arch in EMBEDDING_ARCHS or (not isinstance(pooling, bool) and pooling in (1, 2, 3, "1", "2", "3"))

SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
LAYER_RE = re.compile(r"^blk\.(\d+)\.")

# llama.cpp's default sliding-window pattern per architecture (models/*.cpp load_swa_pattern):
# (n_pattern, dense_first). Architectures not listed keep a full KV cache for every layer.
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma-embedding": (6, False), "gemma3n": (5, False),
    "cohere2": (4, False), "cohere2moe": (4, True), "llama4": (4, False), "gpt-oss": (2, False),
    "openai-moe": (2, False), "exaone4": (4, False), "olmo2": (4, False), "afmoe": (4, False),
    "smallthinker": (4, True), "plamo3": (8, False),
}

_SCALARS: dict[int, struct.Struct] = {
    gguf.GGUFValueType.UINT8: struct.Struct("<B"), gguf.GGUFValueType.INT8: struct.Struct("<b"),
    gguf.GGUFValueType.UINT16: struct.Struct("<H"), gguf.GGUFValueType.INT16: struct.Struct("<h"),
    gguf.GGUFValueType.UINT32: struct.Struct("<I"), gguf.GGUFValueType.INT32: struct.Struct("<i"),
    gguf.GGUFValueType.FLOAT32: struct.Struct("<f"), gguf.GGUFValueType.BOOL: struct.Struct("<?"),
    gguf.GGUFValueType.UINT64: struct.Struct("<Q"), gguf.GGUFValueType.INT64: struct.Struct("<q"),
    gguf.GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_NP = {gguf.GGUFValueType.UINT8: "<u1", gguf.GGUFValueType.INT8: "<i1", gguf.GGUFValueType.UINT16: "<u2",
       gguf.GGUFValueType.INT16: "<i2", gguf.GGUFValueType.UINT32: "<u4", gguf.GGUFValueType.INT32: "<i4",
       gguf.GGUFValueType.FLOAT32: "<f4", gguf.GGUFValueType.BOOL: "?", gguf.GGUFValueType.UINT64: "<u8",
       gguf.GGUFValueType.INT64: "<i8", gguf.GGUFValueType.FLOAT64: "<f8"}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class GGUFFormatError(KnownError):
    """The file is not a readable GGUF (bad magic, truncated, nonsense sizes)."""


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """A long metadata array (e.g. the vocabulary) whose items were skipped, not kept."""

    item_type: str
    count: int


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    ggml_type: str  # "Q4_K", "F16", ...
    shape: tuple[int, ...]  # llama.cpp's ne order (fastest dimension first)
    n_bytes: int
    layer: int | None  # N for blk.N.*, else None
    offset: int = 0  # absolute byte offset in its file
    file_index: int = 0  # which split file holds it


@dataclass(frozen=True, slots=True, kw_only=True)
class GGUFInfo:
    """What the planner and the UI need to know about a model file."""

    source: str
    architecture: str
    name: str | None
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer
    head_dim_k: int
    head_dim_v: int
    n_swa: int  # sliding window, 0 = none
    swa_layers: tuple[bool, ...]  # per layer: is this a sliding-window layer
    context_length: int
    n_vocab: int
    n_expert: int
    n_expert_used: int
    chat_template: str | None
    file_type: str | None  # "Q4_K_M", "F16", ...
    file_bytes: int  # all splits together
    split_count: int
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, Any] = field(repr=False)

    @property
    def weight_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    def layer_bytes(self) -> list[int]:
        out = [0] * self.n_layer
        for t in self.tensors:
            if t.layer is not None and 0 <= t.layer < self.n_layer:
                out[t.layer] += t.n_bytes
        return out

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        n = self.n_params
        return 8.0 * self.weight_bytes / n if n else 0.0


# --------------------------------------------------------------------------- header parsing


class _Stream:
    """Sequential reads over a binary file object, fetched in chunks (cheap on HTTP range reads)."""

    def __init__(self, f: IO[bytes], label: str, limit: int) -> None:
        self.f, self.label, self.limit = f, label, limit
        self.buf = bytearray()
        self.pos = 0
        self.base = 0  # absolute offset of buf[0]
        self.walked = 0  # array items read one by one
        self.kept = 0  # array items kept in memory

    def count_items(self, n: int, *, kept: bool) -> None:
        self.walked += 0 if kept else n
        self.kept += n if kept else 0
        if self.walked > MAX_WALKED or self.kept > MAX_KEPT:
            raise GGUFFormatError(f"{self.label}: the GGUF header holds more array items than any model "
                                  f"(over {MAX_WALKED if self.walked > MAX_WALKED else MAX_KEPT}); "
                                  "the file is corrupt")

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def need(self, n: int) -> None:
        while len(self.buf) - self.pos < n:
            if self.base + len(self.buf) >= self.limit:
                raise GGUFFormatError(
                    f"{self.label}: the GGUF header is larger than {self.limit >> 20} MB; "
                    "the file is broken or not a model"
                )
            chunk = self.f.read(CHUNK)
            if not chunk:
                raise GGUFFormatError(
                    f"{self.label}: the file ends inside its GGUF header (after {self.base + len(self.buf)} "
                    "bytes); it is truncated — download it again"
                )
            if self.pos > 4 * CHUNK:
                del self.buf[: self.pos]
                self.base += self.pos
                self.pos = 0
            self.buf += chunk

    def unpack(self, s: struct.Struct) -> Any:
        self.need(s.size)
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def take(self, n: int) -> bytes:
        self.need(n)
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return b

    def skip(self, n: int) -> None:
        self.need(n)
        self.pos += n

    def string(self, limit: int = MAX_STRING) -> str:
        n = self.unpack(_U64)
        if n > limit:
            raise GGUFFormatError(f"{self.label}: a {n}-byte string in the GGUF header; the file is corrupt")
        raw = self.take(n)
        return raw.decode("utf-8", errors="replace")


def _value_type(s: _Stream, raw: int, key: str) -> gguf.GGUFValueType:
    try:
        return gguf.GGUFValueType(raw)
    except ValueError:
        raise GGUFFormatError(f"{s.label}: metadata key {key!r} has unknown value type {raw}; "
                              "the file is corrupt") from None


def _read_value(s: _Stream, vtype: gguf.GGUFValueType, key: str, depth: int = 0) -> Any:
    if vtype == gguf.GGUFValueType.STRING:
        return s.string()
    if vtype in _SCALARS:
        return s.unpack(_SCALARS[vtype])
    if vtype != gguf.GGUFValueType.ARRAY:
        raise GGUFFormatError(f"{s.label}: metadata key {key!r} has unknown value type {vtype}")
    if depth >= MAX_DEPTH:
        raise GGUFFormatError(f"{s.label}: metadata key {key!r} nests arrays more than {MAX_DEPTH} deep; "
                              "the file is corrupt")
    itype = _value_type(s, s.unpack(_U32), key)
    count = s.unpack(_U64)
    if count > MAX_COUNT:
        raise GGUFFormatError(f"{s.label}: metadata array {key!r} claims {count} items; the file is corrupt")
    keep = count <= KEEP_ARRAY
    if itype == gguf.GGUFValueType.ARRAY and not keep:
        raise GGUFFormatError(f"{s.label}: metadata key {key!r} holds {count} nested arrays; "
                              "the file is corrupt")
    if itype in _NP:
        dt = np.dtype(_NP[itype])
        s.need(dt.itemsize * count)
        if not keep:
            s.skip(dt.itemsize * count)
            return ArrayInfo(itype.name, count)
        s.count_items(count, kept=True)
        arr = np.frombuffer(bytes(s.buf[s.pos : s.pos + dt.itemsize * count]), dtype=dt)
        s.pos += dt.itemsize * count
        return arr.tolist()
    s.count_items(count, kept=keep)
    if itype == gguf.GGUFValueType.STRING:
        if not keep:
            for _ in range(count):
                n = s.unpack(_U64)
                if n > MAX_STRING:
                    raise GGUFFormatError(f"{s.label}: a {n}-byte string in {key!r}; the file is corrupt")
                s.skip(n)
            return ArrayInfo("STRING", count)
        return [s.string() for _ in range(count)]
    return [_read_value(s, itype, key, depth + 1) for _ in range(count)]  # nested arrays: rare, kept


@dataclass(slots=True)
class _Header:
    kv: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int


def _quant_type(raw: int, label: str, name: str) -> gguf.GGMLQuantizationType:
    try:
        return gguf.GGMLQuantizationType(raw)
    except ValueError:
        raise GGUFFormatError(
            f"{label}: tensor {name!r} uses tensor type {raw}, which this version does not know; "
            "the file is corrupt or needs a newer ggufdesk"
        ) from None


def parse_header(f: IO[bytes], *, label: str, file_index: int = 0,
                 limit: int = MAX_HEADER_BYTES) -> _Header:
    """Parse the GGUF header (metadata + tensor infos) from the start of a binary stream."""
    s = _Stream(f, label, limit)
    try:
        magic = s.take(4)
    except GGUFFormatError:
        raise GGUFFormatError(f"{label}: the file is empty or too short to be a GGUF model") from None
    if magic != b"GGUF":
        raise GGUFFormatError(f"{label}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = s.unpack(_U32)
    if version not in (2, 3):
        raise GGUFFormatError(f"{label}: GGUF version {version} is not supported (only 2 and 3)")
    n_tensors, n_kv = s.unpack(_U64), s.unpack(_U64)
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise GGUFFormatError(f"{label}: the header claims {n_tensors} tensors and {n_kv} keys; "
                              "the file is corrupt")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = s.string(MAX_NAME)
        kv[key] = _read_value(s, _value_type(s, s.unpack(_U32), key), key)
    raw_tensors = []
    for _ in range(n_tensors):
        name = s.string(MAX_NAME)
        n_dims = s.unpack(_U32)
        if n_dims > MAX_DIMS:
            raise GGUFFormatError(f"{label}: tensor {name!r} has {n_dims} dimensions; the file is corrupt")
        shape = tuple(s.unpack(_U64) for _ in range(n_dims))
        qtype = _quant_type(s.unpack(_U32), label, name)
        raw_tensors.append((name, shape, qtype, s.unpack(_U64)))
    align = kv.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise GGUFFormatError(f"{label}: general.alignment = {align!r} is not a power of two")
    data_offset = s.offset + (-s.offset % align)
    tensors = []
    for name, shape, qtype, rel in raw_tensors:
        n_bytes = _tensor_bytes(label, name, shape, qtype)
        if rel % align or rel > MAX_TENSOR_BYTES:
            raise GGUFFormatError(f"{label}: tensor {name!r} starts at offset {rel}, which is not "
                                  f"{align}-byte aligned or lies beyond any model; the file is corrupt")
        m = LAYER_RE.match(name)
        tensors.append(TensorInfo(name, qtype.name, shape, n_bytes,
                                  int(m.group(1)) if m else None, data_offset + rel, file_index))
    return _Header(kv, tensors, data_offset)


def _tensor_bytes(label: str, name: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> int:
    """Bytes of a tensor's data, computed exactly (Python ints) and checked before use."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if any(d <= 0 for d in shape):
        raise GGUFFormatError(f"{label}: tensor {name!r} has a zero dimension {list(shape)}; the file is corrupt")
    if shape and shape[0] % block:
        raise GGUFFormatError(f"{label}: tensor {name!r} row size {shape[0]} is not a multiple of "
                              f"its {qtype.name} block size {block}")
    n_bytes = math.prod(shape) // block * type_size
    if n_bytes > MAX_TENSOR_BYTES:
        raise GGUFFormatError(f"{label}: tensor {name!r} claims dimensions {list(shape)} "
                              f"({n_bytes} bytes); the file is corrupt")
    return n_bytes


def _check_data(h: _Header, size: int | None, label: str) -> None:
    if size is None or not h.tensors:
        return
    end = max(t.offset + t.n_bytes for t in h.tensors)
    if end > size:
        raise GGUFFormatError(
            f"{label}: the file is truncated — its tensors need {end} bytes but it has {size}; "
            "download it again"
        )


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True, slots=True)
class _Part:
    label: str
    size: int | None
    opener: Any  # () -> context manager yielding a binary file


def split_parts(name: str) -> tuple[str, int, int] | None:
    """('stem', no, count) for 'stem-0000k-of-0000n.gguf', else None."""
    m = SPLIT_RE.match(name)
    return (m["stem"], int(m["no"]), int(m["count"])) if m else None


def split_names(name: str) -> list[str]:
    """Every part of the split set that `name` ('dir/stem-0000k-of-0000n.gguf') belongs to, in
    order and with the same folder; [name] for a file that is not split."""
    folder, slash, base = name.rpartition("/")
    sp = split_parts(base)
    if sp is None:
        return [name]
    stem, _, count = sp
    return [f"{folder}{slash}{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _local_parts(path: Path) -> list[_Part]:
    if not path.exists():
        raise KnownError(f"{path}: no such file")
    if path.is_dir():
        raise KnownError(f"{path}: is a folder, not a GGUF file")
    paths = [path.with_name(n) for n in split_names(path.name)]
    if len(paths) > 1:
        missing = [p.name for p in paths if not p.exists()]
        if missing:
            raise KnownError(f"{path}: split model is incomplete, missing {', '.join(missing)}")
    return [_Part(str(p), p.stat().st_size, (lambda p=p: open(p, "rb"))) for p in paths]


def parse_hf_url(url: str) -> tuple[str, str, str | None]:
    """'hf://owner/repo[@rev]/path/file.gguf' -> (repo_id, path_in_repo, revision)."""
    rest = url.removeprefix("hf://").strip("/")
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts):
        raise KnownError(f"{url}: expected hf://owner/repo/file.gguf")
    repo, path = "/".join(parts[:2]), "/".join(parts[2:])
    rev = None
    if "@" in repo:
        repo, rev = repo.split("@", 1)
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except ValueError as e:  # HFValidationError
        raise KnownError(f"{url}: {repo!r} is not a repository id (owner/name): {e}") from None
    if not rev and rev is not None:
        raise KnownError(f"{url}: empty revision after '@'")
    return repo, path, rev


def hf_filesystem() -> Any:
    """A HfFileSystem on the endpoint in effect now (HF_ENDPOINT is read at call time, not import)."""
    from huggingface_hub import HfFileSystem

    return HfFileSystem(endpoint=os.environ.get("HF_ENDPOINT") or None, skip_instance_cache=True)


def _remote_parts(url: str) -> list[_Part]:
    repo, path, rev = parse_hf_url(url)
    fs = hf_filesystem()
    names = split_names(path)
    parts = []
    unreachable: tuple[type[BaseException], ...] = (OSError, ValueError, *network_errors())
    for name in names:
        full = f"{repo}@{rev}/{name}" if rev else f"{repo}/{name}"
        try:
            size = int(fs.info(full)["size"])
        except FileNotFoundError:
            raise KnownError(f"hf://{repo}/{name}: no such file in the repository") from None
        except unreachable as e:  # ValueError: the hub's own URI errors
            raise KnownError(f"hf://{repo}/{name}: could not reach the hub or read the repository ({e})") from e
        except Exception as e:  # huggingface_hub's HTTP errors (gated, 5xx, ...)
            if not type(e).__module__.startswith("huggingface_hub"):
                raise
            raise KnownError(f"hf://{repo}/{name}: the hub refused the request ({e})") from e
        parts.append(_Part(f"hf://{repo}/{name}", size,
                           (lambda full=full: fs.open(full, "rb", block_size=CHUNK, cache_type="readahead"))))
    return parts


# --------------------------------------------------------------------------- interpretation


class _Checker:
    """Reads numbers out of the metadata, each one checked (a whole number within bounds) before use."""

    def __init__(self, source: str, kv: dict[str, Any]) -> None:
        self.source, self.kv = source, kv

    def bad(self, key: str, v: Any, want: str) -> GGUFFormatError:
        shown = repr(v) if not isinstance(v, list) else f"a list of {len(v)} items"
        return GGUFFormatError(f"{self.source}: {key} is {shown[:80]}; expected {want}. "
                               "The file is corrupt or not a model this app can plan")

    def num(self, key: str, v: Any, lo: int, hi: int) -> int:
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.bad(key, v, f"a whole number from {lo} to {hi}")
        return v

    def get(self, key: str, lo: int, hi: int, default: int = 0) -> int:
        v = self.kv.get(key)
        return default if v is None else self.num(key, v, lo, hi)

    def per_layer(self, key: str, n_layer: int, default: int, hi: int) -> tuple[int, ...]:
        v = self.kv.get(key)
        if isinstance(v, ArrayInfo):
            raise self.bad(key, f"an array of {v.count} items", f"one value per layer ({n_layer})")
        if isinstance(v, list):
            vals = [self.num(key, x, 0, hi) for x in v][:n_layer]
            return tuple(vals + [vals[-1] if vals else default] * (n_layer - len(vals)))
        return (self.num(key, v, 0, hi) if v is not None else default,) * n_layer


def _swa_layers(c: _Checker, arch: str, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    if n_swa <= 0:
        return (False,) * n_layer
    key = f"{arch}.attention.sliding_window_pattern"
    pat = c.kv.get(key)
    if isinstance(pat, list):
        vals = [bool(x) for x in pat][:n_layer]
        return tuple(vals + [False] * (n_layer - len(vals)))
    if pat is not None:
        pat = c.num(key, pat, 0, MAX_LAYERS)
    if arch not in SWA_PATTERNS and pat is None:
        return (False,) * n_layer  # llama.cpp does not use a sliding window here: full cache
    n_pattern, dense_first = SWA_PATTERNS.get(arch, (pat or 0, False))
    if pat is not None:
        n_pattern = pat
    if dense_first:
        return tuple(n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer))
    return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))


def _file_type_name(ft: Any) -> str | None:
    if not isinstance(ft, int):
        return None
    try:
        name = gguf.LlamaFileType(ft).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _interpret(source: str, kv: dict[str, Any], tensors: list[TensorInfo], file_bytes: int,
               split_count: int) -> GGUFInfo:
    arch = _architecture(source, kv, tensors)
    c = _Checker(source, kv)
    n_layer = _layer_count(source, kv, arch)
    n_embd = c.get(f"{arch}.embedding_length", 0, 1 << 20)
    n_head, n_head_kv = _heads(c, arch, n_layer)
    head_k = c.get(f"{arch}.attention.key_length", 0, 1 << 16) or (n_embd // n_head if n_head else 0)
    head_v = c.get(f"{arch}.attention.value_length", 0, 1 << 16) or head_k
    n_swa = _sliding_window(c, arch)
    n_ff = _feed_forward_length(c, arch, n_layer)
    n_vocab = _vocab_size(c, arch, tensors)
    n_expert, n_expert_used = _experts(c, arch)
    tmpl = kv.get("tokenizer.chat_template")
    name = kv.get("general.name")
    return GGUFInfo(
        source=source, architecture=arch, name=name if isinstance(name, str) else None, n_layer=n_layer,
        n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_k, head_dim_v=head_v,
        n_swa=n_swa, swa_layers=_swa_layers(c, arch, n_layer, n_swa),
        context_length=c.get(f"{arch}.context_length", 0, 1 << 31), n_vocab=n_vocab,
        n_expert=n_expert, n_expert_used=n_expert_used,
        chat_template=tmpl if isinstance(tmpl, str) else None,
        file_type=_file_type_name(kv.get("general.file_type")), file_bytes=file_bytes,
        split_count=split_count, tensors=tuple(tensors), metadata=kv,
    )


def _architecture(source: str, kv: dict[str, Any], tensors: list[TensorInfo]) -> str:
    """The model's architecture; refuses a file that names none or holds no tensors (not a model)."""
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFFormatError(f"{source}: no general.architecture key; not a llama.cpp model file")
    if not tensors:
        raise GGUFFormatError(f"{source}: the file holds no tensors (a vocabulary-only GGUF?); not a model")
    return arch


def _layer_count(source: str, kv: dict[str, Any], arch: str) -> int:
    n_layer = kv.get(f"{arch}.block_count")
    if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer <= 0:
        raise GGUFFormatError(f"{source}: {arch}.block_count is {n_layer!r}; the model has no layers")
    if n_layer > MAX_LAYERS:
        raise GGUFFormatError(f"{source}: {arch}.block_count is {n_layer}; no model has more than "
                              f"{MAX_LAYERS} layers, the file is corrupt")
    return n_layer


def _heads(c: _Checker, arch: str, n_layer: int) -> tuple[int, tuple[int, ...]]:
    """(query heads: the most of any layer, KV heads per layer: the query heads unless given)."""
    heads = c.per_layer(f"{arch}.attention.head_count", n_layer, 0, 1 << 16)
    n_head = max(heads) if heads else 0
    return n_head, c.per_layer(f"{arch}.attention.head_count_kv", n_layer, n_head, 1 << 16)


def _sliding_window(c: _Checker, arch: str) -> int:
    """The sliding window in tokens, 0 = none (a per-layer list is not a window size: none)."""
    key = f"{arch}.attention.sliding_window"
    return 0 if isinstance(c.kv.get(key), list) else c.get(key, 0, 1 << 31)


def _feed_forward_length(c: _Checker, arch: str, n_layer: int) -> int:
    """The feed-forward width; per layer: the widest."""
    key = f"{arch}.feed_forward_length"
    if isinstance(c.kv.get(key), list):
        return max(c.per_layer(key, n_layer, 0, 1 << 24))
    return c.get(key, 0, 1 << 24)


def _vocab_size(c: _Checker, arch: str, tensors: list[TensorInfo]) -> int:
    """`<arch>.vocab_size`, else the tokenizer's token count, else token_embd's rows (0 if none says)."""
    tok = c.kv.get("tokenizer.ggml.tokens")
    n_tok = tok.count if isinstance(tok, ArrayInfo) else len(tok) if isinstance(tok, list) else 0
    n_vocab = c.get(f"{arch}.vocab_size", 0, 1 << 24) or c.num("tokenizer.ggml.tokens (count)", n_tok, 0, 1 << 24)
    emb = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if not n_vocab and emb is not None and len(emb.shape) == 2:
        n_vocab = c.num("token_embd.weight (rows)", emb.shape[1], 0, 1 << 24)
    return n_vocab


def _experts(c: _Checker, arch: str) -> tuple[int, int]:
    """(experts, experts used per token); 0, 0 for a dense model."""
    n_expert = c.get(f"{arch}.expert_count", 0, 1 << 16)
    n_expert_used = c.get(f"{arch}.expert_used_count", 0, 1 << 16)
    if n_expert and n_expert_used > n_expert:
        raise c.bad(f"{arch}.expert_used_count", n_expert_used, f"at most {arch}.expert_count ({n_expert})")
    return n_expert, n_expert_used


def _read_parts(source: str, parts: list[_Part], limit: int) -> GGUFInfo:
    kv: dict[str, Any] = {}
    tensors: list[TensorInfo] = []
    unreadable: tuple[type[BaseException], ...] = (OSError, *network_errors())
    for i, part in enumerate(parts):
        try:
            with part.opener() as f:
                h = parse_header(f, label=part.label, file_index=i, limit=limit)
        except KnownError:
            raise
        except unreadable as e:
            raise KnownError(f"{part.label}: could not read the file ({e})") from e
        _check_data(h, part.size, part.label)
        if i == 0:
            kv = h.kv
        tensors += h.tensors
    if len(parts) > 1:
        want = kv.get("split.tensors.count")
        if isinstance(want, int) and want != len(tensors):
            raise GGUFFormatError(f"{source}: the split files hold {len(tensors)} tensors, "
                                  f"the first one says {want}; the set is mixed or incomplete")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise GGUFFormatError(f"{source}: a tensor name appears twice; the file is corrupt")
    total = sum(p.size or 0 for p in parts)
    return _interpret(source, kv, tensors, total, len(parts))


def read_gguf(source: str | os.PathLike[str], *, limit: int = MAX_HEADER_BYTES) -> GGUFInfo:
    """Read a model's metadata: a local path (split sets found from any part) or hf://repo/file.gguf.

    Remote files are read from their header only (HTTP range reads, a few MB).
    """
    src = str(source)
    try:
        if src.startswith("hf://"):
            return _read_parts(src, _remote_parts(src), limit)
        return _read_parts(src, _local_parts(Path(src).expanduser()), limit)
    except KnownError:
        raise
    except OSError as e:  # permissions, a symlink loop, a vanished file
        raise KnownError(f"{src}: could not read the file ({e.strerror or e})") from e
    except (RecursionError, MemoryError, OverflowError, ValueError, TypeError, ZeroDivisionError,
            struct.error, IndexError, KeyError) as e:
        # The checks above should catch every malformed header; this is the net under them.
        log.warning("unexpected %s reading %s", type(e).__name__, src, exc_info=True)
        raise GGUFFormatError(f"{src}: the GGUF header could not be read ({type(e).__name__}: "
                              f"{str(e)[:200]}); the file is corrupt") from None


def read_header(source: str | os.PathLike[str], *, limit: int = MAX_HEADER_BYTES) -> tuple[dict[str, Any],
                                                                                     list[TensorInfo], int]:
    """The metadata, tensor table and size of a single-file GGUF of any kind (a vision projector has
    no layers of a language model, so read_gguf refuses it); local path or hf://repo/file.gguf."""
    src = str(source)
    parts = _remote_parts(src) if src.startswith("hf://") else _local_parts(Path(src).expanduser())
    part = parts[0]
    unreadable: tuple[type[BaseException], ...] = (OSError, *network_errors())
    try:
        with part.opener() as f:
            h = parse_header(f, label=part.label, limit=limit)
    except KnownError:
        raise
    except unreadable as e:
        raise KnownError(f"{part.label}: could not read the file ({e})") from e
    except (RecursionError, MemoryError, OverflowError, ValueError, TypeError, struct.error, IndexError) as e:
        raise GGUFFormatError(f"{src}: the GGUF header could not be read ({type(e).__name__}); "
                              "the file is corrupt") from None
    _check_data(h, part.size, part.label)
    return h.kv, h.tensors, part.size or 0


def iter_layers(info: GGUFInfo) -> Iterator[tuple[int, list[TensorInfo]]]:
    by: dict[int, list[TensorInfo]] = {}
    for t in info.tensors:
        if t.layer is not None:
            by.setdefault(t.layer, []).append(t)
    yield from sorted(by.items())
