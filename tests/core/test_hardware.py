"""Hardware probe with a fake NVML: 0, 1 and 2 GPUs, missing driver, failures mid-probe; calibration store."""
from __future__ import annotations

import sys
import types
from collections import namedtuple

import pytest

from ggufdesk.core import hardware

Mem = namedtuple("Mem", "total free used")
Proc = namedtuple("Proc", "pid usedGpuMemory")
GiB = 1 << 30


class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[dict], *, init_error: bool = False, fail: set[str] = frozenset()) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_MEM, m.NVML_CLOCK_SM = 2, 1
    m.NVMLError = NVMLError
    state = {"shutdown": 0}
    m.state = state

    def call(name, fn):
        def wrapped(*a):
            if name in fail:
                raise NVMLError(f"{name}: Not Supported")
            return fn(*a)
        wrapped.__name__ = name
        return wrapped

    def init():
        if init_error:
            raise NVMLError("NVML Shared Library Not Found")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)
    m.nvmlSystemGetDriverVersion = call("driver", lambda: b"550.54.15")
    m.nvmlDeviceGetCount = call("count", lambda: len(gpus))
    m.nvmlDeviceGetHandleByIndex = call("handle", lambda i: gpus[i])
    m.nvmlDeviceGetName = call("name", lambda h: h["name"])
    m.nvmlDeviceGetMemoryInfo = call("mem", lambda h: Mem(h["total"], h["free"], h["total"] - h["free"]))
    m.nvmlDeviceGetComputeRunningProcesses = call("procs", lambda h: h.get("procs", []))
    m.nvmlDeviceGetGraphicsRunningProcesses = call("gprocs", lambda h: [])
    m.nvmlDeviceGetMemoryBusWidth = call("bus", lambda h: h["bus"])
    m.nvmlDeviceGetMaxClockInfo = call("clock", lambda h, kind: h["memclk"] if kind == 2 else h["smclk"])
    m.nvmlDeviceGetCurrPcieLinkGeneration = call("pcie_gen", lambda h: 4)
    m.nvmlDeviceGetCurrPcieLinkWidth = call("pcie_width", lambda h: 16)
    m.nvmlDeviceGetCudaComputeCapability = call("cc", lambda h: h["cc"])
    m.nvmlDeviceGetNumGpuCores = call("cores", lambda h: h["cores"])
    return m


RTX4090 = dict(name="NVIDIA GeForce RTX 4090", total=24 * GiB, free=20 * GiB, bus=384, memclk=10501,
               smclk=2520, cc=(8, 9), cores=16384, procs=[Proc(4242, 3 * GiB)])
RTX3060 = dict(name=b"NVIDIA GeForce RTX 3060", total=12 * GiB, free=11 * GiB, bus=192, memclk=7501,
               smclk=1777, cc=(8, 6), cores=3584)


@pytest.fixture(autouse=True)
def _fast_measurements(monkeypatch):
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: 25.0)
    monkeypatch.setattr(hardware, "measure_cpu_gflops", lambda *a, **k: 100.0)


def use(monkeypatch, mod):
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_no_gpu(monkeypatch):
    use(monkeypatch, fake_nvml([]))
    hw = hardware.probe()
    assert hw.gpus == () and hw.vram_free == 0
    assert any("no usable GPU" in n for n in hw.notes)
    assert hw.ram_total > 0 and hw.cpu.cores_logical >= 1


def test_one_gpu(monkeypatch):
    m = use(monkeypatch, fake_nvml([RTX4090]))
    hw = hardware.probe()
    (g,) = hw.gpus
    assert g.name == "NVIDIA GeForce RTX 4090"
    assert (g.vram_total, g.vram_free, g.vram_used) == (24 * GiB, 20 * GiB, 4 * GiB)
    assert g.vram_used_by_others == 3 * GiB
    assert g.bandwidth_gbs == pytest.approx(1008.1, abs=0.1)  # 384 bit / 8 x 10501 MHz x 2
    assert (g.pcie_gen, g.pcie_width, g.compute_capability, g.cuda_cores) == (4, 16, "8.9", 16384)
    assert hw.driver == "550.54.15"
    assert m.state["shutdown"] == 1
    assert hw.to_json()["gpus"][0]["bandwidth_gbs"] == g.bandwidth_gbs


