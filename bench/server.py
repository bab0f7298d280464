"""Server benchmark: ggufdesk serve vs llama.cpp's llama-server vs llama-cpp-python's server, one run, side by side.

All three serve the starter model with the same threads, batch sizes and flash attention, and the
same KV cache (ggufdesk's unified cache of --ctx cells; llama-server `-c CTX -np N -kvu`; llama-cpp-python
one sequence of CTX), and are driven by the same streaming OpenAI /v1/completions client (greedy).
Measurements
are interleaved server by server, so machine load drifts hit all three alike. Prints absolute
numbers and the ratios the issue asks for. `llama-server` is built once from the vendored llama.cpp of
the llama-cpp-python sdist (same portable CPU flags as installer/llama_wheel.sh) and cached under
~/.cache/ggufdesk/tools/; llama-cpp-python's server runs in a cached venv with its [server] extras and
`--interrupt_requests False` (by default a new request interrupts the running one, so it queues instead).

    python bench/server.py [--threads 2] [--ctx 8192] [--parallel 8] [--tokens 96] [--json out.json]
    python bench/server.py --skip-llama-cpp-python --aggregate-reps 8 [--clients 4]   # the 4-stream ratio alone
    python bench/server.py --skip-llama-cpp-python --ctx 32768 --agent-prefill-reps 3   # a 20k-token agent prompt
    ... --before /tmp/before/app   # also another tree's ggufdesk (a git worktree's app/ folder), for an A/B

The agent prompt is Claude Code 2.1's recorded first request (tests/fixtures/clients/), sent to both
servers as the same /v1/chat/completions request (system text with its 24 tools as JSON text, user turns),
a fresh nonce first so no cache helps; prefill tok/s is each server's own `timings` (prompt_n / prompt_ms).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.3.36"
CPU_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON"]
SERVER_FLAGS = ["-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_BUILD_TYPE=Release"]
PROMPT = "Here is a list of the numbers from one to five hundred, written out in words: one, two, three,"


def tools_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ggufdesk" / "tools"


# ---- the two reference servers ------------------------------------------------------------------


def llama_server_binary() -> Path:
    """Build llama-server from the sdist's vendored llama.cpp once (about 10-20 min on 2 cores)."""
    key = hashlib.sha256("|".join([VERSION, *CPU_FLAGS, *SERVER_FLAGS]).encode()).hexdigest()[:12]
    out = tools_dir() / f"llama-server-{VERSION}-{key}" / "llama-server"
    if out.exists():
        return out
    tools_dir().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="llama-server-build-", dir=tools_dir()))
    print(f"building llama-server {VERSION} in {work} (cached afterwards)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                    f"llama-cpp-python=={VERSION}", "-d", str(work)], check=True)
    with tarfile.open(next(work.glob("llama_cpp_python-*.tar.gz"))) as t:
        t.extractall(work, filter="data")
    src = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(src), "-B", str(work / "build"), *gen, *CPU_FLAGS, *SERVER_FLAGS], check=True)
    subprocess.run(["nice", "cmake", "--build", str(work / "build"), "--target", "llama-server",
                    "-j", str(os.cpu_count() or 2)], check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(work / "build" / "bin" / "llama-server", out)
    shutil.rmtree(work, ignore_errors=True)
    return out


def llama_cpp_python_server_venv() -> Path:
    """A venv with our cached llama-cpp-python wheel and its [server] extras (kept out of ours)."""
    venv = tools_dir() / f"llama-cpp-python-server-{VERSION}"
    py = venv / "bin" / "python"
    if (venv / ".ok").exists():
        return py
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheel = subprocess.run([str(ROOT / "installer" / "llama_wheel.sh"), str(py)], check=True,
                           capture_output=True, text=True).stdout.strip()
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"{wheel}[server]"], check=True)
    (venv / ".ok").touch()
    return py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    cmd: list[str]
    port: int
    ready_path: str
    proc: subprocess.Popen | None = None
    model: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path) -> None:
        log = open(log_dir / f"{self.name.replace(' ', '_')}.log", "w")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT))

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    self.model = httpx.get(self.url + "/v1/models", timeout=5).json()["data"][0]["id"]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not get ready in {timeout} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def ggufdesk_cmd(model: str, threads: int, ctx: int, parallel: int) -> list[str]:
    """`ggufdesk serve` as this bench runs it ("{port}" to fill in); bench/server_lookup.py runs it too."""
    t = str(threads)
    return [sys.executable, "-m", "ggufdesk", "serve", model, "--port", "{port}", "--threads", t,
            "--threads-batch", t, "--ctx", str(ctx), "--parallel", str(parallel), "--batch", "512", "--ubatch", "512",
            "--flash-attn", "on", "--temperature", "0"]


