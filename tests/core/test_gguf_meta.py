"""GGUF metadata: agrees with gguf's own reader, split sets, remote header-only reads, broken files."""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import GGUFFormatError, parse_hf_url, read_gguf, split_parts
from tests.fixtures import ggufs


def _reader_table(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), int(t.n_bytes), int(t.data_offset))
            for t in r.tensors}


def test_matches_gguf_reader(tiny_model):
    info = read_gguf(tiny_model)
    assert {t.name: (t.ggml_type, t.shape, t.n_bytes, t.offset) for t in info.tensors} == _reader_table(tiny_model)
    s = ggufs.TinySpec()
    assert info.architecture == "llama"
    assert (info.n_layer, info.n_embd, info.n_head, info.n_ff) == (s.n_layer, s.n_embd, s.n_head, s.n_ff)
    assert info.n_head_kv == (s.n_head_kv,) * s.n_layer
    assert info.head_dim_k == info.head_dim_v == s.n_embd // s.n_head
    assert info.context_length == s.n_ctx_train
    assert info.n_vocab == len(ggufs.vocab()[0])
    assert info.file_type == "F32" and info.n_swa == 0 and not any(info.swa_layers)
    assert info.chat_template is None
    assert [t.layer for t in info.tensors if t.name.startswith("blk.1.")] == [1] * 9
    assert info.file_bytes == tiny_model.stat().st_size


def test_chat_template_and_layer_bytes(tiny_chatml):
    info = read_gguf(tiny_chatml)
    assert info.chat_template == ggufs.CHATML_TEMPLATE
    s = ggufs.TinySpec()
    kv = s.n_embd // s.n_head * s.n_head_kv
    per_layer = 4 * (2 * s.n_embd + 2 * s.n_embd * s.n_embd + 2 * kv * s.n_embd + 3 * s.n_ff * s.n_embd)
    assert info.layer_bytes() == [per_layer] * s.n_layer


@pytest.mark.slow
def test_starter_gemma3(starter_model):
    info = read_gguf(starter_model)
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.head_dim_k) == ("gemma3", 18, 640, 4, 256)
    assert info.n_head_kv == (1,) * 18 and info.n_vocab == 262144 and info.n_swa == 512
    # llama.cpp's gemma3 pattern: every 6th layer is global
    assert [i for i, s in enumerate(info.swa_layers) if not s] == [5, 11, 17]
    assert info.file_type == "Q4_K_M"
    assert info.metadata["tokenizer.ggml.bos_token_id"] == 2


