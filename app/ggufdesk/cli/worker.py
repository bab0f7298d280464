"""`ggufdesk worker`: offer this machine's memory (GPU, else CPU) to other ggufdesk machines over RPC."""
from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from ggufdesk.core import procs
from ggufdesk.core.errors import KnownError
from ggufdesk.core.rpc_wire import RpcConnection, WorkerDown, parse_workers, probe_worker

NAME = "worker"
HELP = "serve this machine's memory to other machines (llama.cpp RPC); use it with --rpc HOST:PORT"
GiB = 1 << 30
WARNING = ("WARNING: llama.cpp's RPC has no authentication and no encryption: anyone who can reach "
           "{host}:{port} can run code paths of llama.cpp on this machine and read what it computes. "
           "Use it on a trusted LAN only, or bind 127.0.0.1 and reach it through an SSH tunnel "
           "(ssh -L {port}:127.0.0.1:{port} this-machine).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=50052, help="port (0 = pick a free one and print it)")
    p.add_argument("--mem", type=int, default=0,
                   help="bytes of memory to offer (what planners see; default: all free memory)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads (0 = the physical cores it may use, a hybrid CPU's fast ones)")
    p.add_argument("--cpu", action="store_true", help="offer the CPU even when a GPU is present")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow listening on a non-loopback address (unauthenticated, unencrypted)")


def add_rpc_argument(p: argparse.ArgumentParser) -> None:
    """`--rpc host:port[,host:port]` for commands that load a model (run, chat, serve)."""
    p.add_argument("--rpc", default="", metavar="HOST:PORT[,HOST:PORT]",
                   help="spread the model over these `ggufdesk worker` machines (llama.cpp RPC)")


def rpc_from_args(args: argparse.Namespace) -> list[str]:
    """The checked worker list of `--rpc` (SettingsError on a malformed one)."""
    return parse_workers(getattr(args, "rpc", "") or "")


def probe_workers_json(endpoints: list[str]) -> list[dict[str, Any]]:
    """Each worker's memory, round trip and link speed; a worker that does not answer says why."""
    out: list[dict[str, Any]] = []
    for ep in endpoints:
        try:
            out.append(probe_worker(ep).to_json())
        except WorkerDown as e:
            out.append({"endpoint": ep, "error": str(e)})
    return out


def describe_worker(w: dict[str, Any]) -> str:
    if "error" in w:
        return f"RPC worker {w['endpoint']}: DOWN ({w['error']})"
    mem = ", ".join(f"{d['memory_free'] / GiB:.2f} of {d['memory_total'] / GiB:.2f} GB free" for d in w["devices"])
    return (f"RPC worker {w['endpoint']}: {mem}; round trip {w['rtt_ms']:.2f} ms, "
            f"link {w['link_gbs']:.2f} GB/s (protocol {w['version']})")


def describe_split(rpc: dict[str, Any]) -> str:
    """One line: where the layers went and the predicted speed (Loaded.rpc)."""
    parts = [f"{d['endpoint'] or d['name']}: {d['n_layers']} layers" for d in rpc.get("devices", [])]
    parts.append(f"this machine: {rpc.get('cpu_layers', 0)} layers")
    return (f"spread over {', '.join(parts)}; predicted {rpc.get('pred_decode_tok_s', 0):.1f} tok/s "
            f"({rpc.get('network_ms_per_token', 0):.2f} ms/token on the network)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """`port` if nothing listens on it yet (0: any free one); KnownError if taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's server does
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            raise KnownError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        bound: int = s.getsockname()[1]  # (host, port) or (host, port, flow, scope)
        return bound


def answers(endpoint: str) -> bool:
    """Our own server answers a HELLO (a stranger on the port that stays silent does not count)."""
    try:
        RpcConnection(endpoint, timeout=1.0).close()
    except WorkerDown:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    host, port = args.host, args.port
    if not 0 <= port <= 65535:
        raise KnownError(f"--port must be 0-65535, got {port}")
    if args.mem < 0:
        raise KnownError(f"--mem must be a number of bytes, got {args.mem}")
    if not is_loopback(host):
        if not args.allow_remote:
            raise KnownError(f"{host} is not a loopback address: RPC has no authentication or encryption. "
                             "Pass --allow-remote to serve on a trusted network, or use an SSH tunnel")
        print(WARNING.format(host=host, port=port or "PORT"), file=sys.stderr, flush=True)
    port = free_port(host, port)
    cmd = [sys.executable, "-m", "ggufdesk.engine.runtime.rpc", "--host", host, "--port", str(port),
           "--mem", str(args.mem), "--threads", str(args.threads)] + (["--cpu"] if args.cpu else [])
    child = subprocess.Popen(cmd, stdout=sys.stderr)  # llama.cpp's banner goes to our stderr
    stop = {"sig": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stop["sig"] = signum

    old = signal.signal(signal.SIGTERM, on_signal)
    try:
        probe_host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
        endpoint = f"{probe_host}:{port}"
        while child.poll() is None and not stop["sig"] and not answers(endpoint):
            time.sleep(0.1)
        if child.poll() is not None:
            raise KnownError(f"the RPC server stopped (exit code {child.returncode}); "
                             f"is {host}:{port} already in use?")
        mem = f", offering {args.mem / (1 << 20):.0f} MiB" if args.mem else ""
        print(f"ggufdesk worker listening on {host}:{port}{mem}; use it with --rpc {endpoint}", flush=True)
        while child.poll() is None and not stop["sig"]:
            try:
                child.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        if child.poll() is not None and not stop["sig"]:
            raise KnownError(f"the RPC server stopped (exit code {child.returncode})")
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
        procs.terminate(child, 5)