def llama_server_cmd(model: str, threads: int, ctx: int, parallel: int) -> list[str]:
    """llama-server with the same threads, batch sizes, flash attention and unified KV cache."""
    t = str(threads)
    return [str(llama_server_binary()), "-m", model, "--port", "{port}", "-t", t, "-tb", t, "-c", str(ctx),
            "-np", str(parallel), "-kvu", "-cb", "-b", "512", "-ub", "512", "-fa", "on", "--no-webui"]


def make_servers(model: str, a: argparse.Namespace) -> list[Server]:
    t, ctx = str(a.threads), str(a.ctx)
    servers = [Server("ggufdesk serve", ggufdesk_cmd(model, a.threads, a.ctx, a.parallel), 0, "/health")]
    if a.before:  # another tree's ggufdesk (its app/ folder first on the path), as a server of its own
        servers.append(Server("ggufdesk serve (before)", ["env", f"PYTHONPATH={Path(a.before).resolve()}",
                                                          *ggufdesk_cmd(model, a.threads, a.ctx, a.parallel)],
                              0, "/health"))
    if not a.skip_llama_server:
        servers.append(Server("llama-server", llama_server_cmd(model, a.threads, a.ctx, a.parallel), 0, "/health"))
    if not a.skip_llama_cpp_python:
        py = llama_cpp_python_server_venv()
        servers.append(Server("llama-cpp-python", [str(py), "-m", "llama_cpp.server", "--model", model,
                                                   "--port", "{port}", "--n_threads", t, "--n_threads_batch", t,
                                                   "--n_ctx", ctx, "--n_batch", "512", "--n_ubatch", "512",
                                                   "--flash_attn", "True", "--interrupt_requests", "False"],
                              0, "/v1/models"))
    return with_ports(servers)


@contextlib.contextmanager
def running(servers: list[Server], name: str) -> Iterator[None]:
    """The servers started one at a time (loading competes for the same cores) and ready, their engines'
    own caches (saved prompts, measured costs) in a throwaway folder alike for every round, their logs in
    another; stopped at the end, both folders removed then, the logs kept (and named) when it failed.
    (Set after the commands are built: llama-server's build is cached there.)"""
    before = os.environ.get("XDG_CACHE_HOME")
    cache = tempfile.mkdtemp(prefix=f"{name}-cache-")
    os.environ["XDG_CACHE_HOME"] = cache
    logs = Path(tempfile.mkdtemp(prefix=f"{name}-logs-"))
    ok = False
    try:
        for s in servers:
            s.start(logs)
            s.wait_ready()
        yield
        ok = True
    finally:
        for s in servers:
            s.stop()
        if before is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = before
        shutil.rmtree(cache, ignore_errors=True)
        if ok:
            shutil.rmtree(logs, ignore_errors=True)
        else:
            print(f"the servers' logs: {logs}", file=sys.stderr)


def with_ports(servers: list[Server]) -> list[Server]:
    """Each server a free port, filled into its command's "{port}"."""
    for s in servers:
        s.port = free_port()
        s.cmd = [c.replace("{port}", str(s.port)) for c in s.cmd]
    return servers


# ---- the client -------------------------------------------------------------------------------


@dataclass
class Stream:
    sent: float
    times: list[float] = field(default_factory=list)  # arrival of each non-empty text chunk
    text: str = ""

    @property
    def ttft(self) -> float:
        return self.times[0] - self.sent

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]


