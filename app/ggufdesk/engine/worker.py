"""The engine child process: read requests on stdin, act, write events as JSON lines.

Events go to the original stdout; fd 1 is then pointed at stderr so that C code printing to
stdout can never corrupt the event stream. Requests are read on a thread so that `cancel`
takes effect while a generation (or a long prefill) is running on the main thread.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sys
import threading
import time
import traceback
from typing import Any, TextIO

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine import protocol as P

log = logging.getLogger("ggufdesk.engine")


class Emitter:
    """Writes events, one JSON line each, from any thread."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        line = P.encode(event)
        with self._lock:
            self._out.write(line)
            self._out.flush()


class CancelBook:
    """Which requests are cancelled; sets the abort flag when the running one is."""

    def __init__(self) -> None:
        self.flag = threading.Event()
        self._lock = threading.Lock()
        self._cancelled: set[str] = set()
        self._current: str | None = None

    def cancel(self, rid: str) -> None:
        with self._lock:
            self._cancelled.add(rid)
            if rid == self._current:
                self.flag.set()

    def start(self, rid: str) -> bool:
        """Mark rid as running; True if it was cancelled before it started."""
        with self._lock:
            self._current = rid
            self.flag.clear()
            return rid in self._cancelled

    def is_cancelled(self) -> bool:
        return self.flag.is_set()

    def finish(self) -> None:
        with self._lock:
            self._cancelled.discard(self._current)
            self._current = None
            self.flag.clear()


