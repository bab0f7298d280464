"""`ggufdesk worker`: offer this machine's memory (GPU, else CPU) to other ggufdesk machines over RPC."""
from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import subprocess
import sys
import time

from ggufdesk.core.errors import KnownError
from ggufdesk.core.rpc_wire import parse_workers, reachable

NAME = "worker"
HELP = "serve this machine's memory to other machines (llama.cpp RPC); use it with --rpc HOST:PORT"
WARNING = ("WARNING: llama.cpp's RPC has no authentication and no encryption: anyone who can reach "
           "{host}:{port} can run code paths of llama.cpp on this machine and read what it computes. "
           "Use it on a trusted LAN only, or bind 127.0.0.1 and reach it through an SSH tunnel "
           "(ssh -L {port}:127.0.0.1:{port} this-machine).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=50052, help="port (0 = pick a free one and print it)")
    p.add_argument("--mem", type=int, default=0,
                   help="bytes of memory to offer (what planners see; default: all free memory)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = physical cores)")
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host.strip("[]"), 0))
        return s.getsockname()[1]


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
    port = port or free_port(host)
    cmd = [sys.executable, "-m", "ggufdesk.engine.rpc", "--host", host, "--port", str(port),
           "--mem", str(args.mem), "--threads", str(args.threads)] + (["--cpu"] if args.cpu else [])
    child = subprocess.Popen(cmd, stdout=sys.stderr)  # llama.cpp's banner goes to our stderr
    stop = {"sig": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stop["sig"] = signum

    old = signal.signal(signal.SIGTERM, on_signal)
    try:
        probe_host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
        endpoint = f"{probe_host}:{port}"
        while child.poll() is None and not stop["sig"] and not reachable(endpoint, timeout=1.0):
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
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
