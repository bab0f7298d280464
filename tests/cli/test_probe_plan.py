"""`ggufdesk probe/plan/recommend --json`: the output shape other tools rely on (docs/architecture.md, "The CLI contract")."""
from __future__ import annotations

import json
import sys

import pytest

from ggufdesk.cli import main
from ggufdesk.core import hardware
from tests.fixtures import ggufs


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: 20.0)
    monkeypatch.setattr(hardware, "measure_cpu_gflops", lambda *a, **k: 100.0)


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_probe_json(capsys):
    rc, d = run_json(capsys, "probe")
    assert rc == 0
    assert d["gpus"] == [] and d["ram_total"] > 0 and d["ram_bandwidth_gbs"] == 20.0
    assert {"cores_physical", "cores_logical", "flags"} <= set(d["cpu"])


def test_probe_text(capsys):
    assert main(["probe"]) == 0
    assert "RAM:" in capsys.readouterr().out


def test_plan_json(capsys, tiny_model, tiny_draft):
    rc, d = run_json(capsys, "plan", str(tiny_model), "--ctx", "2048", "--draft", str(tiny_draft))
    assert rc == 0
    for k in ("weights_bytes", "kv_bytes", "compute_bytes", "ram_bytes", "vram_bytes", "n_gpu_layers",
              "fit", "pred_prefill_tok_s", "pred_decode_tok_s", "explanation"):
        assert k in d, k
    assert d["fit"] == "cpu" and d["vram_bytes"] == 0 and d["n_ctx"] == 2048
    assert d["draft_breakdown"]["kv_cpu"] > 0 and d["pred_decode_tok_s"] > 0


def test_plan_bad_file_is_a_clean_error(capsys, tmp_path):
    p = ggufs.write_not_gguf(tmp_path / "x.gguf")
    rc, d = run_json(capsys, "plan", str(p))
    assert rc == 1 and "not a GGUF file" in d["error"]


def test_plan_remote(capsys, hub, tiny_model):
    hub.add_repo("org/tiny-GGUF", {"tiny-F32.gguf": tiny_model})
    rc, d = run_json(capsys, "plan", "hf://org/tiny-GGUF/tiny-F32.gguf", "--kv-type", "q8_0")
    assert rc == 0 and d["fit"] == "cpu" and d["model"] == "hf://org/tiny-GGUF/tiny-F32.gguf"


def test_recommend_json(capsys, hub, tmp_path):
    files = {}
    for q, dtype in (("F32", "f32"), ("F16", "f16")):
        files[f"tiny-{q}.gguf"] = ggufs.write_tiny_llama(tmp_path / f"tiny-{q}.gguf", ggufs.TinySpec(dtype=dtype))
    files["README.md"] = tmp_path / "README.md"
    files["README.md"].write_text("hi")
    hub.add_repo("org/tiny-GGUF", files)
    rc, d = run_json(capsys, "recommend", "org/tiny-GGUF")
    assert rc == 0
    # both fit and their quality is equal to 0.01 ppl: the faster (smaller) file wins
    assert [q["quant"] for q in d["quants"]] == ["F16", "F32"]
    assert d["recommended"] == "tiny-F16.gguf" and d["quants"][0]["recommended"]
    assert d["quants"][1]["size"] > d["quants"][0]["size"]
    assert "tok/s" in d["explanation"]


def test_recommend_missing_repo(capsys, hub):
    rc, d = run_json(capsys, "recommend", "org/absent")
    assert rc == 1 and "org/absent was not found" in d["error"]  # the shared hub-error wording (core.downloads)


def _fake_probe(monkeypatch, tmp_path, body: str) -> None:
    from ggufdesk.engine.link import decode_probe

    script = tmp_path / "fake_probe.py"
    script.write_text(body)
    monkeypatch.setattr(decode_probe, "COMMAND", [sys.executable, str(script)])


def test_probe_decode_records_the_rates_and_prints_them(capsys, monkeypatch, tmp_path):
    rates = {"float_gbs": 21.0, "quant_gbs": 17.0, "type_gbs": {"F16": 21.0, "Q4_K": 17.0, "Q6_K": 15.5}}
    _fake_probe(monkeypatch, tmp_path, f"import json; print(json.dumps({rates!r}))")
    assert main(["probe", "--decode", "--no-engine"]) == 0
    out = capsys.readouterr().out
    assert "measuring llama.cpp's decode" in out and "CPU decode (llama.cpp, measured): F16 21.0, Q4_K 17.0" in out
    rc, d = run_json(capsys, "probe", "--no-engine")  # kept: later commands plan with it
    assert rc == 0 and d["calibration"]["cpu_float_gbs"] == 21.0
    assert "another llama.cpp build" not in out
    monkeypatch.setattr(hardware, "llama_build", lambda: "rebuilt with AVX-512")
    assert main(["probe", "--no-engine"]) == 0
    assert "F16 21.0, Q4_K 17.0, Q6_K 15.5 GB/s (timed with another llama.cpp build; `ggufdesk probe --decode`" \
        in capsys.readouterr().out


def test_probe_decode_failure_is_one_line_and_exit_1(capsys, monkeypatch, tmp_path):
    _fake_probe(monkeypatch, tmp_path, "import sys; sys.stderr.write('Illegal instruction'); sys.exit(132)")
    assert main(["probe", "--decode", "--json", "--no-engine"]) == 1
    assert "Illegal instruction" in json.loads(capsys.readouterr().out)["error"]  # one JSON object
    assert hardware.decode_probe() is None