def test_two_gpus_and_bytes_names(monkeypatch):
    use(monkeypatch, fake_nvml([RTX4090, RTX3060]))
    hw = hardware.probe()
    assert [g.name for g in hw.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3060"]
    assert hw.vram_free == 31 * GiB
    assert hw.gpus[1].bandwidth_gbs == pytest.approx(360.0, abs=0.1)


def test_no_driver_is_cpu_only(monkeypatch):
    use(monkeypatch, fake_nvml([RTX4090], init_error=True))
    hw = hardware.probe()
    assert hw.gpus == ()
    assert any("no NVIDIA driver" in n for n in hw.notes)


def test_unsupported_fields_are_none(monkeypatch):
    use(monkeypatch, fake_nvml([RTX4090], fail={"bus", "cc", "pcie_gen", "cores", "procs"}))
    (g,) = hardware.probe().gpus
    assert g.bandwidth_gbs is None and g.compute_capability is None and g.pcie_gen is None
    assert g.vram_free == 20 * GiB and g.vram_used_by_others == 0


def test_nvml_failing_mid_probe(monkeypatch):
    m = use(monkeypatch, fake_nvml([RTX4090], fail={"mem"}))
    hw = hardware.probe()
    assert hw.gpus == () and any("no memory information" in n for n in hw.notes)
    m.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(RuntimeError("driver crashed"))
    assert hardware.probe().gpus == ()


def test_pynvml_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    hw = hardware.probe()
    assert hw.gpus == () and any("nvidia-ml-py" in n for n in hw.notes)


def test_bandwidth_measured_once_then_cached(monkeypatch):
    use(monkeypatch, fake_nvml([]))
    calls = []
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: calls.append(1) or 31.5)
    assert hardware.probe().ram_bandwidth_source == "measured"
    hw = hardware.probe()
    assert (hw.ram_bandwidth_gbs, hw.ram_bandwidth_source, len(calls)) == (31.5, "cached", 1)
    assert hardware.probe(remeasure=True).ram_bandwidth_source == "measured" and len(calls) == 2
    (hardware.cache_dir() / hardware.CACHE_FILE).write_text("{not json")
    assert hardware.probe().ram_bandwidth_source == "measured"


def test_a_busy_remeasurement_keeps_the_best_bandwidth(monkeypatch):
    """A pass taken while other programs run reads low; it must not make every prediction pessimistic."""
    use(monkeypatch, fake_nvml([]))
    reads = iter([30.0, 12.0, 35.0])
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: next(reads))
    assert hardware.probe().ram_bandwidth_gbs == 30.0
    assert hardware.probe(remeasure=True).ram_bandwidth_gbs == 30.0  # the busy 12 GB/s is not kept
    assert hardware.probe(remeasure=True).ram_bandwidth_gbs == 35.0
    assert hardware.probe().ram_bandwidth_gbs == 35.0



def test_calibration_store():
    assert hardware.effective_bandwidth_gbs("cpu") is None
    for tok_s in (40.0, 44.0, 42.0):
        hardware.record_decode_run(where="cpu", bytes_per_token=250_000_000, tok_s=tok_s)
    hardware.record_decode_run(where="cpu", bytes_per_token=1000, tok_s=5000)  # too small: overhead-bound
    hardware.record_decode_run(where="gpu", bytes_per_token=-1, tok_s=10)  # nonsense: ignored
    assert hardware.effective_bandwidth_gbs("cpu") == pytest.approx(11.0)  # the best run
    assert hardware.effective_bandwidth_gbs("gpu") is None
    for _ in range(hardware.MAX_RUNS + 5):
        hardware.record_decode_run(where="gpu", bytes_per_token=100 << 20, tok_s=100)
    import json
    assert len(json.loads((hardware.cache_dir() / hardware.CALIBRATION_FILE).read_text())) == hardware.MAX_RUNS


