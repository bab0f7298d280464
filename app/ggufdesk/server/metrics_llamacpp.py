"""llama-server's /metrics (`llamacpp:` names), counted from the same requests as ours, written as llama-server does.

llama-server's exposition names a counter's `# TYPE` line with its `_total` (and `n_tokens_max`, a counter
without one), which prometheus_client cannot write (it strips `_total` from a counter's family name and
adds `_created` samples): so these few lines are written here, after prometheus_client's text.
The rates (`prompt_tokens_seconds`, `predicted_tokens_seconds`) are, as llama-server's, over the window
since the previous scrape; the generation rate counts decode steps (the first token of a request comes
with its prompt, as its `timings` count it).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)


@dataclass
class Window:
    """Steps and the seconds they took, since the previous scrape."""

    steps: int = 0
    seconds: float = 0.0

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass(kw_only=True)
class Finished:
    """One request's figures, as its llama-server `timings` give them."""

    prompt_n: int  # prompt tokens computed (not cached)
    cache_n: int = 0
    prompt_s: float = 0.0
    predicted_n: int = 0
    predicted_s: float = 0.0
    n_tokens: int = 0  # its sequence: the whole prompt and what was generated
    draft_tokens: int = 0
    accepted: int = 0
    drafts: int = 0


class LlamaCppMetrics:
    """The counts behind llama-server's metric names. Called from the event loop and from engine reader
    threads (decoded), hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals = dict.fromkeys((name for name, _ in COUNTERS), 0.0)
        self.n_busy = 0
        self.prompt, self.predict = Window(), Window()
        self.processing: Callable[[], float] = lambda: 0.0
        self.deferred: Callable[[], float] = lambda: 0.0

    def finished(self, r: Finished) -> None:
        with self._lock:
            t = self.totals
            t["prompt_tokens_total"] += r.prompt_n
            t["prompt_tokens_cached_total"] += r.cache_n
            t["prompt_seconds_total"] += r.prompt_s
            t["tokens_predicted_total"] += r.predicted_n
            t["tokens_predicted_seconds_total"] += r.predicted_s
            t["n_tokens_max"] = max(t["n_tokens_max"], r.n_tokens)
            t["spec_decode_num_draft_tokens_total"] += r.draft_tokens
            t["spec_decode_num_accepted_tokens_total"] += r.accepted
            t["spec_decode_num_drafts_total"] += r.drafts
            self.prompt.steps += r.prompt_n
            self.prompt.seconds += r.prompt_s
            if r.predicted_s > 0:
                self.predict.steps += max(0, r.predicted_n - 1)
                self.predict.seconds += r.predicted_s

    def decoded(self, n_decode: int, n_busy: int) -> None:
        """Decode calls an engine made (and the sequences they served, summed)."""
        with self._lock:
            self.totals["n_decode_total"] += n_decode
            self.n_busy += n_busy

    def render(self) -> str:
        """The exposition text; the rate windows start again."""
        with self._lock:
            n_decode = self.totals["n_decode_total"]
            gauges = {"prompt_tokens_seconds": self.prompt.rate(), "predicted_tokens_seconds": self.predict.rate(),
                      "requests_processing": self.processing(), "requests_deferred": self.deferred(),
                      "n_busy_slots_per_decode": self.n_busy / max(n_decode, 1)}
            lines = [item(name, doc, "counter", self.totals[name]) for name, doc in COUNTERS]
            lines += [item(name, doc, "gauge", gauges[name]) for name, doc in GAUGES]
            self.prompt, self.predict = Window(), Window()
        return "".join(lines)


def item(name: str, doc: str, kind: str, value: float) -> str:
    v = float(value)
    text = str(int(v)) if v.is_integer() else repr(v)
    return f"# HELP llamacpp:{name} {doc}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {text}\n"
