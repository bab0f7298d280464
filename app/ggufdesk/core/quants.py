"""Quant types' quality loss (llama.cpp's published perplexity deltas) and quant names from file names."""
from __future__ import annotations

import re

# Perplexity increase over the unquantized model, from llama.cpp's tools/quantize/quantize.cpp
# (`llama-quantize --help`: "+0.1754 ppl @ Llama-3-8B" etc.). IQ types have no published delta
# there; theirs are interpolated on bits per weight between the K-quants (marked *).
PPL_DELTA: dict[str, float] = {
    "F32": 0.0, "BF16": 0.0, "F16": 0.0020, "Q8_0": 0.0026, "Q6_K": 0.0217, "Q5_K_M": 0.0569,
    "Q5_K_S": 0.1049, "Q5_1": 0.1062, "Q5_0": 0.1316, "Q4_K_M": 0.1754, "Q4_K_S": 0.2689,
    "IQ4_NL": 0.23, "IQ4_XS": 0.28, "Q4_1": 0.4511, "Q4_0": 0.4685, "Q3_K_L": 0.5562,
    "Q3_K_M": 0.6569, "IQ3_M": 0.70, "IQ3_S": 0.85, "IQ3_XS": 1.1, "Q3_K_S": 1.6321,
    "IQ3_XXS": 1.4, "Q2_K_S": 3.1836, "Q2_K": 3.5199, "IQ2_M": 3.0, "IQ2_S": 3.8, "IQ2_XS": 4.5,
    "IQ2_XXS": 5.5, "IQ1_M": 9.0, "IQ1_S": 12.0,
}
INTERPOLATED = frozenset(k for k in PPL_DELTA if k.startswith("IQ"))

_NAME_RE = re.compile(
    r"(?<![A-Za-z0-9])(I?Q[1-8](?:_(?:0|1|K|NL|XXS|XS|S|M|L|XL))*|TQ[12]_0|BF16|F16|FP16|F32|MXFP4)(?![A-Za-z0-9])",
    re.IGNORECASE,
)


def quant_from_name(name: str) -> str | None:
    """'Qwen2.5-7B-Instruct-Q4_K_M-00001-of-00002.gguf' -> 'Q4_K_M' (the last match wins: the quant is
    a suffix). A bare 'Q4_K' is llama.cpp's Q4_K_M (likewise Q5_K, Q3_K)."""
    from ggufdesk.core.gguf_meta import split_parts

    base = name.rsplit("/", 1)[-1]
    sp = split_parts(base)
    stem = sp[0] if sp else re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    hits: list[str] = _NAME_RE.findall(stem.replace(".", "-"))
    if not hits:
        return None
    q = hits[-1].upper().replace("FP16", "F16")
    return {"Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q3_K": "Q3_K_M"}.get(q, q)


def main_type(quant: str | None) -> str | None:
    """The ggml weight type most of a quant's matrices are in: 'Q4_K_M' -> 'Q4_K', 'IQ3_M' -> 'IQ3_S',
    'Q8_0' -> 'Q8_0'; None for a name that is not a quant. (A K-quant's _S/_M/_L says how many of its
    matrices are one type larger; llama.cpp's IQ3_M, IQ2_M and IQ3_XS are mostly IQ3_S, IQ2_S, IQ3_XXS.)"""
    q = (quant or "").upper()
    if k := re.fullmatch(r"(Q[2-6]_K)(?:_(?:XL|S|M|L))?", q):
        return k.group(1)
    special = {"IQ3_M": "IQ3_S", "IQ2_M": "IQ2_S", "IQ3_XS": "IQ3_XXS"}
    return special.get(q, q) if q in PPL_DELTA or q == "MXFP4" else None


def quality_loss(quant: str | None) -> float:
    """Perplexity delta (lower is better); unknown quants rank last."""
    return PPL_DELTA.get((quant or "").upper(), 99.0)


def describe(quant: str | None) -> str:
    d = quality_loss(quant)
    if d <= 0.01:
        return "practically lossless"
    if d <= 0.06:
        return "near-lossless"
    if d <= 0.2:
        return "a small quality loss"
    if d <= 0.7:
        return "a noticeable quality loss"
    return "a large quality loss"