def test_gpus_found_by_llama_cpp_fill_in_when_nvml_has_none():
    """A Mac (Metal, unified memory) or an AMD card (Vulkan): NVML sees nothing, ggml's device list does."""
    from ggufdesk.core.hardware import CPUInfo, GPUInfo, HardwareInfo, with_ggml_devices

    cpu = CPUInfo(name="test", arch="arm64", cores_physical=8, cores_logical=8, flags=("neon",))
    hw = HardwareInfo(gpus=(), cpu=cpu, ram_total=16 << 30, ram_available=12 << 30, ram_bandwidth_gbs=100.0,
                      ram_bandwidth_source="measured", cpu_gflops=500.0,
                      notes=("no usable GPU found: models run on the CPU",))
    devices = [{"name": "CPU", "type": "cpu", "memory_total": 16 << 30, "memory_free": 12 << 30},
               {"name": "MTL0", "description": "Apple M2", "type": "igpu",
                "memory_total": 12 << 30, "memory_free": 11 << 30}]
    got = with_ggml_devices(hw, devices)
    (g,) = got.gpus
    assert (g.name, g.source, g.vram_total, g.vram_free, g.bandwidth_gbs) == ("Apple M2", "ggml", 12 << 30, 11 << 30, None)
    assert any("shares system memory" in n for n in got.notes)
    assert not any("no usable GPU" in n for n in got.notes)
    assert with_ggml_devices(hw, devices[:1]) is hw  # a CPU-only build adds nothing
    nv = GPUInfo(index=0, name="RTX", vram_total=8 << 30, vram_free=7 << 30, vram_used=1 << 30,
                 vram_used_by_others=0, bandwidth_gbs=400.0)
    with_nvml = HardwareInfo(**{**{f: getattr(hw, f) for f in hw.__dataclass_fields__}, "gpus": (nv,)})
    assert with_ggml_devices(with_nvml, devices) is with_nvml  # NVML's richer facts win


def test_runs_measured_on_a_busy_machine_do_not_become_the_prediction():
    """A quiet run made 13 tok/s; answers while other programs used the cores made 2-3 tok/s."""
    hardware.record_decode_run(where="cpu", bytes_per_token=250_000_000, tok_s=13.0)
    for tok_s in (2.3, 2.1, 2.6, 2.4, 3.0):
        hardware.record_decode_run(where="cpu", bytes_per_token=250_000_000, tok_s=tok_s)
    assert hardware.effective_bandwidth_gbs("cpu") == pytest.approx(13.0 * 0.25)


def test_a_limited_process_and_the_whole_machine_keep_their_own_measurements(monkeypatch):
    use(monkeypatch, fake_nvml([]))
    reads = iter([30.0, 9.0, 31.0])
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: next(reads))
    whole = hardware.probe()
    monkeypatch.setattr(hardware, "cpu_limit", lambda: 1)  # taskset -c 0, a container's --cpus 1
    limited = hardware.probe()
    assert (whole.ram_bandwidth_gbs, limited.ram_bandwidth_gbs) == (30.0, 9.0)
    assert limited.cpu.cores_usable == 1 and limited.ram_bandwidth_source == "measured"
    assert hardware.probe().ram_bandwidth_source == "cached"
    monkeypatch.setattr(hardware, "cpu_limit", lambda: None)
    again = hardware.probe()  # not measured again: the limited run kept its entry apart
    assert (again.ram_bandwidth_gbs, again.ram_bandwidth_source) == (30.0, "cached")


def test_a_cache_of_one_entry_written_before_is_read(monkeypatch):
    import json

    import psutil

    use(monkeypatch, fake_nvml([]))
    cpu = hardware.cpu_info()
    key = hardware.machine_key(cpu, int(psutil.virtual_memory().total))
    path = hardware.cache_dir() / hardware.CACHE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "ram_bandwidth_gbs": 27.5, "cpu_gflops": 90.0}))
    hw = hardware.probe()
    assert (hw.ram_bandwidth_gbs, hw.ram_bandwidth_source) == (27.5, "cached")
    path.write_text(json.dumps({"machines": {key: "not a dict"}, "key": 3}))
    assert hardware.probe().ram_bandwidth_source == "measured"


def test_runs_recorded_under_a_cpu_limit_calibrate_only_that_limit(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_limit", lambda: None)
    hardware.record_decode_run(where="cpu", bytes_per_token=100 << 20, tok_s=20.0)
    monkeypatch.setattr(hardware, "cpu_limit", lambda: 1)
    assert hardware.effective_bandwidth_gbs("cpu") is None  # the whole machine's run says nothing here
    hardware.record_decode_run(where="cpu", bytes_per_token=100 << 20, tok_s=8.0)
    limited = hardware.effective_bandwidth_gbs("cpu")
    monkeypatch.setattr(hardware, "cpu_limit", lambda: None)
    whole = hardware.effective_bandwidth_gbs("cpu")
    assert limited is not None and whole is not None and limited < whole
