"""`ggufdesk chat` survives whatever arrives on standard input (16.9)."""
from __future__ import annotations

import io
import subprocess
import sys

from ggufdesk.cli.chat import readable


def test_invalid_utf8_is_read_as_replacement_characters():
    raw = io.TextIOWrapper(io.BytesIO(b"caf\xe9 \xff\xfe\x00 ok\n"), encoding="utf-8")
    assert readable(raw).readline() == "caf\ufffd \ufffd\ufffd\x00 ok\n"
    text = io.StringIO("already text\n")
    assert readable(text) is text


def test_chat_with_binary_input_answers_and_exits_cleanly(tiny_model):
    p = subprocess.run([sys.executable, "-m", "ggufdesk", "chat", str(tiny_model), "--ctx", "256",
                        "--max-tokens", "3", "--temperature", "0"],
                       input=b"caf\xe9 \xff\xfe the cat\n\x89PNG\x1a\x00\xc3\n/exit\n", capture_output=True,
                       timeout=180)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 0, err
    assert "Traceback" not in err
    assert p.stdout.decode("utf-8", "replace").count("tokens,") == 2  # both lines were answered
