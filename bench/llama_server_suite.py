"""llama.cpp's own server test suite against llama-server and against `ggufdesk serve`, pass counts per file.

The suite is tools/server/tests of the llama.cpp vendored in the llama-cpp-python sdist we build on
(same version as bench/server.py's llama-server). Its tests download tiny models from the Hugging Face
hub; here every preset loads a local tiny model instead (tests/fixtures/ggufs.py), for both servers
alike, so tests that check a specific model's words fail for both. llama-server runs as built by
bench/server.py; ggufdesk runs through bench/llama_server_shim.py, which maps llama-server's flags to
`ggufdesk serve`'s. Each test starts its own server; load does not change the counts (only the time).

    python bench/llama_server_suite.py                    # both servers, the default files
    python bench/llama_server_suite.py --only ggufdesk --files basic,tokenize [-k EXPR] [--json out.json]

Prints, per file, the tests each server passes, the share of llama-server's passes that ggufdesk
also passes, and every test llama-server passes and ggufdesk does not, with the first line of why.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server import VERSION, free_port, llama_server_binary, tools_dir  # bench/server.py

ROOT = Path(__file__).resolve().parents[1]
FILES = ["basic", "chat_completion", "completion", "compat_anthropic", "compat_oai_responses", "ctx_shift",
         "security", "template", "tokenize", "ignore_eos", "metrics", "tool_call"]
SHIM = ROOT / "bench" / "llama_server_shim.py"
OVERRIDE = '''

# ---- bench/llama_server_suite.py: local tiny models instead of hub downloads ----------------------
import os as _os


def _local(make, path):
    def preset():
        s = make()
        s.model_hf_repo = s.model_hf_file = s.model_url = None
        s.model_file = path
        return s
    return staticmethod(preset)


for _name in ("tinyllama2", "tinyllama_infill", "stories15m_moe", "tinygemma3"):
    setattr(ServerPreset, _name, _local(getattr(ServerPreset, _name), _os.environ["SUITE_TINY_MODEL"]))
for _name in ("bert_bge_small", "bert_bge_small_with_fa", "jina_reranker_tiny"):
    setattr(ServerPreset, _name, _local(getattr(ServerPreset, _name), _os.environ["SUITE_BERT_MODEL"]))
ServerPreset.load_all = staticmethod(lambda: None)
ServerProcess.model_hf_repo = None
ServerProcess.model_hf_file = None
# a server is given 10 minutes to start, not 60 s: a Python server on a busy machine must not fail a
# test on its start-up time (both servers get the same)
_start = ServerProcess.start


def _patient_start(self, timeout_seconds=600):
    return _start(self, max(timeout_seconds, 600))


ServerProcess.start = _patient_start
'''
MARK = "\n\n# ---- bench/llama_server_suite.py"


def suite_dir() -> Path:
    """The sdist's tools/server/tests and models/templates, extracted once (their relative paths kept)."""
    out = tools_dir() / f"llama-server-suite-{VERSION}"
    tests = out / "tools" / "server" / "tests"
    utils = tests / "utils.py"
    if (tests / ".ok").exists():
        utils.write_text(utils.read_text().split(MARK, 1)[0] + OVERRIDE)  # this checkout's overrides
        return tests
    work = Path(tempfile.mkdtemp(prefix="suite-", dir=tools_dir()))
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                    f"llama-cpp-python=={VERSION}", "-d", str(work)], check=True)
    with tarfile.open(next(work.glob("llama_cpp_python-*.tar.gz"))) as t:
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        keep = [m for m in t.getmembers() if m.name.startswith((prefix + "tools/server/tests/",
                                                                prefix + "models/templates/"))]
        for m in keep:
            m.name = m.name[len(prefix):]
        shutil.rmtree(out, ignore_errors=True)
        t.extractall(out, members=keep, filter="data")
    shutil.rmtree(work, ignore_errors=True)
    utils.write_text(utils.read_text() + OVERRIDE)
    (tests / ".ok").touch()
    return tests


def suite_python() -> Path:
    """A venv with the suite's requirements (kept out of ours)."""
    venv = tools_dir() / f"llama-server-suite-venv-{VERSION}"
    py = venv / "bin" / "python"
    if not (venv / ".ok").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", str(suite_dir() / "requirements.txt")],
                       check=True)
        (venv / ".ok").touch()
    return py


def models(out: Path) -> tuple[Path, Path]:
    from tests.fixtures import ggufs

    tiny = out / "tiny-target.gguf"
    bert = out / "tiny-bert.gguf"
    if not tiny.exists():
        ggufs.write_tiny_llama(tiny, ggufs.TinySpec(seed=0))
    if not bert.exists():
        ggufs.write_tiny_bert(bert)
    return tiny, bert


def serve_flags(python: str) -> str:
    """The flags this checkout's `ggufdesk serve` offers (the shim maps only to those)."""
    text = subprocess.run([python, "-m", "ggufdesk", "serve", "--help"], capture_output=True, text=True,
                          cwd=str(ROOT), check=True).stdout
    return " ".join(sorted({w.strip("[],") for w in text.split() if w.strip("[],").startswith("--")}))