async def stream(c: httpx.AsyncClient, srv: Server, prompt: str, max_tokens: int,
                 on_token=None) -> Stream:
    body = {"model": srv.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    s = Stream(sent=time.perf_counter())
    async with c.stream("POST", srv.url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            text = (data.get("choices") or [{}])[0].get("text") or ""
            if text:
                s.times.append(time.perf_counter())
                s.text += text
                if on_token:
                    on_token(s)
    return s


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def decode_rate(s: Stream) -> float:
    return (len(s.times) - 1) / (s.times[-1] - s.times[0]) if len(s.times) > 1 else 0.0


async def concurrent(srv: Server, n: int, tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        ss = await asyncio.gather(*(stream(c, srv, f"{PROMPT} (list {i})", tokens) for i in range(n)))
        wall = time.perf_counter() - t0
    gaps = [g for s in ss for g in s.gaps()]
    return {"aggregate_tok_s": sum(len(s.times) for s in ss) / wall, "tokens": sum(len(s.times) for s in ss),
            "ttft_p50": pct([s.ttft for s in ss], 50), "ttft_p99": pct([s.ttft for s in ss], 99),
            "itl_p50": pct(gaps, 50), "itl_p99": pct(gaps, 99),
            "single_decode_tok_s": decode_rate(ss[0]) if n == 1 else None}


def long_prompt(n_words: int, seed: int) -> str:
    rnd = random.Random(seed)
    words = ("river mountain quiet garden signal harbor lantern meadow copper violet engine window paper "
             "silver thunder orchard marble canyon velvet compass shadow crystal falcon ember").split()
    return " ".join(rnd.choice(words) for _ in range(n_words)) + "\nSummary:"


async def big_prompt_arrives(srv: Server, tokens: int, words: int, seed: int) -> dict:
    """Three streams run; a long prompt arrives; how long do the three stall, and how slow is its TTFT?"""
    async with httpx.AsyncClient(timeout=900) as c:
        alone = await stream(c, srv, long_prompt(words, seed), 4)
        started = asyncio.Event()

        def on_token(s: Stream) -> None:
            if len(s.times) >= 12:
                started.set()

        runners = [asyncio.create_task(stream(c, srv, f"{PROMPT} (run {i})", tokens, on_token)) for i in range(3)]
        await started.wait()
        t_arrive = time.perf_counter()
        big = await stream(c, srv, long_prompt(words, seed + 1), 4)
        ss = await asyncio.gather(*runners)
    before = [g for s in ss for a, g in zip(s.times, s.gaps()) if a < t_arrive]
    during = [g for s in ss for a, g in zip(s.times, s.gaps()) if t_arrive <= a <= big.times[0]]
    median = statistics.median(before) if before else float("nan")
    worst = max(during, default=0.0)
    return {"ttft_alone_s": alone.ttft, "ttft_beside_3_s": big.ttft, "ttft_ratio": big.ttft / alone.ttft,
            "running_median_gap_s": median, "running_worst_gap_s": worst,
            "worst_over_median": worst / median if median else float("nan")}


async def shared_prefix(srv: Server, words: int, seed: int) -> dict:
    system = long_prompt(words, seed)
    async with httpx.AsyncClient(timeout=900) as c:
        first = await stream(c, srv, system + " first question:", 2)
        second = await stream(c, srv, system + " second question:", 2)
    return {"ttft_first_s": first.ttft, "ttft_second_s": second.ttft, "ratio": second.ttft / first.ttft}


async def gauge(c: httpx.AsyncClient, srv: Server, name: str) -> float:
    for line in (await c.get(srv.url + "/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise SystemExit(f"{name} is not in /metrics")


async def dropping_client(srv: Server, prompt: str, max_tokens: int, after_tokens: int, after_s: float) -> float:
    """A raw TCP client (so no HTTP library's connection handling sits in the measurement): it
    streams a completion, reads `after_tokens` SSE chunks (or waits `after_s` if 0), then closes
    the socket. Returns the close's perf_counter time."""
    body = json.dumps({"model": srv.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    if after_tokens:
        seen = 0
        while seen < after_tokens:
            line = await reader.readline()
            if not line:
                raise SystemExit("the server closed the stream early")
            seen += line.startswith(b"data: {")
    else:
        await asyncio.sleep(after_s)
    writer.transport.abort()  # the connection is gone, as when a client process dies
    return time.perf_counter()


async def disconnects(srv: Server, words: int, seed: int, reps: int = 3) -> dict:
    """ggufdesk serve only: beside 3 running streams, a client drops its connection while its answer
    streams (after 8 tokens) or while its long prompt is prefilled (after 0.5 s). Two clocks:
    the server's own (`ggufdesk_cancel_seconds`: from noticing the disconnect to the engine's
    confirmation, when the sequence and the slot are freed; it notices within a few ms of the
    TCP close) and ours, from the close until /metrics shows one request fewer (an upper bound:
    each /metrics poll competes with the engine for the 2 cores)."""
    out: dict[str, list[float]] = {"decoding": [], "prefilling": [], "decoding_polled": [], "prefilling_polled": []}
    async with httpx.AsyncClient(timeout=600) as c, httpx.AsyncClient(timeout=60) as probe:
        # (prompt + max_tokens of all five must fit the KV cells, or admission makes one wait)
        bg = [asyncio.create_task(stream(c, srv, f"{PROMPT} (bg {i})", 1200)) for i in range(3)]
        while await gauge(probe, srv, "ggufdesk_requests_running") < 3:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        for k in range(reps):
            for kind in ("decoding", "prefilling"):
                base = await gauge(probe, srv, "ggufdesk_requests_running")
                n0 = await gauge(probe, srv, "ggufdesk_cancel_seconds_count")
                s0 = await gauge(probe, srv, "ggufdesk_cancel_seconds_sum")
                if kind == "decoding":
                    t_close = await dropping_client(srv, f"{PROMPT} (drop {k})", 800, 8, 0)
                else:
                    t_close = await dropping_client(srv, long_prompt(words, seed + k), 800, 0, 0.5)
                while await gauge(probe, srv, "ggufdesk_requests_running") > base:
                    await asyncio.sleep(0.005)
                out[f"{kind}_polled"].append(time.perf_counter() - t_close)
                while await gauge(probe, srv, "ggufdesk_cancel_seconds_count") < n0 + 1:
                    await asyncio.sleep(0.005)
                out[kind].append(await gauge(probe, srv, "ggufdesk_cancel_seconds_sum") - s0)
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
    return {f"{kind}_s": v for kind, v in out.items()}


def ggufdesk_run(model: str, a: argparse.Namespace) -> float:
    out = subprocess.run([sys.executable, "-m", "ggufdesk", "run", model, "--prompt", PROMPT, "--max-tokens",
                          str(a.tokens), "--temperature", "0", "--threads", str(a.threads), "--threads-batch",
                          str(a.threads), "--ctx", str(a.ctx), "--flash-attn", "on", "--json"],
                         capture_output=True, text=True, check=True, cwd=str(ROOT))
    return json.loads(out.stdout)["decode_tok_s"]


# ---- main -------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF (default: the starter)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ctx", type=int, default=8192,
                    help="KV cells shared by all sequences (each may use them all), as ggufdesk's unified cache")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96, help="tokens per streamed answer")
    ap.add_argument("--reps", type=int, default=2, help="single-stream repetitions per server")
    ap.add_argument("--big-words", type=int, default=3000, help="words in the long prompt (~tokens)")
    ap.add_argument("--prefix-words", type=int, default=1500)
    ap.add_argument("--skip-llama-server", action="store_true")
    ap.add_argument("--before", metavar="APP_DIR",
                    help="also run another tree's ggufdesk (e.g. /tmp/before/app of a git worktree) beside ours")
    ap.add_argument("--skip-llama-cpp-python", action="store_true")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--aggregate-reps", type=int, default=0,
                    help="only compare aggregate tok/s at --clients streams, this many interleaved rounds")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--agent-prefill-reps", type=int, default=0,
                    help="only compare prefill of Claude Code's ~20k-token agent prompt, this many interleaved rounds")
    ap.add_argument("--agent-chars", type=int, default=0, help="cut the agent prompt's system text (a smoke run)")
    a = ap.parse_args()
    if a.model is None:
        sys.path.insert(0, str(ROOT / "app"))
        from ggufdesk.core.starter import starter_model_path

        a.model = str(starter_model_path())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on kill too
    servers = make_servers(a.model, a)
    logs = Path(tempfile.mkdtemp(prefix="bench-server-"))
    results: dict = {"config": {k: v for k, v in vars(a).items()}, "load_avg_start": os.getloadavg(),
                     "servers": {s.name: {} for s in servers}}
    try:
        for s in servers:  # one at a time: loading competes for the same cores
            s.start(logs)
            s.wait_ready()
        print(f"servers ready (logs in {logs}); load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
        if a.aggregate_reps:
            aggregate_rounds(servers, a)
            return 0
        if a.agent_prefill_reps:
            agent_prefill(servers, a)
            return 0
        run_rates: list[float] = []
        results["ggufdesk_run_decode_tok_s"] = run_rates
        for rep in range(a.reps):
            run_rates.append(ggufdesk_run(a.model, a))
            print(f"  single #{rep + 1} ggufdesk run: {run_rates[-1]:.1f} tok/s", file=sys.stderr)
            for s in servers:
                r = asyncio.run(concurrent(s, 1, a.tokens))
                results["servers"][s.name].setdefault("single", []).append(r["single_decode_tok_s"])
                print(f"  single #{rep + 1} {s.name}: {r['single_decode_tok_s']:.1f} tok/s", file=sys.stderr)
                save(a, results)
        for n in (4, 8):
            for s in servers:
                r = asyncio.run(concurrent(s, n, a.tokens))
                results["servers"][s.name][f"c{n}"] = r
                print(f"  {n} streams {s.name}: {r['aggregate_tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50']:.2f} s, "
                      f"ITL p50 {1000 * r['itl_p50']:.0f} ms", file=sys.stderr)
                save(a, results)
        seed = int(time.time())  # fresh text: no server has it cached from an earlier run
        for s in servers:
            results["servers"][s.name]["big_prompt"] = asyncio.run(big_prompt_arrives(s, a.tokens * 3, a.big_words,
                                                                                     seed))
            results["servers"][s.name]["shared_prefix"] = asyncio.run(shared_prefix(s, a.prefix_words, seed + 7))
            print(f"  long prompt and shared prefix {s.name}: {results['servers'][s.name]['big_prompt']} "
                  f"{results['servers'][s.name]['shared_prefix']}", file=sys.stderr)
            save(a, results)
        ours = next(s for s in servers if s.name == "ggufdesk serve")
        results["servers"][ours.name]["disconnect"] = asyncio.run(disconnects(ours, a.big_words, seed + 11))
        print(f"  disconnects {ours.name}: {results['servers'][ours.name]['disconnect']}", file=sys.stderr)
        save(a, results)
    finally:
        for s in servers:
            s.stop()
    results["load_avg_end"] = os.getloadavg()
    save(a, results)
    report(results)
    return 0


def aggregate_rounds(servers: list[Server], a: argparse.Namespace) -> None:
    """Aggregate tok/s at a.clients streams, server after server, the order alternating per round;
    the ratio of medians and each round's ratio against the first server (ggufdesk serve)."""
    got: dict[str, list[float]] = {s.name: [] for s in servers}
    for rnd in range(a.aggregate_reps):
        for s in servers if rnd % 2 == 0 else servers[::-1]:
            got[s.name].append(asyncio.run(concurrent(s, a.clients, a.tokens))["aggregate_tok_s"])
        print(f"  round {rnd + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in got.items()), file=sys.stderr)
    ours = got[servers[0].name]
    for s in servers[1:]:
        pairs = [x / y for x, y in zip(ours, got[s.name])]
        print(f"{a.clients} streams, {a.aggregate_reps} interleaved rounds: {servers[0].name} "
              f"{statistics.median(ours):.1f} tok/s vs {s.name} {statistics.median(got[s.name]):.1f} = "
              f"{statistics.median(ours) / statistics.median(got[s.name]):.3f}x (median of medians); per round "
              + " ".join(f"{r:.2f}" for r in pairs) + f", median {statistics.median(pairs):.3f}x")


def agent_request(nonce: str, chars: int = 0) -> dict:
    """Claude Code's recorded request as one OpenAI chat request both servers take (system text first,
    a nonce at its head so no prefix cache helps, the user turns, the tools as functions)."""
    body = json.loads((ROOT / "tests" / "fixtures" / "clients" / "claude_code_2.1.197_main.json").read_text())

    def text(content) -> str:
        return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)

    system = [nonce, text(body["system"])] + [text(m["content"]) for m in body["messages"] if m["role"] == "system"]
    whole = "\n\n".join(system)
    msgs = [{"role": "system", "content": whole[:chars] if chars else whole}] + [
        {"role": m["role"], "content": text(m["content"])} for m in body["messages"] if m["role"] != "system"]
    if not chars:  # (a short smoke run: no tools either)
        # the tools as JSON text in the system turn, not a `tools` field: llama-server renders the starter's
        # (Gemma 3) template without the field's ~19k tokens while ggufdesk renders them, so the two servers
        # would prefill different prompts (2,946 against 21,776 tokens, seen on the first run)
        tools = [{"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
                 for t in body["tools"]]
        msgs[0]["content"] += "\n\n# Tools\n" + json.dumps(tools, indent=1)
    return {"messages": msgs, "max_tokens": 1, "temperature": 0}


def agent_prefill(servers: list[Server], a: argparse.Namespace) -> None:
    """Prefill tok/s of the agent prompt on each server, rounds interleaved, order alternating."""
    got: dict[str, list[tuple[int, float]]] = {s.name: [] for s in servers}
    for rnd in range(a.agent_prefill_reps):
        for s in servers if rnd % 2 == 0 else servers[::-1]:
            body = {**agent_request(f"session {random.getrandbits(64):x}", a.agent_chars), "model": s.model}
            r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=3600)
            r.raise_for_status()
            t = r.json()["timings"]
            got[s.name].append((t["prompt_n"], 1000 * t["prompt_n"] / t["prompt_ms"]))
        print(f"  round {rnd + 1}: " + ", ".join(f"{n} {v[-1][0]} tokens at {v[-1][1]:.0f} tok/s"
                                                 for n, v in got.items()), file=sys.stderr)
    ours = statistics.median(x for _, x in got[servers[0].name])
    for s in servers[1:]:
        theirs = statistics.median(x for _, x in got[s.name])
        print(f"agent prompt prefill, {a.agent_prefill_reps} rounds: {servers[0].name} {ours:.0f} tok/s "
              f"({got[servers[0].name][0][0]} tokens) vs {s.name} {theirs:.0f} tok/s ({got[s.name][0][0]} tokens) "
              f"= {ours / theirs:.2f}x")


def save(a: argparse.Namespace, results: dict) -> None:
    """Results so far (a long run that is stopped keeps what it measured)."""
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


def report(r: dict) -> None:
    servers = r["servers"]
    ours = servers["ggufdesk serve"]
    single = {n: statistics.median(v["single"]) for n, v in servers.items()}
    print(f"\nload average at start {r['load_avg_start'][0]:.1f}, at end {r['load_avg_end'][0]:.1f} "
          f"(2-core machine shared with other work: absolute numbers drift, ratios are same-run)")
    print(f"{'server':18} {'1 stream':>9} {'4 streams':>10} {'8 streams':>10} {'TTFT p50/p99 @8':>17} "
          f"{'ITL p50/p99 @8 (ms)':>20}")
    for name, v in servers.items():
        c8 = v["c8"]
        print(f"{name:18} {single[name]:9.1f} {v['c4']['aggregate_tok_s']:10.1f} {c8['aggregate_tok_s']:10.1f} "
              f"{c8['ttft_p50']:8.2f}/{c8['ttft_p99']:.2f} s {1000 * c8['itl_p50']:10.0f}/{1000 * c8['itl_p99']:.0f}")
    print("\nlong prompt arriving beside 3 running streams:")
    for name, v in servers.items():
        b, p = v["big_prompt"], v["shared_prefix"]
        print(f"  {name:18} worst gap {b['running_worst_gap_s']:.2f} s = {b['worst_over_median']:.1f}x median; "
              f"its TTFT {b['ttft_beside_3_s']:.2f} s = {b['ttft_ratio']:.2f}x alone; "
              f"shared-prefix 2nd TTFT = {p['ratio']:.2f}x 1st")
    run = statistics.median(r["ggufdesk_run_decode_tok_s"])
    print("\nratios (targets from issue 9):")
    print(f"  single stream vs ggufdesk run:           {single['ggufdesk serve'] / run:.2f}x (>= 0.95)")
    one = single["ggufdesk serve"]
    print(f"  4 streams vs our single stream:          {ours['c4']['aggregate_tok_s'] / one:.2f}x (>= 1.4)")
    print(f"  8 streams vs our single stream:          {ours['c8']['aggregate_tok_s'] / one:.2f}x (>= 2.0)")
    if "llama-server" in servers:
        print(f"  4 streams vs llama-server 4 streams:     "
              f"{ours['c4']['aggregate_tok_s'] / servers['llama-server']['c4']['aggregate_tok_s']:.2f}x (>= 1.0)")
    print(f"  long prompt: worst gap / median          {ours['big_prompt']['worst_over_median']:.1f}x (<= 10)")
    print(f"  long prompt: TTFT beside 3 / alone       {ours['big_prompt']['ttft_ratio']:.2f}x (<= 1.5)")
    print(f"  shared 1,500-token prefix: 2nd/1st TTFT  {ours['shared_prefix']['ratio']:.2f}x (<= 0.25)")
    d = ours["disconnect"]
    print(f"  disconnect to free sequence, worst of {len(d['decoding_s'])}: while decoding "
          f"{1000 * max(d['decoding_s']):.0f} ms, while prefilling {1000 * max(d['prefilling_s']):.0f} ms (<= 100 ms; "
          f"polled from the client: {1000 * max(d['decoding_polled_s']):.0f} / "
          f"{1000 * max(d['prefilling_polled_s']):.0f} ms)")


if __name__ == "__main__":
    sys.exit(main())
