"""Vision: the time to encode an image against the prefill of as many text tokens, on one model.

    .venv/bin/python bench/vision.py                      # the tiny random-weight pair (tests/fixtures/vision.py)
    .venv/bin/python bench/vision.py --image-size 224 --patch 14 --vision-embd 384 --vision-layers 6
    .venv/bin/python bench/vision.py --model M.gguf --mmproj mmproj-M.gguf [--image photo.jpg]

For each repetition, in one process, on one llama.cpp context (engine/runtime/native.py, vision.py):
  preprocess  libmtmd's tokenize of a prompt with the image (resize, normalise, the markers)
  encode      the projector's forward pass (mtmd_encode_chunk; the embedding cache is emptied first)
  embd        decoding those embeddings into the KV cache (mtmd_helper_decode_image_chunk)
  text        llama_decode of as many text tokens as the image takes (the cache cleared between)
and prints the medians and the ratios encode/text and (encode+embd)/text. Timings depend on the machine
being quiet: run it where nothing else runs. --threads sets both text and projector threads.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tiny_pair(args: argparse.Namespace, where: Path) -> tuple[Path, Path]:
    from tests.fixtures.vision import ProjectorSpec, write_tiny_vision_pair

    spec = ProjectorSpec(text_n_embd=args.text_embd, n_embd=args.vision_embd, n_head=max(1, args.vision_embd // 64),
                         n_ff=args.vision_embd * 4, n_layer=args.vision_layers, image_size=args.image_size,
                         patch_size=args.patch, n_merge=args.merge)
    return write_tiny_vision_pair(where, projector=spec)


def picture(path: str | None) -> bytes:
    if path:
        return Path(path).read_bytes()
    from tests.fixtures.vision import png_bytes

    return png_bytes(640, 480)


def text_prefill(lm, n: int) -> float:
    """Seconds for one llama_decode of n text tokens into an empty cache."""
    import llama_cpp
    from llama_cpp import _internals as internals

    from ggufdesk.engine.batching.runner import fill_batch

    batch = internals.LlamaBatch(n_tokens=n, embd=0, n_seq_max=1)
    n_vocab = lm.n_vocab
    rows = [(5 + (i * 7919) % (n_vocab - 10), i, 0, i == n - 1) for i in range(n)]
    fill_batch(batch, rows)
    mem = llama_cpp.llama_get_memory(lm.ctx.ctx)
    llama_cpp.llama_memory_clear(mem, True)
    t0 = time.perf_counter()
    rc = llama_cpp.llama_decode(lm.ctx.ctx, batch.batch)
    dt = time.perf_counter() - t0
    batch.close()
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")
    return dt


def one_round(lm, proj, px) -> dict[str, float]:
    import llama_cpp

    mem = llama_cpp.llama_get_memory(lm.ctx.ctx)
    llama_cpp.llama_memory_clear(mem, True)
    t0 = time.perf_counter()
    mp = proj.tokenize(f"a {proj.marker} b", [px], add_special=False)
    t1 = time.perf_counter()
    span = mp.spans[0]
    proj.cache._items.clear()  # encode for real every round
    proj.cache.bytes = 0
    embd, _ = proj.embedding(span)
    t2 = time.perf_counter()
    rc = proj.decode(span, embd, n_past=0, seq_id=0)
    t3 = time.perf_counter()
    if rc != 0:
        raise RuntimeError(f"decoding the image returned {rc}")
    return {"preprocess": t1 - t0, "encode": t2 - t1, "embd": t3 - t2, "text": text_prefill(lm, span.n_tokens),
            "n_tokens": span.n_tokens}


def measure(args: argparse.Namespace, tmp: Path) -> tuple[dict, dict[str, float]]:
    """(the JSON figures, median seconds per stage) of the pair given, or of the tiny pair written to tmp."""
    from ggufdesk.core import images as img
    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.runtime.native import LlamaLog, load_model
    from ggufdesk.engine.runtime.vision import Projector

    model, mmproj = (Path(args.model), Path(args.mmproj)) if args.model else tiny_pair(args, tmp)
    log = LlamaLog()
    n = 2048  # the context (and one batch): the largest image any projector here makes fits
    settings = LoadSettings(n_ctx=n, n_batch=n, n_ubatch=n, n_threads=args.threads, n_threads_batch=args.threads,
                            n_gpu_layers=args.gpu_layers)
    px = img.decode(picture(args.image))
    lm = load_model(str(model), settings, log)
    proj = None
    try:
        proj = Projector(str(mmproj), lm, log)
        one_round(lm, proj, px)  # warm-up: graphs allocated, caches filled
        rounds = [one_round(lm, proj, px) for _ in range(args.repeat)]
    finally:
        if proj is not None:
            proj.close()
        lm.close()
    med = {k: statistics.median(r[k] for r in rounds) for k in ("preprocess", "encode", "embd", "text")}
    n_tok = int(rounds[0]["n_tokens"])
    out = {"model": str(model), "mmproj": str(mmproj), "image_tokens": n_tok, "repeat": args.repeat,
           **{f"{k}_ms": round(v * 1000, 3) for k, v in med.items()},
           "encode_over_text": round(med["encode"] / med["text"], 2) if med["text"] else None,
           "image_over_text": round((med["encode"] + med["embd"]) / med["text"], 2) if med["text"] else None}
    return out, med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a text model (default: the tiny pair)")
    ap.add_argument("--mmproj", help="its projector (with --model)")
    ap.add_argument("--image", help="an image file (default: a 640x480 generated picture)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="0 = physical cores")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--image-size", type=int, default=64, help="tiny pair: the projector's image side")
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--merge", type=int, default=2)
    ap.add_argument("--vision-embd", type=int, default=32)
    ap.add_argument("--vision-layers", type=int, default=1)
    ap.add_argument("--text-embd", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="ggufdesk-vision-bench-") as tmp:  # the tiny pair, removed after
        out, med = measure(args, Path(tmp))
    if args.json:
        import json

        print(json.dumps(out))
    else:
        print(f"{Path(out['model']).name} + {Path(out['mmproj']).name}: an image is {out['image_tokens']} tokens")
        for k in ("preprocess", "encode", "embd", "text"):
            print(f"  {k:<10} {med[k] * 1000:9.2f} ms  (median of {args.repeat})")
        print(f"  encode / text prefill of {out['image_tokens']} tokens: {out['encode_over_text']}x;"
              f" encode + embeddings / text: {out['image_over_text']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