def run_file(kind: str, name: str, tests: Path, env: dict[str, str], py: Path, extra: list[str],
             timeout: int) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, first line of why)} for one file on one server."""
    report = Path(tempfile.mkstemp(suffix=".xml")[1])
    cmd = [str(py), "-m", "pytest", f"unit/test_{name}.py", "-q", "-p", "no:cacheprovider", "-o",
           "addopts=", "-m", "not slow", f"--junitxml={report}", *extra]  # (tests.sh's default: slow = hub models)
    try:
        subprocess.run(cmd, cwd=str(tests), env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        print(f"  {kind} {name}: timed out after {timeout} s", file=sys.stderr)
    results: dict[str, tuple[str, str]] = {}
    try:
        root = ET.parse(report).getroot()
    except (ET.ParseError, FileNotFoundError):
        return results
    finally:
        report.unlink(missing_ok=True)
    for case in root.iter("testcase"):
        tid = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                why = (el.get("message") or el.text or "").strip().splitlines()[0][:160] if (
                    el.get("message") or el.text) else ""
        results[tid] = (outcome, why)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", default=",".join(FILES), help="test files without test_ and .py, comma-separated")
    p.add_argument("--only", choices=["llama-server", "ggufdesk"], help="run one server only")
    p.add_argument("-k", default="", help="pytest -k expression")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per file and server")
    p.add_argument("--json", help="write every outcome here")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="no run: report these earlier --json files together")
    a = p.parse_args()
    if a.merge:
        merged: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}
        for path in a.merge:
            for name, per in json.loads(Path(path).read_text()).items():
                merged.setdefault(name, {}).update({k: {t: tuple(v) for t, v in r.items()} for k, r in per.items()})
        kinds_seen = sorted({k for per in merged.values() for k in per}, key=lambda k: k != "llama-server")
        report({n: {k: per.get(k, {}) for k in kinds_seen} for n, per in merged.items()}, kinds_seen)
        return 0
    tests, py = suite_dir(), suite_python()
    tiny, bert = models(tools_dir() / "suite-models")
    base = dict(os.environ, SUITE_TINY_MODEL=str(tiny), SUITE_BERT_MODEL=str(bert), LLAMA_CACHE=str(tests / "tmp"))
    kinds: dict[str, dict[str, str]] = {}
    if a.only != "ggufdesk":
        kinds["llama-server"] = {"LLAMA_SERVER_BIN_PATH": str(llama_server_binary())}
    if a.only != "llama-server":
        venv = ROOT / ".venv" / "bin" / "python"
        ours = str(venv) if venv.exists() else sys.executable
        kinds["ggufdesk"] = {"LLAMA_SERVER_BIN_PATH": str(SHIM), "GGUFDESK_PYTHON": ours,
                             "GGUFDESK_SERVE_FLAGS": serve_flags(ours)}
    extra = ["-k", a.k] if a.k else []
    outcomes: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}
    for name in a.files.split(","):
        outcomes[name] = {}
        for kind, env in kinds.items():
            env = {**base, **env, "PORT": str(free_port())}
            outcomes[name][kind] = run_file(kind, name, tests, env, py, extra, a.timeout)
            r = outcomes[name][kind]
            print(f"  {name:22s} {kind:12s} {sum(o == 'passed' for o, _ in r.values()):4d} passed of {len(r)}",
                  file=sys.stderr, flush=True)
            if a.json:  # after every file: a run stopped part way keeps what it measured (--merge reads it)
                Path(a.json).write_text(json.dumps(outcomes, indent=1))
    report(outcomes, list(kinds))
    return 0


def report(outcomes: dict[str, dict[str, dict[str, tuple[str, str]]]], kinds: list[str]) -> None:
    both = len(kinds) == 2
    print(f"\n{'file':24s}" + "".join(f"{k:>16s}" for k in kinds) + ("   both / llama-server" if both else ""))
    tot = {k: 0 for k in kinds}
    both_total = ref_total = 0
    missing: list[str] = []
    for name, per in outcomes.items():
        row = f"{name:24s}"
        for k in kinds:
            n = sum(o == "passed" for o, _ in per[k].values())
            tot[k] += n
            row += f"{n:>9d} of {len(per[k]):<4d}"
        if len(kinds) == 2:
            ref = {t for t, (o, _) in per["llama-server"].items() if o == "passed"}
            both = {t for t in ref if per["ggufdesk"].get(t, ("missing", ""))[0] == "passed"}
            both_total, ref_total = both_total + len(both), ref_total + len(ref)
            row += f"   {len(both):>4d} / {len(ref)}"
            missing += [f"{name}: {t}: {per['ggufdesk'].get(t, ('missing', 'not run'))[1]}" for t in sorted(ref - both)]
        print(row)
    share = f"   {both_total:>4d} / {ref_total} = {both_total / ref_total:.0%}" if both and ref_total else ""
    print(f"{'total':24s}" + "".join(f"{tot[k]:>16d}" for k in kinds) + share)
    if missing:
        print("\npassed by llama-server, not by ggufdesk:")
        print("\n".join("  " + m for m in missing))


if __name__ == "__main__":
    sys.exit(main())
