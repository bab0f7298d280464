"""The bundle against the venv, side by side: start-up to the window, decode speed, archive sizes.

    .venv/bin/python bench/dist.py [--bundle DIR] [--launches N] [--runs N] [--tokens N]

DIR is an extracted `make dist` bundle (default: dist/build/cpu/stage/<name>, what the last build left).
Start-up: spawn to the main window's first paint (offscreen), through the same hook in both
(installer/bundle_main.py with GGUFDESK_STARTUP_T0): `python installer/bundle_main.py` from the venv,
`ggufdesk-gui` from the bundle, interleaved. Decode: `ggufdesk run <starter> --json` from each, interleaved,
same model, prompt, seed and threads. Targets: start-up <= 1.5x the venv's, decode >= 0.98x the venv's,
archive <= 200 MB without the starter model and <= 460 MB with it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MB = 1_000_000
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """No venv on PATH, no PYTHONPATH, an empty home: what a double-click gets."""
    env = {"HOME": str(tmp), "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp), "QT_QPA_PLATFORM": "offscreen",
           "GGUFDESK_NO_GPU_HINT": "1"}
    env.update(extra)
    return env


def launch(cmd: list[str]) -> float:
    """Seconds from spawn to the first paint; the process (and its engine) is killed right after."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        p = subprocess.Popen(cmd, env=clean_env(Path(d), GGUFDESK_STARTUP_T0=repr(t0)), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            for line in p.stdout:
                if line.startswith("SHOWN"):
                    return float(line.split()[1])
            raise SystemExit(f"{cmd[0]}: exited without showing a window (rc {p.wait()})")
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def decode(cmd: list[str], model: Path, tokens: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([*cmd, "run", str(model), "--prompt", PROMPT, "--max-tokens", str(tokens),
                            "--temperature", "0", "--seed", "1", "--threads", "2", "--threads-batch", "2",
                            "--ctx", "1024", "--json"],
                           env=clean_env(Path(d)), capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"{cmd[0]} run failed:\n{r.stderr[-2000:]}")
        return float(json.loads(r.stdout)["decode_tok_s"])


def default_bundle() -> Path | None:
    stage = ROOT / "dist" / "build" / "cpu" / "stage"
    found = sorted(stage.glob("ggufdesk-*")) if stage.is_dir() else []
    return found[-1] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=default_bundle())
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    if args.bundle is None or not (args.bundle / "ggufdesk").exists():
        raise SystemExit("no bundle: run `make dist` first, or pass --bundle DIR")
    print(f"bundle: {args.bundle}")
    print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f} on {os.cpu_count()} CPUs")

    for archive in sorted((ROOT / "dist").glob("ggufdesk*")):
        if archive.suffix in (".gz", ".deb"):
            print(f"size: {archive.name} {archive.stat().st_size / MB:.1f} MB")

    venv_gui = [sys.executable, str(ROOT / "installer" / "bundle_main.py")]
    bundle_gui = [str(args.bundle / "ggufdesk-gui")]
    sv, sb = [], []
    for _ in range(args.launches):  # interleaved: load on the machine hits both alike
        sv.append(launch(venv_gui))
        sb.append(launch(bundle_gui))
    mv, mb = statistics.median(sv), statistics.median(sb)
    print(f"start-up to window: venv median {mv:.2f} s {sv}, bundle median {mb:.2f} s {sb}")
    print(f"start-up ratio bundle/venv: {mb / mv:.2f} (target <= 1.5)")

    from ggufdesk.core.starter import starter_model_path

    model = starter_model_path()
    dv, db = [], []
    for _ in range(args.runs):
        dv.append(decode([str(VENV_BIN / "ggufdesk")], model, args.tokens))
        db.append(decode([str(args.bundle / "ggufdesk")], model, args.tokens))
    mv, mb = statistics.median(dv), statistics.median(db)
    print(f"decode tok/s on the starter: venv median {mv:.1f} {dv}, bundle median {mb:.1f} {db}")
    print(f"decode ratio bundle/venv: {mb / mv:.3f} (target >= 0.98)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