def _write_split(src: Path, out_dir: Path, n: int) -> Path:
    """Re-write a model as n split files the way gguf-split does (split.* keys in every part)."""
    r = gguf.GGUFReader(src)
    tensors = list(r.tensors)
    per = -(-len(tensors) // n)
    stem = out_dir / "model"
    for k in range(n):
        w = gguf.GGUFWriter(f"{stem}-{k + 1:05d}-of-{n:05d}.gguf", arch=None)  # type: ignore[arg-type]
        if k == 0:
            for f in r.fields.values():
                if f.name.startswith("GGUF."):
                    continue
                vt = f.types[0]
                val = f.contents()
                w.add_key_value(f.name, val, vt, sub_type=f.types[1] if len(f.types) > 1 else None)
        w.add_uint16("split.no", k)
        w.add_uint16("split.count", n)
        w.add_int32("split.tensors.count", len(tensors))
        for t in tensors[k * per:(k + 1) * per]:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return Path(f"{stem}-00001-of-{n:05d}.gguf")


def test_split_files(tiny_model, tmp_path):
    first = _write_split(tiny_model, tmp_path, 3)
    whole, split = read_gguf(tiny_model), read_gguf(first)
    assert split.split_count == 3
    assert {t.name: t.n_bytes for t in split.tensors} == {t.name: t.n_bytes for t in whole.tensors}
    assert sorted({t.file_index for t in split.tensors}) == [0, 1, 2]
    assert (split.n_layer, split.n_embd, split.n_vocab) == (whole.n_layer, whole.n_embd, whole.n_vocab)
    # any part finds the set; a missing part is a clear error
    assert read_gguf(tmp_path / "model-00002-of-00003.gguf").weight_bytes == whole.weight_bytes
    (tmp_path / "model-00003-of-00003.gguf").unlink()
    with pytest.raises(KnownError, match="missing model-00003-of-00003.gguf"):
        read_gguf(first)


def test_split_name_parsing():
    assert split_parts("Llama-70B-Q4_K_M-00002-of-00005.gguf") == ("Llama-70B-Q4_K_M", 2, 5)
    assert split_parts("model.gguf") is None
    assert parse_hf_url("hf://org/repo/sub/x.gguf") == ("org/repo", "sub/x.gguf", None)
    assert parse_hf_url("hf://org/repo@v1/x.gguf") == ("org/repo", "x.gguf", "v1")
    with pytest.raises(KnownError):
        parse_hf_url("hf://org/x.gguf")


@pytest.mark.parametrize("kind", ["truncated", "not_gguf", "zero_layers"])
def test_malformed_files_raise_known_errors(kind, tmp_path):
    path = ggufs.write_malformed(kind, tmp_path)
    with pytest.raises(GGUFFormatError) as e:
        read_gguf(path)
    msg = str(e.value)
    assert str(path) in msg
    assert {"truncated": "truncated", "not_gguf": "not a GGUF file", "zero_layers": "no layers"}[kind] in msg


def test_header_cut_short_and_empty(tiny_chatml, tmp_path):
    data = tiny_chatml.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:3000])  # inside the vocabulary
    with pytest.raises(GGUFFormatError, match="ends inside its GGUF header"):
        read_gguf(cut)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GGUFFormatError, match="empty or too short"):
        read_gguf(empty)
    bad_ver = tmp_path / "v9.gguf"
    bad_ver.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + data[8:])
    with pytest.raises(GGUFFormatError, match="version 9"):
        read_gguf(bad_ver)
    huge = tmp_path / "huge.gguf"  # a nonsense string length must not allocate gigabytes
    huge.write_bytes(data[:24] + (1 << 40).to_bytes(8, "little") + data[32:])
    with pytest.raises(GGUFFormatError, match="corrupt"):
        read_gguf(huge)
    with pytest.raises(KnownError, match="no such file"):
        read_gguf(tmp_path / "nope.gguf")


def test_remote_header_only(hub, tmp_path):
    big = ggufs.write_tiny_llama(tmp_path / "big-Q8_0.gguf", ggufs.TinySpec(n_embd=512, n_layer=8, n_ff=1024))
    size = big.stat().st_size
    assert size > 8 << 20
    hub.add_repo("org/big-GGUF", {"big-Q8_0.gguf": big})
    info = read_gguf("hf://org/big-GGUF/big-Q8_0.gguf")
    local = read_gguf(big)
    assert info.tensors == local.tensors
    assert info.file_bytes == size and info.n_layer == 8
    sent = sum(r.sent for r in hub.requests if "big-Q8_0" in r.path)
    assert 0 < sent < 4 << 20, f"read {sent} bytes of a {size}-byte file"


def test_remote_missing_file(hub, tmp_path):
    hub.add_repo("org/r", {"a.gguf": ggufs.write_tiny_llama(tmp_path / "a.gguf")})
    with pytest.raises(KnownError, match="no such file"):
        read_gguf("hf://org/r/b.gguf")


def test_remote_truncated_header(hub, tmp_path):
    full = ggufs.write_tiny_llama(tmp_path / "full.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[:2000])
    hub.add_repo("org/cut", {"cut.gguf": cut})
    with pytest.raises(GGUFFormatError, match="GGUF header"):
        read_gguf("hf://org/cut/cut.gguf")
