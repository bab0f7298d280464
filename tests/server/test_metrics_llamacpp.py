"""llama-server's /metrics beside ours: the `llamacpp:` lines as llama-server writes them, counted from real requests,
the engine's decode calls (restarts included) and the Process-Start-Time-Unix header."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.server.metrics import Metrics
from ggufdesk.server.metrics_llamacpp import COUNTERS, GAUGES, Finished, LlamaCppMetrics
from ggufdesk.server.pool import EnginePool


def parse(text: str) -> dict[str, tuple[str, float]]:
    """llama.cpp's own parser (tools/server/tests/unit/test_metrics.py): each sample needs a # TYPE of its name."""
    out, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split(" ", 1)
            assert name in types, f"{name} has no # TYPE line"
            out[name] = (types[name], float(value))
    return out


def test_every_name_is_written_with_its_help_and_type():
    m = Metrics()
    m.bind(running=lambda: 2, queued=lambda: 1, kv_usage=lambda: 0.0)
    text = m.render().decode()
    got = parse(text)
    for name, _ in COUNTERS:
        assert got[f"llamacpp:{name}"] == ("counter", 0.0) and f"# HELP llamacpp:{name} " in text
    assert got["llamacpp:requests_processing"] == ("gauge", 2.0) and got["llamacpp:requests_deferred"] == ("gauge", 1.0)
    assert {f"llamacpp:{n}" for n, _ in GAUGES} <= set(got)
    assert "ggufdesk_requests_running 2.0" in text  # ours unchanged beside them
    assert not [line for line in text.splitlines() if line.startswith("llamacpp:") and "_created" in line]
    list(text_string_to_metric_families(text))  # and a Prometheus parser reads the whole text


def test_requests_add_up_and_the_rates_are_per_scrape():
    m = LlamaCppMetrics()
    m.finished(Finished(prompt_n=10, cache_n=4, prompt_s=0.5, predicted_n=5, predicted_s=2.0, n_tokens=19,
                        draft_tokens=6, accepted=3, drafts=2))
    m.finished(Finished(prompt_n=2, predicted_n=1, n_tokens=3))  # one token: no decode step, no rate
    m.decoded(7, 9)
    got = parse(m.render())
    assert got["llamacpp:prompt_tokens_total"][1] == 12 and got["llamacpp:prompt_tokens_cached_total"][1] == 4
    assert got["llamacpp:tokens_predicted_total"][1] == 6 and got["llamacpp:tokens_predicted_seconds_total"][1] == 2
    assert got["llamacpp:n_tokens_max"][1] == 19 and got["llamacpp:n_decode_total"][1] == 7
    assert got["llamacpp:spec_decode_num_draft_tokens_total"][1] == 6
    assert got["llamacpp:spec_decode_num_accepted_tokens_total"][1] == 3
    assert got["llamacpp:spec_decode_num_drafts_total"][1] == 2
    assert got["llamacpp:prompt_tokens_seconds"][1] == 24.0  # 12 tokens in 0.5 s
    assert got["llamacpp:predicted_tokens_seconds"][1] == 2.0  # 4 decode steps in 2 s (the first token is free)
    assert abs(got["llamacpp:n_busy_slots_per_decode"][1] - 9 / 7) < 1e-9
    again = parse(m.render())  # the window since the last scrape is empty; the totals stay
    assert again["llamacpp:prompt_tokens_seconds"][1] == 0 and again["llamacpp:predicted_tokens_seconds"][1] == 0
    assert again["llamacpp:prompt_tokens_total"][1] == 12


def test_decodes_counted_from_several_threads_are_not_lost():
    m = LlamaCppMetrics()
    threads = [threading.Thread(target=lambda: [m.decoded(1, 2) for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert parse(m.render())["llamacpp:n_decode_total"][1] == 4000


def pool_with_events() -> EnginePool:
    client = SimpleNamespace(supports_logprobs=False)
    return EnginePool(model="m.gguf", load=LoadSettings(), client_factory=lambda **kw: client)  # type: ignore[arg-type]


def test_the_pool_passes_on_what_the_engine_decoded_since_its_last_status():
    pool, seen = pool_with_events(), []
    pool._on_event(P.Status(n_decode=5, n_busy=5))  # before anyone listens: not counted later either
    pool.on_decodes = lambda n, busy: seen.append((n, busy))
    pool._on_event(P.Status(n_decode=8, n_busy=11))
    pool._on_event(P.Status(n_decode=8, n_busy=11, running=0))  # no new decode: nothing
    pool._on_event(P.Status(n_decode=2, n_busy=2))  # the engine restarted: its counts start again at 0
    pool._on_event(P.Status())  # an engine that does not count (older): nothing, never negative
    assert seen == [(3, 6), (2, 2)]


def test_a_live_server_counts_as_its_timings_say(served):
    url = served.url

    def scrape() -> tuple[httpx.Response, dict[str, float]]:
        r = httpx.get(url + "/metrics", timeout=60)
        assert r.status_code == 200
        return r, {k: v for k, (_, v) in parse(r.text).items()}

    r, before = scrape()
    started = int(r.headers["process-start-time-unix"])
    assert "Process-Start-Time-Unix" in {k.decode() for k, _ in r.headers.raw}
    assert time.time() - 3600 < started <= time.time()
    timings = []
    for _ in range(2):
        c = httpx.post(url + "/completion", json={"prompt": "the quick brown fox jumps", "n_predict": 4}, timeout=120)
        assert c.status_code == 200
        timings.append(c.json()["timings"])
    _, after = scrape()

    def grew(name: str) -> float:
        return after[f"llamacpp:{name}"] - before[f"llamacpp:{name}"]

    assert grew("prompt_tokens_total") == sum(t["prompt_n"] for t in timings)
    assert grew("prompt_tokens_cached_total") == sum(t["cache_n"] for t in timings) > 0
    assert grew("tokens_predicted_total") == sum(t["predicted_n"] for t in timings) == 8
    assert grew("n_decode_total") >= 4  # at least the generated tokens' steps of one request
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:n_busy_slots_per_decode"] >= 1
    assert after["llamacpp:n_tokens_max"] >= timings[0]["prompt_n"] + 4
    e = httpx.post(url + "/v1/embeddings", json={"input": ["hello world", "goodbye world"]}, timeout=120)
    assert e.status_code == 200
    _, embedded = scrape()
    assert embedded["llamacpp:prompt_tokens_total"] - after["llamacpp:prompt_tokens_total"] == \
        e.json()["usage"]["prompt_tokens"]
    assert embedded["llamacpp:n_decode_total"] - after["llamacpp:n_decode_total"] >= 2
    assert embedded["llamacpp:tokens_predicted_total"] == after["llamacpp:tokens_predicted_total"]
