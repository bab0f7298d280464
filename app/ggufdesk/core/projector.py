"""Vision projectors (mmproj-*.gguf): what one is, what it costs, and which one pairs with a model.

A vision model on the hub is two files: the language model and its projector (llama.cpp's
`mmproj`), which turns an image into embeddings of the language model's width. This reads a
projector's header (local or hf://, a few KB), estimates its memory and the tokens one image takes
(the planner adds both), and finds the projector that belongs to a model: beside it on disk, or in
the same repository, the precision that suits the model's quant.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import GGUFFormatError, read_header

# Projector types whose image tokens are the patch grid pooled n_merge x n_merge (clip.cpp
# clip_n_output_tokens), and the default n_merge of those that have one.
_POOLED = {"gemma3": 4, "idefics3": 2, "internvl": 2, "llama4": 2, "lfm2": 2, "qwen2vl_merger": 2,
           "qwen2.5vl_merger": 2, "qwen3vl_merger": 2, "pixtral": 1, "gemma3nv": 1}
_MROPE = ("qwen2vl", "qwen2.5vl", "qwen3vl", "qwen25vl", "qwen2.5o")
# pick order when a repository has several: the precision a model's own weights suit best
_PRECISIONS = ("f16", "bf16", "q8_0", "f32")


@dataclass(frozen=True, slots=True)
class ProjectorInfo:
    source: str
    projector_type: str
    image_size: int  # the side of the image it reads (after its own resize)
    patch_size: int
    n_merge: int  # patches pooled per side into one token (1: none)
    n_embd: int  # the vision encoder's width
    n_layer: int
    n_head: int
    n_ff: int
    weight_bytes: int
    file_bytes: int

    @property
    def n_patches(self) -> int:
        side = self.image_size // self.patch_size if self.patch_size else 0
        return side * side

    @property
    def image_tokens(self) -> int:
        """Tokens one image of the projector's own size takes (markers aside)."""
        return max(1, self.n_patches // (self.n_merge * self.n_merge)) if self.n_patches else 0

    @property
    def mrope(self) -> bool:
        """Qwen2-VL-family projectors place image tokens with M-RoPE (not supported by our step loop)."""
        return self.projector_type.startswith(_MROPE)

    def compute_bytes(self, flash_attn: bool = True) -> int:
        """The encoder's working memory for one image (an estimate: activations in f32, the attention
        scores too when flash attention is off)."""
        n = self.n_patches
        act = n * (self.n_ff + 4 * self.n_embd) * 4 * 2
        scores = 0 if flash_attn else self.n_head * n * n * 4
        return act + scores

    def memory_bytes(self, flash_attn: bool = True) -> int:
        return self.weight_bytes + self.compute_bytes(flash_attn)


def _u32(kv: dict[str, Any], key: str, default: int = 0) -> int:
    v = kv.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 24:
        raise GGUFFormatError(f"{key} is {v!r}, not a size")
    return v


def read_projector(source: str | Path) -> ProjectorInfo:
    """A projector's header; KnownError if the file is not a vision projector."""
    kv, tensors, size = read_header(str(source))
    if kv.get("general.architecture") != "clip":
        raise KnownError(f"{source}: not a vision projector (its architecture is "
                         f"{kv.get('general.architecture')!r}, not 'clip')")
    if not kv.get("clip.has_vision_encoder"):
        raise KnownError(f"{source}: this projector has no vision encoder (audio only?)")
    ptype = kv.get("clip.projector_type") or kv.get("clip.vision.projector_type") or "mlp"
    if not isinstance(ptype, str):
        raise GGUFFormatError(f"{source}: clip.projector_type is {ptype!r}")
    merge = kv.get("clip.vision.projector.scale_factor", kv.get("clip.vision.spatial_merge_size"))
    n_merge = merge if isinstance(merge, int) and not isinstance(merge, bool) and merge > 0 else _POOLED.get(ptype, 1)
    return ProjectorInfo(
        source=str(source), projector_type=ptype, image_size=_u32(kv, "clip.vision.image_size"),
        patch_size=_u32(kv, "clip.vision.patch_size"), n_merge=n_merge,
        n_embd=_u32(kv, "clip.vision.embedding_length"), n_layer=_u32(kv, "clip.vision.block_count"),
        n_head=_u32(kv, "clip.vision.attention.head_count"), n_ff=_u32(kv, "clip.vision.feed_forward_length"),
        weight_bytes=sum(t.n_bytes for t in tensors), file_bytes=size)


# ---- which projector belongs to a model ----------------------------------------------------------

def is_projector_name(name: str) -> bool:
    """Projector files as the hub names them: mmproj-*.gguf, *-mmproj-*.gguf, *.mmproj.gguf."""
    base = name.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and "mmproj" in base


def _precision(name: str) -> int:
    low = name.lower()
    for i, p in enumerate(_PRECISIONS):
        if re.search(rf"(^|[-_.]){p}([-_.]|$)", low):
            return i
    return len(_PRECISIONS)


def pick_projector(names: list[str], model_file: str = "") -> str | None:
    """The projector file for a model among a repository's (or folder's) files: one whose name shares
    the model's stem first, then by precision (f16, bf16, q8_0, f32, others)."""
    cands = [n for n in names if is_projector_name(n)]
    if not cands:
        return None
    def key(n: str) -> tuple[int, int, str]:
        return (0 if _shares_stem(n, model_file) else 1), _precision(n), n

    return min(cands, key=key)


def projector_beside(model_path: str | Path) -> Path | None:
    """A projector in the model file's folder (as `ggufdesk download` and the hub's layout put it)."""
    p = Path(model_path)
    if is_projector_name(p.name) or not p.parent.is_dir():
        return None
    try:
        names = [c.name for c in p.parent.iterdir() if c.is_file()]
    except OSError:
        return None
    chosen = pick_projector(names, p.name)
    if chosen is None:
        return None
    models = [n for n in names if n.lower().endswith(".gguf") and not is_projector_name(n)]
    if len(models) > 1 and not _shares_stem(chosen, p.name):
        return None  # a folder of several models: only a projector named after this one is its own
    return p.parent / chosen


def _stem(model_file: str) -> str:
    return re.sub(r"[-_.](i?q\d\w*|f16|bf16|f32)$", "", Path(model_file).name.lower().removesuffix(".gguf"))


def _shares_stem(projector: str, model_file: str) -> bool:
    stem = _stem(model_file)
    return bool(stem) and stem in projector.lower()
