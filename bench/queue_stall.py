"""What an agent's turn costs before its prefill starts, from two source trees, alternating.

    python bench/queue_stall.py BEFORE/app AFTER/app [--model PATH] [--clients claude-code,codex,claude-title]
                                [--turns 6] [--rounds 5]

An agent (Claude Code, Codex) sends its whole tool set and system prompt on every turn. Before the
first prefill step the server checks the tools (server/structured.py, on a worker thread, beside the
engine's decode) and the engine plans the grammar, renders and tokenizes the prompt
(engine/runtime/worker.py `Engine.generate`) on the step loop's thread: every other stream waits that
long for its next token. Per turn this prints both: `server` (the route's checks of the recorded body)
and `engine` (Engine.generate, the stall). The recorded requests are tests/fixtures/clients/'s; each
turn adds an answer and a user message to the conversation, so turn 1 is cold and turns 2.. are what
an agent's loop pays. Each run is its own process (PYTHONPATH picks the tree), the model loaded in it,
requests cancelled before their prefill. `git worktree add /tmp/before COMMIT` gives the other tree.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CLIENTS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "clients"
BODIES = {"claude-code": "claude_code_2.1.197_main.json", "claude-title": "claude_code_2.1.197_title.json",
          "codex": "codex_0.171.0_exec.json"}


def _server_side(client: str, body: dict) -> tuple[list[dict], dict]:
    """The route's work on the body: messages and Generate's structured fields (what the server checks)."""
    if client == "codex":
        from ggufdesk.server.responses import ResponsesRequest, input_messages, tool_fields

        req = ResponsesRequest.model_validate(body)
        fields, _ = tool_fields(req.tools, req.tool_choice, req.parallel_tool_calls)
        msgs = input_messages(req.input)
        return ([{"role": "system", "content": req.instructions}] if req.instructions else []) + msgs, fields
    from ggufdesk.server.anthropic import MessagesRequest, messages_of, request_structured

    req = MessagesRequest.model_validate(body)
    return messages_of(req), request_structured(req)


def _grow(client: str, body: dict, turn: int) -> dict:
    body = copy.deepcopy(body)
    extra = [("assistant", f"Step {i} is done: the file was read and nothing needed to change.")
             if k == 0 else ("user", f"Good. Now go on with step {i + 1} of the plan.")
             for i in range(turn) for k in (0, 1)]
    if client == "codex":
        body["input"] += [{"type": "message", "role": r, "content": [
            {"type": "output_text" if r == "assistant" else "input_text", "text": t}]} for r, t in extra]
    else:
        body["messages"] += [{"role": r, "content": t} for r, t in extra]
    return body


def child(model: str, client: str, turns: int) -> None:
    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from ggufdesk.engine.link import protocol as P
    from ggufdesk.engine.runtime.worker import CancelBook, Engine

    events: list = []
    book = CancelBook()
    engine = Engine(events.append, book)
    engine.load(P.Load(id="load", model=model, settings=LoadSettings(n_ctx=32768, n_threads=1, n_threads_batch=1)))
    assert engine.batch is not None, events
    body = json.loads((CLIENTS / BODIES[client]).read_text())
    server, stall = [], []
    for turn in range(turns):
        grown = _grow(client, body, turn)
        t0 = time.perf_counter()
        msgs, fields = _server_side(client, grown)
        t1 = time.perf_counter()
        rid = f"t{turn}"
        engine.generate(P.Generate(id=rid, messages=msgs, sampling=SamplingSettings(max_tokens=1), **fields))
        t2 = time.perf_counter()
        errors = [e for e in events if isinstance(e, P.Error)]
        assert not errors, errors
        book.cancel(rid)
        while engine.batch.busy:
            engine.batch.step()
        server.append(t1 - t0)
        stall.append(t2 - t1)
    print(json.dumps({"server": server, "engine": stall}))


def one(app: str, model: str, client: str, turns: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", model, client, str(turns)], capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=app))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="the app/ folder of the tree before the change")
    ap.add_argument("after", help="the app/ folder of the tree after it")
    ap.add_argument("--model", help="a .gguf path (default: SmolLM2-135M-Instruct, a chat model as agents use)")
    ap.add_argument("--clients", default="claude-code,codex,claude-title")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.model is None:
        from ggufdesk.core import starter

        a.model = str(starter.model_path(starter.SMOLLM2))
    trees = {"before": a.before, "after": a.after}
    for client in a.clients.split(","):
        res: dict[str, dict[str, list[float]]] = {k: {"cold": [], "warm": [], "server": []} for k in trees}
        for r in range(a.rounds):
            for k in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                got = one(trees[k], a.model, client, a.turns)
                res[k]["cold"].append(got["engine"][0])
                res[k]["warm"].append(statistics.median(got["engine"][1:]))
                res[k]["server"].append(statistics.median(got["server"][1:]))
            print(f"{client} round {r + 1}: " + "  ".join(
                f"{k} engine cold {res[k]['cold'][-1] * 1e3:.0f} warm {res[k]['warm'][-1] * 1e3:.0f} "
                f"server {res[k]['server'][-1] * 1e3:.0f} ms" for k in trees), f"load {os.getloadavg()[0]:.1f}",
                flush=True)
        for part in ("cold", "warm", "server"):
            med = {k: statistics.median(res[k][part]) for k in trees}
            print(f"{client} {part}: before {med['before'] * 1e3:.1f} ms, after {med['after'] * 1e3:.1f} ms, "
                  f"after / before {med['after'] / med['before']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
