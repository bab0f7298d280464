"""Vision models from the command line: `download` fetches the projector beside the model, `library` says
whether a model can see (or is a vision model without its projector), `plan` counts the projector, and
`run --image` puts images in the prompt."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ggufdesk.cli import main
from tests.fixtures.vision import ProjectorSpec, png_bomb, png_bytes, write_tiny_projector, write_tiny_vision_pair


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def sha(p: Path | str) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


@pytest.fixture
def pair(tmp_path):
    return write_tiny_vision_pair(tmp_path / "pair")


def test_download_fetches_the_projector_that_pairs(capsys, hub, pair, tmp_path):
    model, mmproj = pair
    f32 = write_tiny_projector(tmp_path / "other.gguf", ProjectorSpec(seed=1))
    hub.add_repo("org/tiny-vision-GGUF", {"tiny-vision-Q8_0.gguf": model, "mmproj-tiny-vision-f16.gguf": mmproj,
                                          "mmproj-tiny-vision-f32.gguf": f32})
    rc, d = run_json(capsys, "download", "org/tiny-vision-GGUF", "tiny-vision-Q8_0.gguf")
    assert rc == 0
    assert d["mmproj"]["file"] == "mmproj-tiny-vision-f16.gguf"  # f16 pairs with a quantized model
    assert d["mmproj"]["sha256"] == sha(mmproj) == sha(d["mmproj"]["path"])
    assert Path(d["mmproj"]["path"]).parent == Path(d["path"]).parent  # beside the model: loaded with it
    rc, listing = run_json(capsys, "download", "org/tiny-vision-GGUF")
    assert [m["name"] for m in listing["models"]] == ["tiny-vision-Q8_0"]  # a projector is not a model


def test_download_of_a_text_model_and_no_mmproj(capsys, hub, pair):
    model, mmproj = pair
    hub.add_repo("org/text-GGUF", {"t-Q8_0.gguf": model})
    rc, d = run_json(capsys, "download", "org/text-GGUF", "t-Q8_0.gguf")
    assert rc == 0 and d["mmproj"] is None
    hub.add_repo("org/v-GGUF", {"v-Q8_0.gguf": model, "mmproj-v-f16.gguf": mmproj})
    rc, d = run_json(capsys, "download", "org/v-GGUF", "v-Q8_0.gguf", "--no-mmproj")
    assert rc == 0 and d["mmproj"] is None


def test_download_refuses_a_corrupt_projector(capsys, hub, pair, tmp_path):
    from tests.hubserver import Fault

    model, mmproj = pair
    hub.add_repo("org/bad-GGUF", {"b-Q8_0.gguf": model, "mmproj-b-f16.gguf": mmproj})
    hub.faults.add(Fault(repo="org/bad-GGUF", file="mmproj-b-f16.gguf", corrupt_at=(1000,), times=None))
    rc, d = run_json(capsys, "download", "org/bad-GGUF", "b-Q8_0.gguf")
    assert rc == 1 and "failed its checksum" in d["error"] and "mmproj-b-f16.gguf" in d["error"]


def test_library_shows_vision_and_a_missing_projector(capsys, hub, pair, tmp_path, monkeypatch):
    model, mmproj = pair
    monkeypatch.setenv("HOME", str(tmp_path))
    rc, d = run_json(capsys, "library", "--add", str(model))
    row = next(m for m in d["models"] if m["path"] == str(model.resolve()))
    assert row["capabilities"]["vision"] and row["mmproj"] == str(mmproj)
    # a catalog vision model in the HF cache without its projector: said so, with the download that fetches it
    hub.add_repo("ggml-org/gemma-3-4b-it-GGUF", {"gemma-3-4b-it-Q4_K_M.gguf": model})
    main(["download", "ggml-org/gemma-3-4b-it-GGUF", "gemma-3-4b-it-Q4_K_M.gguf", "--no-mmproj", "--json"])
    capsys.readouterr()
    rc, d = run_json(capsys, "library")
    row = next(m for m in d["models"] if m["name"].startswith("ggml-org/gemma-3-4b-it-GGUF"))
    assert not row["capabilities"]["vision"]
    assert "ggufdesk download ggml-org/gemma-3-4b-it-GGUF gemma-3-4b-it-Q4_K_M.gguf" in row["projector_missing"]
    assert main(["library"]) == 0 and "without its projector" in capsys.readouterr().out


def test_plan_counts_the_projector(capsys, pair):
    model, mmproj = pair
    rc, with_proj = run_json(capsys, "plan", str(model))
    rc2, without = run_json(capsys, "plan", str(model), "--mmproj", str(mmproj))
    assert rc == rc2 == 0
    assert with_proj["mmproj"] == str(mmproj) and with_proj["image_tokens"] == 16
    assert with_proj["projector_bytes"] > mmproj.stat().st_size // 2
    assert with_proj["ram_bytes"] == without["ram_bytes"]


def test_run_with_an_image(capsys, pair, tmp_path):
    model, _ = pair
    image = tmp_path / "photo.png"
    image.write_bytes(png_bytes())
    rc, d = run_json(capsys, "run", str(model), "--prompt", "what is this", "--image", str(image),
                     "--max-tokens", "4", "--temperature", "0", "--ctx", "512", "--threads", "1")
    assert rc == 0, d
    assert d["images"] == 1 and d["image_tokens"] == 16 and d["mmproj"]


def test_run_refuses_bad_images_before_loading(capsys, pair, tmp_path):
    model, _ = pair
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_bomb())
    rc, d = run_json(capsys, "run", str(model), "--prompt", "x", "--image", str(bomb))
    assert rc == 1 and "too many pixels" in d["error"]
    rc, d = run_json(capsys, "run", str(model), "--prompt", "x", "--image", str(tmp_path / "nope.png"))
    assert rc == 1 and "could not read the image" in d["error"]


def test_run_image_on_a_text_model(capsys, tiny_model, tmp_path):
    image = tmp_path / "photo.png"
    image.write_bytes(png_bytes())
    rc, d = run_json(capsys, "run", str(tiny_model), "--prompt", "x", "--image", str(image), "--ctx", "512",
                     "--max-tokens", "2")
    assert rc == 1 and "reads text only" in d["error"] and "mmproj" in d["error"]

