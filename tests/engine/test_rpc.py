"""A model spread over two RPC workers on loopback: same tokens as local, clear errors when a worker is
down at load or dies mid-answer, and the engine comes back."""
from __future__ import annotations

import ctypes
import dataclasses

import pytest

from ggufdesk.core import distributed, gguf_meta, planner
from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient, EngineError
from tests.engine.conftest import TINY_LOAD
from tests.engine.helpers import collect, greedy
from tests.engine.rpc_workers import start_worker

pytestmark = pytest.mark.timeout(600)  # a hang guard, generous for a loaded machine


def split_mem(model) -> int:
    """Memory per worker so that neither holds the whole offload but the two together do."""
    info = gguf_meta.read_gguf(str(model))
    kv = planner.kv_bytes_per_layer(info, TINY_LOAD.n_ctx, n_ubatch=TINY_LOAD.n_ubatch)
    need = sum(distributed._layer_costs(info, kv))
    cb = planner.compute_buffer(info, n_ctx=TINY_LOAD.n_ctx, n_ubatch=TINY_LOAD.n_ubatch, flash=True)
    return cb + distributed.WORKER_MARGIN + int(need * 0.7)


@pytest.fixture
def two_workers(tiny_model):
    mem = split_mem(tiny_model)
    workers = [start_worker(mem=mem), start_worker(mem=mem)]
    yield workers
    for w in workers:
        w.stop()


def rpc_load(workers) -> LoadSettings:
    return dataclasses.replace(TINY_LOAD, rpc=[w.endpoint for w in workers])


def test_split_over_two_workers_gives_the_local_tokens(tiny_model, two_workers):
    with EngineClient(auto_restart=False) as c:
        c.load(str(tiny_model), settings=TINY_LOAD)
        local = collect(c, c.generate(prompt="the cat", sampling=greedy(32)))
        loaded = c.load(str(tiny_model), settings=rpc_load(two_workers))
        remote = collect(c, c.generate(prompt="the cat", sampling=greedy(32)))
        # the unloaded model let go of the workers (each serves one client): a reload gets them again
        c.load(str(tiny_model), settings=rpc_load(two_workers))
        again = collect(c, c.generate(prompt="the cat", sampling=greedy(32)))
    devices = loaded.rpc["devices"]
    assert [d["endpoint"] for d in devices] == [w.endpoint for w in two_workers]
    assert all(d["n_layers"] >= 1 for d in devices)  # neither worker could hold it alone
    assert all(d["bytes"] <= d["budget"] for d in devices)
    assert loaded.rpc["cpu_layers"] == 0 and loaded.memory["gpu"] > 0  # llama.cpp put buffers on them
    assert remote.error is None and local.error is None
    assert remote.done.tokens == local.done.tokens and len(local.done.tokens) == 32
    assert again.error is None and again.done.tokens == local.done.tokens


def test_worker_down_at_load_is_named_and_the_engine_lives(tiny_model):
    w = start_worker(mem=64 << 20)
    w.stop()  # its port is now closed: nobody listens there
    with EngineClient(auto_restart=False) as c:
        pid = c.pid
        with pytest.raises(EngineError) as e:
            c.load(str(tiny_model), settings=rpc_load([w]))
        assert w.endpoint in str(e.value) and "not reachable" in str(e.value)
        assert e.value.event.kind == "load"
        assert c.alive and c.pid == pid  # checked before llama.cpp, which would have aborted
        c.load(str(tiny_model), settings=TINY_LOAD)
        assert collect(c, c.generate(prompt="the cat", sampling=greedy(3))).error is None


def test_worker_killed_mid_answer_is_named_and_the_engine_reloads(tiny_model, two_workers):
    dead, alive = two_workers
    with EngineClient(auto_restart=True) as c:
        c.load(str(tiny_model), settings=rpc_load(two_workers))
        old_pid = c.pid
        assert collect(c, c.generate(prompt="the cat", sampling=greedy(8))).error is None
        # deterministic "mid-answer": the worker stops answering, the next answer is sent and
        # waits on it inside llama.cpp, then the worker dies
        dead.pause()
        rid = c.generate(prompt="the dog and the cat", sampling=greedy(400))
        dead.kill()
        events = list(c.stream(rid))
        err = events[-1]
        assert isinstance(err, P.Error) and err.kind == "crash" and err.id == rid
        assert f"lost RPC worker {dead.endpoint}" in err.message
        assert alive.endpoint not in err.message.split("lost RPC worker")[1]
        assert "reloading on the remaining workers" in err.message
        # events() also holds the first load's Loaded (the client queues every event): wait for the reload's
        loaded = next(ev for ev in c.events(timeout=600)
                      if isinstance(ev, P.Loaded) and ev.settings.get("rpc") == [alive.endpoint])
        assert c.pid != old_pid and loaded.settings["rpc"] == [alive.endpoint]
        assert collect(c, c.generate(prompt="the cat", sampling=greedy(3))).error is None


def test_a_memory_limit_caps_what_a_served_device_reports():
    from ggufdesk.engine.runtime import rpc

    def get_memory(dev: int, free, total) -> None:
        free[0], total[0] = 8 << 30, 16 << 30

    own = rpc.GET_MEMORY(get_memory)
    iface = (ctypes.c_void_p * 3)(None, None, ctypes.cast(own, ctypes.c_void_p).value)  # get_memory: the third
    rpc._limit_memory(ctypes.addressof(iface), 1 << 30)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    rpc.GET_MEMORY(iface[2])(ctypes.addressof(iface), ctypes.byref(free), ctypes.byref(total))
    assert (free.value, total.value) == (1 << 30, 1 << 30)


def test_a_device_without_a_memory_function_is_refused_not_called():
    from ggufdesk.engine.runtime import rpc

    iface = (ctypes.c_void_p * 3)()  # get_memory NULL: calling through it would crash the server
    with pytest.raises(KnownError, match="reports no memory"):
        rpc._limit_memory(ctypes.addressof(iface), 1 << 30)