class Engine:
    """Holds the loaded model (and draft) and serves requests on the main thread."""

    def __init__(self, emit: Emitter, book: CancelBook) -> None:
        from ggufdesk.engine.native import LlamaLog

        self.emit = emit
        self.book = book
        self.llama_log = LlamaLog()
        self.lm = None
        self.gen = None
        self.template = None
        self.speculation = SpeculationSettings()
        self.draft = None  # speculative.DraftModel
        self._bytes_per_token: int | None = None  # for self-calibration, read once per model

    # ---- load / unload --------------------------------------------------------------------------

    def load(self, req: P.Load) -> None:
        from ggufdesk.engine.chat import ChatTemplate
        from ggufdesk.engine.generate import Generator
        from ggufdesk.engine.native import load_model

        try:
            settings = LoadSettings(**req.settings)
            spec = SpeculationSettings(**req.speculation) if req.speculation else SpeculationSettings()
            if req.draft:
                spec = dataclasses.replace(spec, mode="draft", draft_model=req.draft)
        except (KnownError, TypeError) as e:
            self.emit(P.Error(kind="settings", message=str(e)))
            return
        self.unload(quiet=True)
        try:
            offload = _rpc_offload(req.model, settings)
            lm = load_model(req.model, settings, self.llama_log, n_outputs=spec.k_max + 1, offload=offload)
        except KnownError as e:
            self.emit(P.Error(kind="load", message=str(e), detail="\n".join(self.llama_log.since(0)[-30:])))
            return
        lm.aborter.flag = self.book.flag
        self.lm, self.gen, self.speculation = lm, Generator(lm), spec
        self._bytes_per_token = None
        meta = lm.metadata
        bos = _piece(self.gen, meta.get("tokenizer.ggml.bos_token_id"))
        eos = _piece(self.gen, meta.get("tokenizer.ggml.eos_token_id"))
        try:
            self.template = ChatTemplate(lm.chat_template, bos=bos, eos=eos)
        except KnownError as e:
            self.emit(P.Error(kind="template", message=str(e)))
            self.template = ChatTemplate(None, bos=bos, eos=eos)
        memory = dict(lm.memory)
        if spec.mode == "draft":
            try:
                from ggufdesk.engine.speculative import DraftModel

                self.draft = DraftModel.load(spec, target=lm, llama_log=self.llama_log)
                memory["draft"] = self.draft.memory_bytes
            except KnownError as e:
                self.emit(P.Error(kind="draft", message=str(e)))
                self.speculation = dataclasses.replace(spec, mode="off", draft_model=None)
        chat_format = "completion" if self.template.builtin else "template"
        self.emit(P.Loaded(
            model=req.model, arch=lm.arch, n_ctx=lm.n_ctx, n_ctx_train=lm.model.n_ctx_train(),
            n_vocab=lm.n_vocab, n_layer=lm.n_layer, n_gpu_layers=settings.n_gpu_layers,
            chat_format=chat_format, memory=memory, load_s=round(lm.load_s, 3),
            draft=self.draft.path if self.draft else None, settings=P.fields_of(settings),
            rpc=offload.plan if offload else {},
        ))

    def unload(self, quiet: bool = False) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None
        if self.lm is not None:
            self.gen = None
            self.lm.close()
            self.lm = None
        if not quiet:
            self.emit(P.Unloaded())

    # ---- generate -------------------------------------------------------------------------------

    def generate(self, req: P.Generate) -> None:
        from ggufdesk.engine.generate import Cancelled

        t_start = time.perf_counter()
        if self.book.start(req.id):
            self.emit(P.Done(id=req.id, finish_reason="cancelled"))
            return
        try:
            if self.gen is None:
                raise KnownError("no model is loaded")
            sampling = SamplingSettings(**req.sampling)
            spec = self.speculation if req.speculation is None else dataclasses.replace(
                self.speculation, **req.speculation)
            cap = self.lm.n_outputs - 1  # logits rows reserved at load: [last] + K max
            if spec.k_max > cap:
                spec = dataclasses.replace(spec, k_max=cap, k_min=min(spec.k_min, cap))
            prompt, stops = self._prompt(req, sampling)
            if stops:
                sampling = dataclasses.replace(sampling, stop=sampling.stop + stops)
            drafter = self._drafter(spec, prompt, sampling.max_tokens)
            pieces: list[str] = []

            def emit_text(text: str) -> None:
                pieces.append(text)
                self.emit(P.Token(id=req.id, text=text))

            def on_progress(done: int, total: int) -> None:
                self.emit(P.Progress(id=req.id, phase="prefill", done=done, total=total))

            finish, st = self.gen.run(
                prompt, sampling, emit_text=emit_text, on_progress=on_progress,
                on_stats=lambda s: self.emit(self._stats(req.id, s, final=False)),
                cancelled=self.book.is_cancelled, drafter=drafter, t_start=t_start,
            )
            self.emit(self._stats(req.id, st, final=True))
            self.emit(P.Done(id=req.id, finish_reason=finish, text="".join(pieces), tokens=st.tokens,
                             usage={"prompt_tokens": st.n_prompt, "completion_tokens": st.n_gen}))
            if drafter is None:  # after Done: the first call reads the GGUF header
                self._calibrate(st.n_gen, st.decode_tok_s)
        except Cancelled:
            self.emit(P.Done(id=req.id, finish_reason="cancelled"))
        except KnownError as e:
            kind = getattr(e, "kind", "generate")
            self.emit(P.Error(kind=kind, id=req.id, message=str(e)))
        finally:
            self.book.finish()

    def _prompt(self, req: P.Generate, sampling: SamplingSettings) -> tuple[list[int], list[str]]:
        from ggufdesk.engine.chat import fit_messages

        gen, n_ctx = self.gen, self.lm.n_ctx
        reserve = min(sampling.max_tokens, n_ctx // 2)
        if req.messages is not None:
            def count(msgs: list[dict[str, str]]) -> int:
                return len(self._chat_tokens(msgs))

            budget = n_ctx - reserve
            if req.context_policy == "refuse" and count(req.messages) > budget:
                raise _context_error(count(req.messages), budget)
            messages = fit_messages(req.messages, count, budget)
            return self._chat_tokens(messages), list(self.template.stops)
        if req.prompt is None:
            raise KnownError("a generate request needs a prompt or messages")
        tokens = gen.tokenize(req.prompt)
        if len(tokens) >= n_ctx:
            raise _context_error(len(tokens), n_ctx - 1)
        return tokens, []

    def _chat_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.template.render(messages)
        bos = llama_bos_text(self.gen)
        return self.gen.tokenize(text, add_bos=not (bos and text.startswith(bos)))

    def _calibrate(self, n_gen: int, tok_s: float) -> None:
        """Feed a plain run's real decode speed back to the planner (hardware.record_decode_run),
        so later predictions on this machine use its effective bandwidth."""
        lm = self.lm
        if n_gen < 32 or tok_s <= 0 or lm.settings.n_threads != 0:
            return  # too short to be steady, or a hand-picked thread count
        if lm.settings.rpc:
            return  # spread over RPC workers: says nothing about this machine's bandwidth
        gpu_bytes, ngl = lm.memory.get("gpu", 0), lm.settings.n_gpu_layers
        where = "cpu" if gpu_bytes == 0 else "gpu" if ngl < 0 or ngl > lm.n_layer else None
        if where is None:
            return  # a split model says little about either side
        try:
            from ggufdesk.core import gguf_meta, hardware, planner

            if self._bytes_per_token is None:
                self._bytes_per_token = planner.weight_bytes_per_token(gguf_meta.read_gguf(lm.path))
            hardware.record_decode_run(where=where, bytes_per_token=self._bytes_per_token, tok_s=tok_s,
                                       n_layer=lm.n_layer)
        except (KnownError, OSError, ValueError) as e:
            log.warning("could not record the decode speed: %s", e)

    def _drafter(self, spec: SpeculationSettings, prompt: list[int], max_tokens: int):
        if spec.mode == "off":
            return None
        from ggufdesk.engine import speculative

        return speculative.make_drafter(spec, prompt=prompt, draft=self.draft, target=self.lm,
                                       max_tokens=max_tokens)

    @staticmethod
    def _stats(rid: str, st, *, final: bool) -> P.Stats:
        return P.Stats(
            id=rid, n_prompt=st.n_prompt, n_reused=st.n_reused, n_gen=st.n_gen,
            ttft_s=round(st.ttft_s, 4), prefill_tok_s=round(st.prefill_tok_s, 2),
            decode_tok_s=round(st.decode_tok_s, 2), drafted=st.drafted, accepted=st.accepted,
            draft_len=st.draft_len, speculation=st.speculation, final=final,
            llama_perf=st.perf if final else {},
        )


def _rpc_offload(model: str, settings: LoadSettings):
    """With RPC workers: check them, split the model, register their devices (engine/rpc.py)."""
    if not settings.rpc:
        return None
    from ggufdesk.engine.rpc import prepare_offload

    return prepare_offload(model, settings)


def _context_error(n: int, room: int) -> KnownError:
    e = KnownError(f"the prompt is {n} tokens but the context has room for {room}; "
                   "shorten it or load the model with a larger context")
    e.kind = "context"  # type: ignore[attr-defined]
    return e


def _piece(gen: Any, token_id: str | None) -> str:
    if token_id in (None, ""):
        return ""
    import llama_cpp

    try:
        return llama_cpp.llama_vocab_get_text(gen.lm.vocab, int(token_id)).decode("utf-8", "replace")
    except (ValueError, TypeError):
        return ""


def llama_bos_text(gen: Any) -> str:
    import llama_cpp

    return _piece(gen, str(llama_cpp.llama_vocab_bos(gen.lm.vocab)))


def _read_requests(stdin: TextIO, inbox: queue.Queue, book: CancelBook, emit: Emitter) -> None:
    for line in stdin:
        if not line.strip():
            continue
        try:
            msg = P.decode(line)
        except P.ProtocolError as e:
            emit(P.Error(kind="protocol", message=str(e)))
            continue
        if isinstance(msg, P.Cancel):
            book.cancel(msg.id)
        inbox.put(msg)
    inbox.put(P.Shutdown())  # parent went away


def main() -> int:
    events_fd = os.dup(1)
    os.dup2(2, 1)  # C code printing to stdout now lands on stderr
    out = os.fdopen(events_fd, "w", encoding="utf-8", buffering=1)
    sys.stdout = sys.stderr
    emit = Emitter(out)
    book = CancelBook()
    inbox: queue.Queue = queue.Queue()
    try:
        import llama_cpp

        from ggufdesk.engine.devices import ggml_devices

        engine = Engine(emit, book)
        emit(P.Ready(pid=os.getpid(), llama_cpp_version=llama_cpp.__version__,
                     system_info=llama_cpp.llama_print_system_info().decode(errors="replace"),
                     devices=ggml_devices()))
    except Exception as e:  # noqa: BLE001 - the parent must hear why we cannot start
        emit(P.Error(kind="bug", message=f"the engine could not start: {e}", detail=traceback.format_exc()))
        return 1
    threading.Thread(target=_read_requests, args=(sys.stdin, inbox, book, emit), daemon=True).start()
    while True:
        msg = inbox.get()
        try:
            if isinstance(msg, P.Shutdown):
                engine.unload(quiet=True)
                return 0
            if isinstance(msg, P.Load):
                engine.load(msg)
            elif isinstance(msg, P.Generate):
                engine.generate(msg)
            elif isinstance(msg, P.Unload):
                engine.unload()
            elif isinstance(msg, P.Cancel):
                pass  # handled on the reader thread
            else:
                emit(P.Error(kind="protocol", message=f"not a request: {msg.TYPE}"))
        except Exception as e:  # noqa: BLE001 - a bug of ours must not kill the engine
            emit(P.Error(kind="bug", id=getattr(msg, "id", None), message=f"internal error: {e}",
                         detail=traceback.format_exc()))


if __name__ == "__main__":
    sys.exit(main())
