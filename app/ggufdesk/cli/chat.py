"""`ggufdesk chat`: an interactive terminal chat through the engine process (useful on headless machines)."""
from __future__ import annotations

import argparse
import sys

from ggufdesk.cli.run import add_model_arguments, resolve_model, settings_from_args
from ggufdesk.cli.worker import describe_split
from ggufdesk.core.errors import KnownError

NAME = "chat"
HELP = "chat in the terminal (Ctrl-C stops an answer; /reset clears the conversation; /exit quits)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--system", default="", help="system prompt")
    p.add_argument("--completion", action="store_true",
                   help="plain text continuation instead of chat turns (for base models)")


def run(args: argparse.Namespace, *, stdin=None, stdout=None) -> int:
    from ggufdesk.engine import protocol as P
    from ggufdesk.engine.client import EngineClient

    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    load, sampling, spec = settings_from_args(args)
    model = resolve_model(args.model)
    history: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    with EngineClient() as client:
        loaded = client.load(model, settings=load, speculation=spec)
        mode = "completion" if args.completion else "chat"
        note = " (no chat template: built-in turn format; a base model may answer poorly)" \
            if loaded.chat_format == "completion" and mode == "chat" else ""
        print(f"ggufdesk: {loaded.arch} model loaded in {loaded.load_s:.1f} s, {mode} mode{note}. "
              "Ctrl-C stops an answer, /reset clears, /exit quits.", file=out)
        if loaded.rpc:
            print(f"ggufdesk: {describe_split(loaded.rpc)}", file=out)
        while True:
            print("\n> ", end="", file=out, flush=True)
            line = stdin.readline()
            if not line or line.strip() in ("/exit", "/quit"):
                return 0
            text = line.rstrip("\n")
            if text.strip() == "/reset":
                history = history[:1] if args.system else []
                print("(conversation cleared)", file=out)
                continue
            if not text.strip():
                continue
            if mode == "chat":
                history.append({"role": "user", "content": text})
                rid = client.generate(messages=history, sampling=sampling)
            else:
                rid = client.generate(prompt=text, sampling=sampling)
            answer: list[str] = []
            try:
                for ev in client.stream(rid):
                    if isinstance(ev, P.Token):
                        answer.append(ev.text)
                        out.write(ev.text)
                        out.flush()
                    elif isinstance(ev, P.Stats) and ev.final:
                        print(f"\n[{ev.n_gen} tokens, {ev.decode_tok_s:.1f} tok/s, TTFT {ev.ttft_s:.2f} s]",
                              file=out, end="")
                    elif isinstance(ev, P.Error):
                        print(f"\n[error: {ev.message}]", file=out, end="")
            except KeyboardInterrupt:
                client.cancel(rid)
                for _ev in client.stream(rid):
                    pass
                print("\n[stopped]", file=out, end="")
            if mode == "chat":
                if answer:
                    history.append({"role": "assistant", "content": "".join(answer)})
                else:
                    history.pop()
    raise KnownError("unreachable")  # pragma: no cover
