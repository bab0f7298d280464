"""The planner's predictions are pure: calibration comes in with the hardware, no file is read."""
from __future__ import annotations

from dataclasses import replace

import pytest

from ggufdesk.core import hardware, planner
from ggufdesk.core.gguf_meta import read_gguf
from ggufdesk.core.hardware import Calibration
from tests.core.test_planner import hw
from tests.fixtures import ggufs


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return read_gguf(ggufs.write_tiny_llama(tmp_path_factory.mktemp("m") / "t.gguf"))


def test_plan_and_ranking_read_no_file(info, monkeypatch):
    def no_disk(*_a, **_k):
        raise AssertionError("the planner read a file")

    monkeypatch.setattr(hardware, "_load_json", no_disk)
    p = planner.plan(info, hw(), n_ctx=1024)
    ranked = planner.rank_quants([("m-Q8_0.gguf", info.file_bytes), ("m-Q4_K_M.gguf", info.file_bytes // 2)],
                                 info, hw(), n_ctx=512)
    assert p.pred_decode_tok_s > 0 and len(ranked) == 2


def test_the_calibration_in_the_hardware_drives_the_prediction(info):
    slow = replace(hw(), calibration=Calibration(cpu_gbs=0.1))
    fast = replace(hw(), calibration=Calibration(cpu_gbs=100.0))
    fixed = hardware.cpu_fixed_s(planner.matmuls_per_token(info))  # not bandwidth: the same for both
    slow_s = 1 / planner.plan(info, slow, n_ctx=1024).pred_decode_tok_s - fixed
    assert slow_s == pytest.approx(1000 * (1 / planner.plan(info, fast, n_ctx=1024).pred_decode_tok_s - fixed))


def test_calibration_is_read_from_the_recorded_runs():
    hardware.record_decode_run(where="cpu", bytes_per_token=200 << 20, tok_s=10.0)
    assert hardware.calibration() == Calibration(cpu_gbs=(200 << 20) * 10.0 / 1e9, gpu_gbs=None)

