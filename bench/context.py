"""Context that never drops silently, and a prompt cache that survives a restart (issue 28's acceptance).

1. restart: a 1,500-token system prompt on `ggufdesk serve`: time to first token (client side, streamed)
   of the first request on a cold server with an empty cache, and of the same request after the server
   was stopped and started again; the ratio (target <= 0.3x) and `usage.prompt_tokens_details.cached_tokens`
   (target >= 1,400). Each round starts from an empty cache folder.
2. agent: the same with a ~20k-token agent prompt (Claude Code's recorded first request from
   tests/fixtures/clients/ when it is there, its system text and tool schemas as one system message;
   else a synthetic one of the same size), on a model with a long enough context (the Gemma 3 starter).
3. restore: in one process, seconds per token of restoring a saved prefix from disk vs prefilling it.
4. bytes: disk bytes per cached token with an f16 and a q8_0 KV cache (load-insensitive).
5. replay: a three-hour conversation (180 scripted user turns, one a minute) through the session layer
   with the window's settings (rolling, the 4,096-token context): every turn is answered, none stops for
   lack of context, and the notes ("N earlier turns no longer fit ...") appear.

    .venv/bin/python bench/context.py                      # everything, on the starters (the lead's run)
    .venv/bin/python bench/context.py --quick              # every part on tiny models in seconds (a check)
    .venv/bin/python bench/context.py --parts restart,agent --reps 3
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ggufdesk.core import prompt_cache as pc  # noqa: E402
from ggufdesk.core.settings import LoadSettings, SamplingSettings  # noqa: E402
from ggufdesk.engine.link import protocol as P  # noqa: E402

WORDS = ("river town woke slowly fishermen pulled their boats onto the gravel baker opened his shutters thin "
         "smoke rose from chimneys along water children ran to school on hill while parents argued about price "
         "of grain and coming rain").split()
PARTS = ("restart", "agent", "restore", "bytes", "replay")


def text(n_words: int, seed: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(n_words))


# ---- a served model ---------------------------------------------------------------------------------


class Served:
    """`ggufdesk serve MODEL` in a child process with its own prompt cache folder."""

    def __init__(self, model: str, ctx: int, cache: Path, threads: int) -> None:
        env = {**os.environ, "GGUFDESK_PROMPT_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "ggufdesk", "serve", model, "--port", "0", "--ctx", str(ctx), "--parallel", "1",
               "--temperature", "0", "--context-overflow", "error"]
        if threads:
            cmd += ["--threads", str(threads), "--threads-batch", str(threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=str(ROOT))
        self.url = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if m := re.search(r"listening on (http://\S+)", line):
                self.url = m.group(1)
            if "ready:" in line:
                return
        raise RuntimeError(f"serve {model} did not start")

    def warm_up(self) -> None:
        """One short unrelated request: a fresh engine's first decode also sets itself up."""
        httpx.post(self.url + "/v1/completions", json={"model": "m", "prompt": "Hello", "max_tokens": 2},
                   timeout=600).raise_for_status()

    def ttft(self, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """Seconds to the first streamed token, and the usage at the end."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}, "model": "m"}
        t0 = time.perf_counter()
        first, usage = 0.0, {}
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=3600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if not first and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - t0
                usage = chunk.get("usage") or usage
        return first or time.perf_counter() - t0, usage

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def restart_rounds(name: str, model: str, ctx: int, body: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    """Cold TTFT on an empty cache, then TTFT after a restart, `reps` rounds (medians)."""
    cold, warm, cached, n_prompt = [], [], [], 0
    for rnd in range(a.reps):
        with tempfile.TemporaryDirectory(prefix="ggufdesk-bench-cache-") as d:
            s = Served(model, ctx, Path(d), a.threads)
            try:
                s.warm_up()
                t, usage = s.ttft(body)
            finally:
                s.stop()  # pending saves land before the engine goes
            cold.append(t)
            n_prompt = usage.get("prompt_tokens", 0)
            s = Served(model, ctx, Path(d), a.threads)
            try:
                s.warm_up()
                t, usage = s.ttft(body)
            finally:
                s.stop()
            warm.append(t)
            cached.append(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
        print(f"  {name} round {rnd + 1}: cold {cold[-1]:.3f} s, after a restart {warm[-1]:.3f} s, "
              f"cached {cached[-1]} of {n_prompt}", file=sys.stderr)
    c, w = statistics.median(cold), statistics.median(warm)
    out = {"prompt_tokens": n_prompt, "cold_ttft_s": round(c, 3), "restart_ttft_s": round(w, 3),
           "ratio": round(w / c, 3), "cached_tokens": min(cached)}
    print(f"{name}: {n_prompt} prompt tokens, TTFT cold {c:.3f} s vs after a restart {w:.3f} s = {w / c:.3f}x "
          f"(target <= 0.3x); cached_tokens {min(cached)} (target >= {n_prompt - 100})")
    return out


def system_body(n_words: int) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "You are a careful assistant. " + text(n_words, 3)},
                         {"role": "user", "content": "Summarise the town in one line."}],
            "max_tokens": 8, "temperature": 0}


def agent_body(words: int) -> dict[str, Any]:
    """Claude Code's recorded first request as one chat (system text + tool schemas, then its turns);
    a synthetic prompt of `words` words when the recording is not in this checkout."""
    found = sorted((ROOT / "tests" / "fixtures" / "clients").glob("claude_code_*_main.json"))
    if not found or words:
        return system_body(words or 15000)
    body = json.loads(found[-1].read_text())

    def flat(content: Any) -> str:
        return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)

    inline = [flat(m["content"]) for m in body["messages"] if m["role"] == "system"]
    system = "\n\n".join([flat(body["system"]), *inline, "Tools:\n" + json.dumps(body.get("tools", []))])
    turns = [{"role": m["role"], "content": flat(m["content"])} for m in body["messages"] if m["role"] != "system"]
    return {"messages": [{"role": "system", "content": system}, *turns], "max_tokens": 8, "temperature": 0}


# ---- in one process: restore vs prefill, bytes per token ---------------------------------------------


def engine_in_process(model: str, cache: Path, **load: Any) -> Any:
    os.environ["GGUFDESK_PROMPT_CACHE"] = str(cache)
    from ggufdesk.engine.runtime.worker import CancelBook, Engine

    events: list[Any] = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="load", model=model, settings=LoadSettings(**load)))
    if engine.batch is None:
        raise SystemExit(f"could not load {model}: {events}")
    return engine, events


def run_one(engine: Any, events: list[Any], rid: str, prompt: str) -> P.Done:
    engine.generate(P.Generate(id=rid, prompt=prompt, sampling=SamplingSettings(temperature=0.0, max_tokens=1)))
    while engine.batch.busy:
        engine.batch.step()
    done = [e for e in events if isinstance(e, (P.Done, P.Error)) and e.id == rid]
    if not done or isinstance(done[0], P.Error):
        raise SystemExit(f"{rid} failed: {done}")
    return done[0]


def restore_vs_prefill(model: str, ctx: int, words: int, a: argparse.Namespace) -> dict[str, Any]:
    """Seconds per token: a cold prefill (its Stats) vs PromptStates.restore of the same prefix from disk."""
    load = {"n_ctx": ctx, "n_threads": a.threads, "n_threads_batch": a.threads}
    prefill, restore, n = [], [], 0
    for rnd in range(a.reps):
        with tempfile.TemporaryDirectory(prefix="ggufdesk-bench-cache-") as d:
            prompt = f"{rnd} " + text(words, rnd)
            engine, events = engine_in_process(model, Path(d), **load)
            t0 = time.perf_counter()
            done = run_one(engine, events, "cold", prompt)
            prefill.append((time.perf_counter() - t0) / done.usage["prompt_tokens"])
            engine.unload(quiet=True)  # the save lands
            engine, events = engine_in_process(model, Path(d), **load)
            saved, spent = engine.batch.saved, []
            real = saved.restore  # (a fresh engine: its RAM holds nothing, the prefix comes from disk)

            def timed(*args: Any, _real: Any = real, _spent: list[float] = spent) -> tuple[int, str]:
                t = time.perf_counter()
                got = _real(*args)
                _spent.append(time.perf_counter() - t)
                return got

            saved.restore = timed
            done = run_one(engine, events, "warm", prompt)
            n = done.usage["restored_tokens"]
            engine.unload(quiet=True)
            if not n:
                raise SystemExit("nothing was restored")
            restore.append(spent[0] / n)
    p, r = statistics.median(prefill), statistics.median(restore)
    print(f"restore vs prefill: {n} tokens, prefill {1e6 * p:.0f} us/token, restore {1e6 * r:.1f} us/token "
          f"= {r / p:.3f}x of a prefilled token")
    return {"tokens": n, "prefill_us_per_token": round(1e6 * p, 1), "restore_us_per_token": round(1e6 * r, 2),
            "ratio": round(r / p, 4)}


def bytes_per_token(model: str, ctx: int, words: int, a: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for kv in ("f16", "q8_0"):
        with tempfile.TemporaryDirectory(prefix="ggufdesk-bench-cache-") as d:
            engine, events = engine_in_process(model, Path(d), n_ctx=ctx, type_k=kv, type_v=kv, flash_attn="on",
                                               n_threads=a.threads, n_threads_batch=a.threads)
            run_one(engine, events, "r", text(words, 1))
            engine.unload(quiet=True)
            (entry,) = [pc.read_entry(p) for p in Path(d).glob("*.kv")]
            out[kv] = {"tokens": entry.n_tokens, "bytes_per_token": round(entry.payload_bytes / entry.n_tokens, 1),
                       "file_bytes": entry.size}
    print("disk bytes per cached token: " + ", ".join(f"{k} KV {v['bytes_per_token']:.0f}" for k, v in out.items())
          + f" ({out['q8_0']['bytes_per_token'] / out['f16']['bytes_per_token']:.3f}x)")
    return out


# ---- a three-hour conversation --------------------------------------------------------------------


def replay(model: str, ctx: int, turns: int, max_tokens: int, words: tuple[int, int] = (30, 90)) -> dict[str, Any]:
    """180 user turns through ChatSession with the window's settings; every answer and every note."""
    from ggufdesk.cli.mcp_tools import pump
    from ggufdesk.engine.runtime.overflow import ROLL_SLACK
    from ggufdesk.core.settings import Settings
    from ggufdesk.engine.link.client import EngineClient
    from ggufdesk.session import ChatSession, SessionView
    from ggufdesk.session.inbox import Inbox

    window = Settings()  # the window's defaults: rolling, the chat sampling
    sampling = dataclasses.replace(window.sampling, max_tokens=max_tokens, temperature=0.0)
    notes: list[tuple[int, str]] = []
    errors: list[str] = []
    reasons: dict[str, int] = {}
    prefilled: list[int] = []  # prompt tokens each turn had to prefill (not in a cache)

    class View(SessionView):
        def context_noted(self, turn: Any) -> None:
            notes.append((len(session.turns) // 2, turn.stats["context_note"]))

        def notice(self, text: str, level: str = "info") -> None:
            if level == "error":
                errors.append(text)

    inbox = Inbox()
    t0 = time.perf_counter()
    cache = tempfile.TemporaryDirectory(prefix="ggufdesk-bench-cache-")  # nothing from an earlier run
    with cache, EngineClient(env={**os.environ, "GGUFDESK_PROMPT_CACHE": cache.name}) as client:
        loaded = client.load(model, settings=LoadSettings(n_ctx=ctx))
        session = ChatSession(engine=client, view=View(), post=inbox.post)
        session.on_event(loaded)
        session.new_conversation(system_prompt="You are a friendly guide to a small river town.", sampling=sampling)
        for i in range(turns):
            session.send(f"minute {i}: " + text(words[0] + (i * 37) % words[1], i) + "?")
            pump(client, session, inbox, silence=600)
            answer = session.turns[-1]
            reasons[answer.finish_reason or answer.status] = reasons.get(answer.finish_reason or answer.status, 0) + 1
            prefilled.append(int(answer.stats.get("n_prompt", 0)) - int(answer.stats.get("n_reused", 0)))
    seconds = time.perf_counter() - t0
    stopped = reasons.get("context", 0) + len(errors)
    first = notes[0][0] if notes else None
    print(f"replay: {turns} turns ({seconds:.0f} s), answers by finish reason {reasons}, stopped for lack of "
          f"context: {stopped}, notes: {len(notes)} (first at turn {first}: {notes[0][1] if notes else '-'!r})"
          + (f"; first error: {errors[0]}" if errors else ""))
    late = prefilled[first:] if first is not None else []
    print(f"replay: prompt tokens prefilled per turn (not from a cache): mean {statistics.mean(prefilled):.0f}"
          + (f", after the first note {statistics.mean(late):.0f} (rolling slack {ROLL_SLACK})" if late else ""))
    return {"turns": turns, "finish_reasons": reasons, "errors": errors, "notes": len(notes),
            "first_note_turn": first, "seconds": round(seconds, 1), "prefilled_per_turn": prefilled,
            "rolling_slack": ROLL_SLACK}


# ---- main -----------------------------------------------------------------------------------------


def quick_models(tmp: Path) -> tuple[str, str, str]:
    """Tiny models: a base one, a chat one, and one whose heads (32 wide) take a q8_0 KV cache."""
    from tests.fixtures import ggufs

    tiny = ggufs.write_tiny_llama(tmp / "tiny.gguf", ggufs.TinySpec(seed=0))
    chat = ggufs.write_tiny_llama(tmp / "tiny-chat.gguf", ggufs.TinySpec(seed=1, chat_template=ggufs.CHATML_TEMPLATE))
    wide = ggufs.write_tiny_llama(tmp / "tiny-wide.gguf", ggufs.TinySpec(seed=2, n_embd=128))
    return str(tiny), str(chat), str(wide)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the chat model (library id or path)")
    ap.add_argument("--agent-model", default="gemma-3-270m", help="a model with a >= 24k context for the agent part")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--replay-turns", type=int, default=180)
    ap.add_argument("--replay-max-tokens", type=int, default=96, help="answer length in the replay (the window: 512)")
    ap.add_argument("--quick", action="store_true", help="tiny models, small sizes: checks the bench runs")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p]
    from ggufdesk.core import library

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ggufdesk-bench-") as tmp:
        if a.quick:
            model, chat, wide = quick_models(Path(tmp))
            agent, sys_words, agent_words, ctx, agent_ctx, turns = model, 100, 400, 2048, 4096, 24
            a.reps = min(a.reps, 1)
        else:
            chat, agent = library.resolve(a.model), library.resolve(a.agent_model)
            wide = chat
            model, sys_words, agent_words, ctx, agent_ctx, turns = chat, 1400, 0, 4096, 24576, a.replay_turns
        if "restart" in parts:
            results["restart"] = restart_rounds("system prompt", chat, ctx, system_body(sys_words), a)
        if "agent" in parts:
            results["agent"] = restart_rounds("agent prompt", agent, agent_ctx, agent_body(agent_words), a)
        if "restore" in parts:
            results["restore"] = restore_vs_prefill(model, ctx, sys_words, a)
        if "bytes" in parts:
            results["bytes"] = bytes_per_token(wide if a.quick else model, ctx, sys_words, a)
        if "replay" in parts:
            results["replay"] = replay(chat, 512, turns, 16, (4, 12)) if a.quick else \
                replay(chat, 4096, turns, a.replay_max_tokens)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
