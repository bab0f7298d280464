"""Prometheus metrics of one server (its own registry: several servers can live in one process), and llama-server's."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from ggufdesk.server.metrics_llamacpp import LlamaCppMetrics

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60)


class Metrics:
    """What /metrics shows. Gauges that mirror live state read it through callbacks when scraped."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._drafted = self._accepted = 0
        self.latency = Histogram("ggufdesk_request_duration_seconds", "Time from request to its last byte",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("ggufdesk_time_to_first_token_seconds", "Time from request to its first token",
                              ["endpoint"], buckets=TTFT_BUCKETS, registry=r)
        self.prompt_tokens = Counter("ggufdesk_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generated_tokens = Counter("ggufdesk_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("ggufdesk_requests", "Requests finished, by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.failures = Counter("ggufdesk_request_failures", "Requests refused or failed, by reason",
                                ["reason"], registry=r)
        self.cancel = Histogram("ggufdesk_cancel_seconds",
                                "Time from a client's disconnect to the engine confirming the cancel",
                                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5), registry=r)
        self.running = Gauge("ggufdesk_requests_running", "Requests being generated", registry=r)
        self.queued = Gauge("ggufdesk_requests_queued", "Requests waiting for a slot", registry=r)
        self.kv_usage = Gauge("ggufdesk_kv_cache_usage_ratio", "Share of KV cache cells in use (0-1)",
                              registry=r)
        self.drafted = Counter("ggufdesk_speculative_drafted_tokens", "Tokens proposed by speculation",
                               registry=r)
        self.accepted = Counter("ggufdesk_speculative_accepted_tokens", "Drafted tokens accepted",
                                registry=r)
        self.acceptance = Gauge("ggufdesk_speculative_acceptance_ratio",
                                "Accepted / drafted tokens since start (0 when nothing was drafted)", registry=r)
        self.acceptance.set_function(self._acceptance)
        self.cached_tokens = Counter("ggufdesk_prompt_tokens_cached",
                                     "Prompt tokens served from a cache (memory or the disk prompt cache)", registry=r)
        self.restored_tokens = Counter("ggufdesk_prompt_tokens_restored",
                                       "Prompt tokens read from the disk prompt cache", registry=r)
        self.truncated_tokens = Counter("ggufdesk_truncated_tokens",
                                        "Tokens the context overflow policy dropped, by policy", ["policy"], registry=r)
        self.model_loads = Counter("ggufdesk_model_loads", "Model loads completed, by model", ["model"], registry=r)
        self.model_unloads = Counter("ggufdesk_model_unloads", "Models unloaded, by model and reason "
                                     "(idle, evicted, requested, keep_alive, failed)", ["model", "reason"], registry=r)
        self._models: Callable[[], list[dict[str, Any]]] = list
        r.register(_ModelStates(lambda: self._models()))
        self.llamacpp = LlamaCppMetrics()  # llama-server's names, written after ours

    def bind(self, *, running: Callable[[], float], queued: Callable[[], float],
             kv_usage: Callable[[], float]) -> None:
        self.running.set_function(running)
        self.queued.set_function(queued)
        self.kv_usage.set_function(kv_usage)
        self.llamacpp.processing, self.llamacpp.deferred = running, queued

    def bind_models(self, models: Callable[[], list[dict[str, Any]]]) -> None:
        """Where the per-model gauges are read from at scrape time: dicts with id, state, waiting,
        loading_s and need (a budget.Need while loaded)."""
        self._models = models

    def speculation(self, drafted: int, accepted: int) -> None:
        self._drafted += drafted
        self._accepted += accepted
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)

    def context(self, cached: int, restored: int, policy: str, truncated: int) -> None:
        """One request's cache use and what its overflow policy dropped."""
        self.cached_tokens.inc(cached)
        self.restored_tokens.inc(restored)
        if truncated:
            self.truncated_tokens.labels(policy or "unknown").inc(truncated)

    def _acceptance(self) -> float:
        return self._accepted / self._drafted if self._drafted else 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry) + self.llamacpp.render().encode()


class _ModelStates:
    """The router's gauges, read when scraped: models loaded and loading, each load's waiters and time."""

    def __init__(self, models: Callable[[], list[dict[str, Any]]]) -> None:
        self.models = models

    def describe(self) -> Iterator[Metric]:
        return self._families([])

    def collect(self) -> Iterator[Metric]:
        return self._families(self.models())

    @staticmethod
    def _families(models: list[dict[str, Any]]) -> Iterator[Metric]:
        loaded = GaugeMetricFamily("ggufdesk_models_loaded", "Models loaded and ready")
        loaded.add_metric([], sum(1 for m in models if m["state"] == "ready"))
        loading = GaugeMetricFamily("ggufdesk_models_loading", "Models being loaded")
        loading.add_metric([], sum(1 for m in models if m["state"] == "loading"))
        waiting = GaugeMetricFamily("ggufdesk_model_load_waiting_requests",
                                    "Requests waiting for the model's load to finish", labels=["model"])
        seconds = GaugeMetricFamily("ggufdesk_model_load_elapsed_seconds", "Time the model's load in progress "
                                    "has taken so far", labels=["model"])
        memory = GaugeMetricFamily("ggufdesk_model_memory_bytes", "The planner's estimate for a loaded model",
                                   labels=["model", "kind"])
        for m in models:
            if m["state"] == "loading":
                waiting.add_metric([m["id"]], m["waiting"])
                seconds.add_metric([m["id"]], m["loading_s"])
            if m.get("need") is not None:
                memory.add_metric([m["id"], "ram"], m["need"].ram)
                memory.add_metric([m["id"], "vram"], m["need"].vram)
        yield from (loaded, loading, waiting, seconds, memory)
