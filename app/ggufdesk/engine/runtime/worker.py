"""The engine child process: read requests on stdin, act, write events as JSON lines.

Events go to the original stdout; fd 1 is then pointed at stderr so that C code printing to
stdout can never corrupt the event stream. Requests are read on a thread so that `cancel`
takes effect while a generation (or a long prefill) is running on the main thread.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import logging
import os
import queue
import re
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, TypeGuard, TypeVar, get_args

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine.batching import cpu_load
from ggufdesk.engine.link import engine_log, lifeline
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime import heap

if TYPE_CHECKING:
    from ggufdesk.core.images import Pixels
    from ggufdesk.core.reasoning import ReasoningFormat
    from ggufdesk.core.tools import ToolFormat
    from ggufdesk.engine.batching.batch import BatchEngine
    from ggufdesk.engine.batching.media import MediaPrompt
    from ggufdesk.engine.batching.shift import ContextUse
    from ggufdesk.engine.batching.vocab import Vocab
    from ggufdesk.engine.runtime.chat import ChatTemplate
    from ggufdesk.engine.runtime.embed import Embedder
    from ggufdesk.engine.runtime.native import LoadedModel
    from ggufdesk.engine.runtime.overflow import Fitted
    from ggufdesk.engine.runtime.prompt_tokens import PromptTokens
    from ggufdesk.engine.runtime.rpc import Offload
    from ggufdesk.engine.runtime.vision import Projector
    from ggufdesk.engine.speculation.draft_model import DraftModel
    from ggufdesk.engine.speculation.drafter import Drafter
    from ggufdesk.engine.speculation.lookup import NgramCache
    from ggufdesk.engine.speculation.speculative import TokenText
    from ggufdesk.engine.speculation.verify_cost import Calibration
    from ggufdesk.engine.structured.grammar import GrammarConstraint
    from ggufdesk.engine.structured.reasoning import ReasoningControl
    from ggufdesk.engine.structured.request import Structured

log = logging.getLogger("ggufdesk.engine")
T = TypeVar("T")
# while idle, the CPU-load sensor reads at its own period (a /proc/stat read, ~4 wake-ups a second)
IDLE_SENSE_S = cpu_load.PERIOD
Messages = list[dict[str, Any]]  # chat messages as the request carries them


@dataclass
class EmbedJob:
    """An Embed request in progress: its inputs are computed one per turn of the main loop."""

    req: P.Embed
    vectors: list[list[float]] = field(default_factory=list)
    n_tokens: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    n_decode: int = 0  # llama_decode calls so far


class Emitter:
    """Writes events, one JSON line each, from any thread."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._held_by: int | None = None  # the thread whose engine step holds its events back

    def __call__(self, event: P.Event) -> None:
        line = P.encode(event)
        with self._lock:
            try:
                self._out.write(line)
                if self._held_by != threading.get_ident():  # (a Pong from the reader goes out at once)
                    self._out.flush()
            except (BrokenPipeError, OSError):
                os._exit(0)  # the client is gone: nobody is left to hear us

    def flush(self) -> None:
        """Send what is held now (the step is about to compute: a cancel's Done must not wait for it)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        try:
            self._out.flush()
        except (BrokenPipeError, OSError):
            os._exit(0)  # the client is gone: nobody is left to hear us

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Events this thread emits inside go out together at the end: one engine step of N streams
        is one write and one wake-up of the client's reader, not N (on 2 cores every wake-up of the
        other process competes with the step's compute threads). Other threads' events are not held:
        the reader's Pong must reach the watchdog even while a long prefill step computes."""
        with self._lock:
            self._held_by = threading.get_ident()
        try:
            yield
        finally:
            with self._lock:
                self._held_by = None
                self._flush_locked()


class CancelBook:
    """Which requests are cancelled; sets the abort flag when one served by the running decode call is."""

    def __init__(self) -> None:
        self.flag = threading.Event()
        self._lock = threading.Lock()
        self._cancelled: set[str] = set()
        self._batch: set[str] = set()  # the requests the decode call in progress serves

    def cancel(self, rid: str) -> None:
        with self._lock:
            self._cancelled.add(rid)
            if rid in self._batch:
                self.flag.set()

    def is_cancelled(self, rid: str) -> bool:
        with self._lock:
            return rid in self._cancelled

    def set_batch(self, rids: list[str]) -> None:
        """The next decode call serves rids (empty: none running); the abort flag follows their cancels."""
        with self._lock:
            self._batch = set(rids)
            self.flag.clear()
            if self._batch & self._cancelled:
                self.flag.set()

    def cancel_current(self) -> None:
        """Cancel what the decode call in progress serves (the client is gone: Shutdown must be seen)."""
        with self._lock:
            self._cancelled |= self._batch
            if self._batch:
                self.flag.set()

    def finish(self, rid: str) -> None:
        with self._lock:
            self._cancelled.discard(rid)


class Engine:
    """Holds the loaded model (and draft) and serves requests on the main thread."""

    def __init__(self, emit: Emitter, book: CancelBook) -> None:
        from ggufdesk.engine.runtime.native import LlamaLog

        self.emit = emit
        self.book = book
        self.llama_log = LlamaLog()
        self.lm: LoadedModel | None = None
        self.vocab: Vocab | None = None  # of the loaded model
        self.template: ChatTemplate | None = None
        self.reasoning: ReasoningFormat | None = None  # of the loaded model's template
        self.tool_format: ToolFormat | None = None  # of it
        self._prompt_text = ""  # the last chat prompt rendered (where a reasoning block starts)
        self._prompt_tokens: PromptTokens | None = None  # chat prompts to tokens, of the loaded model
        self.speculation = SpeculationSettings()
        self.draft: DraftModel | None = None
        self.batch: BatchEngine | None = None  # runs the admitted requests step by step
        self.ngrams: NgramCache | None = None  # every prompt and answer so far, for prompt lookup
        self._lookup_prompts: dict[str, list[int]] = {}  # rid -> prompt, fed to ngrams at its Done
        self._decode_work: tuple[int, int] | None = None  # (bytes, matrices) per token, read once per model
        self.verify_costs: dict[int, float] | None = None  # engine/speculation/verify_cost.py, once per loaded model
        self._calibration: Calibration | None = None  # still to run while idle
        self._token_text: TokenText | None = None  # of the loaded model, read as lookup asks
        self.embedder: Embedder | None = None  # made at the first Embed (at load for an embedding model)
        self.embedding_only = False  # the loaded model computes embeddings and cannot generate
        self._embeds: deque[EmbedJob] = deque()
        self._eog: list[int] | None = None  # the loaded model's end-of-generation tokens (ignore_eos)
        self.projector: Projector | None = None  # a vision model's images (Load.mmproj)
        self._media: MediaPrompt | None = None  # of the chat prompt just rendered (None: text only)

    # ---- load / unload --------------------------------------------------------------------------

    def load(self, req: P.Load) -> None:
        from ggufdesk.engine.batching.batch import BatchEngine
        from ggufdesk.engine.batching.prompt_states import PromptStates
        from ggufdesk.engine.batching.vocab import Vocab
        from ggufdesk.engine.runtime.embed import is_embedding_model
        from ggufdesk.engine.runtime.prompt_tokens import PromptTokens
        from ggufdesk.engine.speculation.lookup import NgramCache

        spec = self._load_speculation(req)
        if spec is None:
            return
        self.unload(quiet=True)
        t0 = time.perf_counter()  # load_s: all a load waits for (projector, draft model, measurement)
        cpu = cpu_load.CpuLoad.of_this_machine()  # read over the load: by the first step (or measurement) it knows
        mmproj = _projector_for(req)
        opened = self._open_model(req, spec, mmproj)
        if opened is None:
            return
        lm, offload = opened
        self.embedding_only = is_embedding_model(lm)
        if self.embedding_only:
            spec = dataclasses.replace(spec, mode="off", draft_model=None)  # nothing to speculate on
            if not self._start_embedder(req.id, lm):
                return
        vocab = Vocab(lm)
        self.lm, self.vocab, self.speculation = lm, vocab, spec
        self.ngrams = NgramCache(spec.ngram)
        self._token_text = None
        self._decode_work = None
        self.verify_costs = self._calibration = None
        template = self.template = self._chat_template(req, lm)
        self._formats(template, vocab)
        self._prompt_tokens = PromptTokens(vocab, template.source)
        memory = dict(lm.memory)
        if mmproj and not self.embedding_only:
            self._load_projector(req.id, mmproj, lm, memory)
        if spec.mode == "draft":
            self._load_draft(req.id, spec, lm, memory)
        self.batch = BatchEngine(lm, vocab, emit=self._emit, cancelled=self.book.is_cancelled,
                                 set_batch=self.book.set_batch, flush=getattr(self.emit, "flush", None),
                                 on_plain_done=lambda st: self._calibrate(st.n_gen, st.decode_tok_s),
                                 saved=None if self.embedding_only else PromptStates.open(lm), cpu=cpu)
        for module in _REQUEST_MODULES:  # with the load, not before a fresh engine's first token
            importlib.import_module(module)
        if self.speculation.mode != "off":  # measured before Loaded, so no first request waits for it
            self._start_calibration()  # (where the machine is busy, later, while idle and quiet)
            while self._calibration is not None and self._calibrate_step():
                pass
            self._ready_drafting(lm, self.speculation.mode)
        heap.settle()  # what lives as long as the model: no full collection traverses it again
        self.emit(self._loaded_event(req, lm, template, memory, offload, time.perf_counter() - t0))

    def _load_speculation(self, req: P.Load) -> SpeculationSettings | None:
        """The load's speculation settings, with Load.draft as a draft model (None: refused, said why)."""
        spec = req.speculation  # validated when the line was decoded
        if req.draft:
            try:
                spec = dataclasses.replace(spec, mode="draft", draft_model=req.draft)
            except KnownError as e:
                self.emit(P.Error(kind="settings", id=req.id, message=str(e)))
                return None
        return spec

    def _open_model(self, req: P.Load, spec: SpeculationSettings,
                    mmproj: str | None) -> tuple[LoadedModel, Offload | None] | None:
        """Load the model file under a memory ceiling (and its RPC split); None: it failed, said why."""
        from ggufdesk.engine.runtime import memlimit
        from ggufdesk.engine.runtime.native import load_model

        settings = req.settings
        # a ceiling from the plan: runaway allocations fail, not the machine
        memlimit.apply(memlimit.limit_for(req.model, settings, spec.draft_model if spec.mode == "draft" else None,
                                          mmproj))
        self.emit(P.Loading(id=req.id, stage="model", path=req.model))
        try:
            # logits rows one decode may ask for: a verification batch [last] + K, or every sequence + a
            # prefill; beside others, the sequences' draft rows share what is left (engine/speculation/planner.py)
            offload = _rpc_offload(req.model, settings)
            lm = load_model(req.model, settings, self.llama_log,
                            n_outputs=max(spec.k_max + 1, settings.n_parallel + 1), offload=offload)
        except MemoryError:  # (the memory ceiling above turns a runaway allocation into this)
            self.emit(P.Error(kind="load", id=req.id, out_of_memory=True, message=(
                f"ran out of memory loading {os.path.basename(req.model)}; try a smaller context (--ctx) "
                "or a smaller model")))
            return None
        except KnownError as e:
            self.emit(P.Error(kind="load", id=req.id, message=str(e), out_of_memory=out_of_memory(str(e)),
                              detail="\n".join(self.llama_log.since(0)[-30:])))
            return None
        lm.aborter.flag = self.book.flag
        return lm, offload

    def _start_embedder(self, lid: str | None, lm: LoadedModel) -> bool:
        """An embedding model's embedder, made at load; one that fails unloads the model (False)."""
        from ggufdesk.engine.runtime.embed import Embedder

        try:
            self.embedder = Embedder(lm, self.llama_log)
        except KnownError as e:
            lm.close()
            self.emit(P.Error(kind="load", id=lid, message=str(e)))
            return False
        return True

    def _chat_template(self, req: P.Load, lm: LoadedModel) -> ChatTemplate:
        """The load's chat template, else the model's; one that cannot be used falls back to plain text (an Error)."""
        from ggufdesk.engine.runtime.chat import ChatTemplate

        meta = lm.metadata
        bos = _piece(lm, meta.get("tokenizer.ggml.bos_token_id"))
        eos = _piece(lm, meta.get("tokenizer.ggml.eos_token_id"))
        try:
            return ChatTemplate(req.settings.chat_template or lm.chat_template, bos=bos, eos=eos)
        except KnownError as e:
            self.emit(P.Error(kind="template", id=req.id, message=str(e)))
            return ChatTemplate(None, bos=bos, eos=eos)

    def _load_draft(self, lid: str | None, spec: SpeculationSettings, lm: LoadedModel,
                    memory: dict[str, int]) -> None:
        """The draft model; one that fails turns speculation off (an Error says why)."""
        self.emit(P.Loading(id=lid, stage="draft", path=str(spec.draft_model)))
        try:
            from ggufdesk.engine.speculation.draft_model import DraftModel

            self.draft = DraftModel.load(spec, target=lm, llama_log=self.llama_log)
            memory["draft"] = self.draft.memory_bytes
        except KnownError as e:
            self.emit(P.Error(kind="draft", id=lid, message=str(e)))
            self.speculation = dataclasses.replace(spec, mode="off", draft_model=None)

    def _loaded_event(self, req: P.Load, lm: LoadedModel, template: ChatTemplate, memory: dict[str, int],
                      offload: Offload | None, load_s: float) -> P.Loaded:
        settings = req.settings
        return P.Loaded(
            id=req.id, model=req.model, arch=lm.arch, n_ctx=lm.n_ctx, n_ctx_train=lm.model.n_ctx_train(),
            n_vocab=lm.n_vocab, n_layer=lm.n_layer, n_gpu_layers=settings.n_gpu_layers,
            chat_format="completion" if template.builtin else "template", memory=memory,
            load_s=round(load_s, 3), reasoning=self.reasoning.name if self.reasoning else None,
            tool_format=_need(self.tool_format).name, draft=self.draft.path if self.draft else None,
            settings=P.fields_of(settings), rpc=offload.plan if offload else {}, n_embd=lm.n_embd,
            embedding_only=self.embedding_only, mmproj=self.projector.path if self.projector else None,
            image_tokens=self.projector.native_tokens() if self.projector else 0,
        )

    def _load_projector(self, lid: str | None, mmproj: str, lm: LoadedModel, memory: dict[str, int]) -> None:
        """A vision model's projector; one that fails leaves the model reading text (a notice)."""
        from ggufdesk.engine.runtime.vision import Projector

        self.emit(P.Loading(id=lid, stage="projector", path=mmproj))
        try:
            self.projector = Projector(mmproj, lm, self.llama_log)
        except KnownError as e:
            self.emit(P.Error(kind="projector", id=lid, message=f"{e}; the model reads text only"))
            return
        memory["projector"] = self.projector.memory_bytes

    def _formats(self, template: ChatTemplate, vocab: Vocab) -> None:
        """The template's reasoning and tool-call formats; their special tokens are shown as text."""
        from ggufdesk.core import reasoning, tools

        source = None if template.builtin else template.source
        self.reasoning = reasoning.detect(source)
        self.tool_format = tools.detect_format(source)
        markers = self.tool_format.tokens + (self.reasoning.tokens if self.reasoning else ())
        shown = vocab.show_as_text(markers)
        if shown:
            log.info("shown as text: %s", " ".join(shown))

    def _reasoning(self, req: P.Generate, sampling: SamplingSettings, prompt_text: str) -> ReasoningControl | None:
        """The request's ReasoningControl (engine/structured/reasoning.py), None for a model that does not reason."""
        from ggufdesk.core.reasoning import starts_inside, template_switches
        from ggufdesk.engine.structured.reasoning import ReasoningControl

        if self.reasoning is None or req.messages is None:
            return None
        budget = req.reasoning_budget if req.reasoning_budget is not None else sampling.reasoning_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
            raise KnownError(f"reasoning_budget must be a whole number of tokens (-1: no limit), got {budget!r}")
        _, honoured = template_switches(_need(self.template).source, _think(req, sampling))
        if not honoured:
            budget = 0  # the template has no off switch: end the reasoning at once
        close = _need(self.vocab).tokenize(self.reasoning.force_close, add_bos=False)
        return ReasoningControl(self.reasoning, inside=starts_inside(self.reasoning, prompt_text),
                                budget=None if budget in (None, -1) else budget, close_tokens=close)

    def unload(self, quiet: bool = False) -> None:
        if self.batch is not None:
            self.batch.cancel_all()
            if self.batch.saved is not None:
                self.batch.saved.close()  # the disk saves still pending land before the model goes
            self.batch = None
        if self.draft is not None:
            self.draft.close()
            self.draft = None
        self.verify_costs = self._calibration = None
        while self._embeds:
            job = self._embeds.popleft()
            self._emit(P.Error(kind="generate", id=job.req.id, message="the model was unloaded"))
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        if self.projector is not None:
            self.projector.close()
            self.projector = None
        self.embedding_only = False
        self._eog = None
        if self.lm is not None:
            self.vocab = self._prompt_tokens = None
            self.ngrams = self._token_text = None
            self._lookup_prompts.clear()
            self.lm.close()
            self.lm = None
            heap.release()
        if not quiet:
            self.emit(P.Unloaded())

    # ---- generate -------------------------------------------------------------------------------

    def _emit(self, event: P.Event) -> None:
        self.emit(event)
        if isinstance(event, (P.Done, P.Error, P.Embeddings, P.Tokenized)) and event.id is not None:
            self.book.finish(event.id)
            prompt = self._lookup_prompts.pop(event.id, None)
            if prompt is not None and isinstance(event, P.Done) and self.ngrams is not None:
                self.ngrams.feed(prompt + list(event.tokens or []))  # after Done: later turns draft from it

    def generate(self, req: P.Generate) -> None:
        """Check and queue a request; the step loop (next_request) runs it beside the others."""
        t_start = time.perf_counter()
        if self.book.is_cancelled(req.id):
            self._emit(P.Done(id=req.id, finish_reason="cancelled"))
            return
        try:
            self._queue(req, t_start)
        except (KnownError, TypeError) as e:
            self._emit(P.Error(kind=P.error_kind(e), id=req.id, message=str(e)))

    def _queue(self, req: P.Generate, t_start: float) -> None:
        """Fit the request's prompt and submit it to the step loop; KnownError (or TypeError) refuses it."""
        if self.vocab is None or self.batch is None:
            raise KnownError("no model is loaded")
        lm, vocab = _need(self.lm), self.vocab
        self._check_generate(req, lm)
        spec = self._request_speculation(req, lm)
        structured = self._structured(req, req.sampling)
        sampling, use = self._overflow_policy(req.sampling)
        fitted, stops = self._prompt(req, sampling, structured)
        use.n_keep, use.truncated, use.applied = fitted.n_keep, fitted.truncated_tokens, fitted.applied
        use.dropped_messages = fitted.dropped_messages
        use.cells = lm.n_ctx if use.shifting else 0
        if stops:
            sampling = dataclasses.replace(sampling, stop=sampling.stop + stops)
        constraint = structured.constraint(lm.vocab, lm.n_vocab, piece=vocab.piece,
                                           tokenize=lambda t: vocab.tokenize(t, add_bos=False))
        thinking = self._reasoning(req, sampling, self._prompt_text)
        try:  # from here on the grammar's C sampler is ours to free if the request never runs
            self._submit(req, fitted.tokens, sampling=sampling, spec=spec, use=use, structured=structured,
                         constraint=constraint, thinking=thinking, t_start=t_start)
        except (KnownError, TypeError):
            if constraint is not None:
                constraint.close()
            raise

    def _check_generate(self, req: P.Generate, lm: LoadedModel) -> None:
        """Refuse what this model cannot do and the request's nonsense numbers (KnownError)."""
        if self.embedding_only:
            from ggufdesk.engine.runtime.tokens import refusal

            raise refusal(f"{os.path.basename(lm.path)} is an embedding model: it computes "
                          "embeddings and cannot generate text", "settings")
        if isinstance(req.logprobs, bool) or not isinstance(req.logprobs, int) or not 0 <= req.logprobs <= 100:
            raise KnownError(f"logprobs must be a whole number from 0 to 100, got {req.logprobs!r}")
        limit = req.deadline_s
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0):
            raise KnownError(f"deadline_s must be a positive number of seconds, got {limit!r}")

    def _request_speculation(self, req: P.Generate, lm: LoadedModel) -> SpeculationSettings:
        """The load's speculation with the request's changes, K capped at the logits rows reserved at load."""
        spec = self.speculation if req.speculation is None else dataclasses.replace(
            self.speculation, **req.speculation)
        cap = lm.n_outputs - 1  # logits rows reserved at load: [last] + K max
        if spec.k_max > cap:
            spec = dataclasses.replace(spec, k_max=cap, k_min=min(spec.k_min, cap))
        return spec

    def _submit(self, req: P.Generate, prompt: list[int], *, sampling: SamplingSettings,
                spec: SpeculationSettings, use: ContextUse, structured: Structured,
                constraint: GrammarConstraint | None, thinking: ReasoningControl | None, t_start: float) -> None:
        """The fitted request as a Sequence, with its drafter, handed to the step loop."""
        from ggufdesk.engine.batching.media import text_only
        from ggufdesk.engine.batching.sequence import RunStats, Sequence

        batch, n_ctx = _need(self.batch), _need(self.lm).n_ctx
        media, self._media = self._media, None
        text = text_only(prompt) if media is not None else prompt  # (what reads token ids)
        # (a grammar takes speculation as it is: verification samples row by row under it, each sample
        # advances it as plain decoding's would, and a rejected draft token never reaches it; a reasoning
        # budget bounds the drafts, DraftPlanner._room)
        drafter = self._drafter(spec, text, sampling.max_tokens)
        if spec.lookup_history and self.ngrams is not None:
            self._lookup_prompts[req.id] = text
        room = sampling.max_tokens if use.shifting else n_ctx - len(prompt)  # shift: no edge
        limit = req.deadline_s
        seq = Sequence(rid=req.id, prompt=prompt, sampling=sampling, logprobs=req.logprobs,
                       drafter=drafter, max_gen=min(sampling.max_tokens, room),
                       stats=RunStats(n_prompt=len(prompt), t_start=t_start),
                       constraint=constraint, structured=structured, reasoning=thinking, limit_s=limit,
                       deadline=None if limit is None else batch.clock() + limit,
                       chat=req.messages is not None, media=media, bias=self._bias(req), ctx=use,
                       reuse=req.cache_prompt, watched=req.stream)
        batch.submit(seq)
        if use.truncated or use.note:
            self._emit(batch.overflow_event(seq))

    # ---- embeddings ------------------------------------------------------------------------------

    def embed(self, req: P.Embed) -> None:
        """Check and queue an Embed request; the main loop computes one input per turn, between steps."""
        if self.book.is_cancelled(req.id):
            self._emit(P.Done(id=req.id, finish_reason="cancelled"))
            return
        try:
            if self.lm is None:
                raise KnownError("no model is loaded")
            from ggufdesk.engine.runtime.embed import Embedder, check_inputs

            check_inputs(req.inputs)
            if self.embedder is None:
                self.embedder = Embedder(self.lm, self.llama_log)
        except KnownError as e:
            self._emit(P.Error(kind=P.error_kind(e), id=req.id, message=str(e)))
            return
        self._embeds.append(EmbedJob(req))

    def _embed_step(self) -> None:
        """Compute the next input of the oldest Embed request (cancellable mid-decode)."""
        from ggufdesk.engine.runtime.embed import EmbedCancelled

        job = self._embeds[0]
        rid = job.req.id
        embedder, lm = _need(self.embedder), _need(self.lm)
        if self.book.is_cancelled(rid):
            self._embeds.popleft()
            self._emit(P.Done(id=rid, finish_reason="cancelled"))
            return
        self.book.set_batch([rid])
        try:
            v = embedder.embed(job.req.inputs[len(job.vectors)], truncate=job.req.truncate, aborter=lm.aborter)
        except EmbedCancelled:
            self._embeds.popleft()
            self._emit(P.Done(id=rid, finish_reason="cancelled"))
            return
        except KnownError as e:
            self._embeds.popleft()
            self._emit(P.Error(kind=P.error_kind(e), id=rid, message=str(e)))
            return
        finally:
            self.book.set_batch([])
        job.vectors.append(v.values)
        job.n_tokens.append(v.n_tokens)
        job.truncated.append(v.truncated)
        job.n_decode += v.n_decode
        if len(job.vectors) == len(job.req.inputs):
            self._embeds.popleft()
            self._emit(P.Embeddings(id=rid, vectors=job.vectors, n_tokens=job.n_tokens, truncated=job.truncated,
                                    pooling=embedder.pooling_name, model=lm.path,
                                    n_decode=job.n_decode))

    # ---- the main loop --------------------------------------------------------------------------

    def _bias(self, req: P.Generate) -> tuple[Any, Any] | None:
        """Generate.logit_bias and ignore_eos as (ids, values) arrays for the sampler, or None."""
        from ggufdesk.engine.runtime.tokens import logit_bias, text_bias

        if not req.logit_bias and not req.logit_bias_text and not req.ignore_eos:
            return None
        lm = _need(self.lm)
        eog = self._eog
        if req.ignore_eos and eog is None:
            vocab = _need(self.vocab)
            eog = self._eog = [t for t in range(lm.n_vocab) if vocab.is_eog(t)]
        pairs = [*(req.logit_bias or {}).items(), *text_bias(lm, req.logit_bias_text or [])]
        return logit_bias(pairs, eog if eog is not None and req.ignore_eos else [], lm.n_vocab)

    def next_request(self, inbox: queue.Queue[P.Message]) -> P.Message:
        """Run engine steps (and embedding inputs) until a request arrives (requests are read between
        steps); block when idle."""
        while (self.batch is not None and self.batch.busy) or self._embeds:
            try:
                return inbox.get_nowait()
            except queue.Empty:
                pass
            self._work_once()
        if self.batch is not None:
            self.batch.idle()
        while self._calibration is not None:  # one timed call at a time, so a request waits for one at most
            try:
                # while another program takes a CPU the measurement waits (reading the sensor between)
                return inbox.get_nowait() if self._calibrate_step() else inbox.get(timeout=IDLE_SENSE_S)
            except queue.Empty:
                pass
        threads = None if self.batch is None else self.batch.threads
        while threads is not None and threads.sensing:  # the CPU-load sensor reads on while we wait
            try:
                return inbox.get(timeout=IDLE_SENSE_S)
            except queue.Empty:
                threads.idle()
        return inbox.get()

    def _work_once(self) -> None:
        """One engine step and one embedding input, each if there is work for it."""
        if self.batch is not None and self.batch.busy:
            try:
                with getattr(self.emit, "held", contextlib.nullcontext)():
                    self.batch.step()
            except Exception as e:  # noqa: BLE001 - a bug of ours ends the requests, not the engine
                self.batch.fail_all(f"internal error: {e or type(e).__name__}", traceback.format_exc())
        if self._embeds:
            try:
                self._embed_step()
            except Exception as e:  # noqa: BLE001 - a bug of ours ends the request, not the engine
                job = self._embeds.popleft()
                self._emit(P.Error(kind="bug", id=job.req.id, message=f"internal error: {e or type(e).__name__}",
                                   detail=traceback.format_exc()))

    def _start_calibration(self) -> None:
        from ggufdesk.engine.speculation import verify_cost

        if self.lm is not None and self.verify_costs is None and self._calibration is None:
            known = verify_cost.stored(self.lm, self.speculation.k_max)  # measured by an earlier load
            if known is not None and self.batch is not None:
                self.verify_costs = known
                self.batch.set_verify_costs(known)
                return
            quiet = None if self.batch is None else self.batch.threads.quiet
            self._calibration = verify_cost.Calibration(self.lm, self.speculation.k_max, quiet)

    def _calibrate_step(self) -> bool:
        """One call of the measurement; False where it waits for the machine to be quiet."""
        cal = self._calibration
        if self.batch is None or cal is None:
            self._calibration = None
            return True
        lm = _need(self.lm)
        busy = cal.busy
        if not cal.ready():  # (checked first: a wait must not drop the cached prefixes)
            if cal.busy == 1 and busy == 0:
                log.info("another program keeps a CPU busy: the verification cost is measured later, while "
                         "quiet (until then drafts are priced by a prior)")
            return False
        if self.batch.slots.used:  # a request came first and left its prefix cached: measure on an empty cache
            self.batch.slots.evict(lm.n_ctx)
        try:
            with self.batch.threads.at_full():  # the counts the table is kept under, not the tuner's now
                if not cal.step():
                    return False
        except Exception as e:  # noqa: BLE001 - a failed measurement leaves speculation on its prior
            log.warning("could not measure the verification cost: %s", e)
            self._calibration = None
            return True
        if cal.done:
            self.verify_costs, self._calibration = cal.costs, None
            self.batch.set_verify_costs(cal.costs)
            if cal.costs:
                from ggufdesk.engine.speculation.verify_cost import store

                store(lm, self.speculation.k_max, cal.costs)
                log.info("verification cost in plain steps: %s",
                         ", ".join(f"k={k}: {c:.2f}" for k, c in cal.costs.items()))
        return True

    def _structured(self, req: P.Generate, sampling: SamplingSettings) -> Structured:
        """The request's schema/grammar/tools resolved (engine/structured/request.py); SchemaError if unsupported.
        Without any, a conversation's `sampling.structured` setting applies (the window's)."""
        from ggufdesk.core.tools import request_fields
        from ggufdesk.engine.structured import request as structured

        try:
            fields: dict[str, Any] = {"json_schema": req.json_schema, "grammar": req.grammar,
                                      "tools": req.tools, "tool_choice": req.tool_choice}
            if not any(v is not None for v in fields.values()) and sampling.structured:
                fields.update(request_fields(sampling.structured, sampling.tool_choice))
            return structured.plan(**fields, parallel_tool_calls=req.parallel_tool_calls,
                                   tools_without_grammar=req.tools_without_grammar,
                                   template_source=_need(self.template).source,
                                   chat=req.messages is not None, reasoning=self.reasoning is not None)
        except KnownError as e:
            raise P.EngineRequestError("schema", str(e)) from e

    def _overflow_policy(self, sampling: SamplingSettings) -> tuple[SamplingSettings, ContextUse]:
        """The request's overflow policy as this model can follow it (engine/batching/shift.py)."""
        from ggufdesk.engine.batching.shift import NO_SHIFT_NOTE, ContextUse

        if sampling.context_overflow == "shift" and not _need(self.batch).mem.can_shift():
            return dataclasses.replace(sampling, context_overflow="rolling"), ContextUse(
                policy="rolling", note=NO_SHIFT_NOTE)
        return sampling, ContextUse(policy=_policy(sampling.context_overflow))

    def _prompt(self, req: P.Generate, sampling: SamplingSettings,
                structured: Structured | None = None) -> tuple[Fitted, list[str]]:
        """The prompt's tokens fitted to the context under the request's overflow policy
        (engine/runtime/overflow.py), and the template's stop strings."""
        from ggufdesk.engine.batching.batch import context_error
        from ggufdesk.engine.runtime import overflow

        lm, vocab, template = _need(self.lm), _need(self.vocab), _need(self.template)
        n_ctx, policy = lm.n_ctx, _policy(sampling.context_overflow)
        budget = overflow.budget_for(n_ctx, sampling.max_tokens)
        bos = lm.bos_id
        self._media = None
        if req.messages is not None:
            msgs, pics = self._images(req)
            msgs, tools, switches = self._template_inputs(msgs, structured, _think(req, sampling))

            last: list[Messages] = []  # the messages rendered last: their text and images are the state

            def render(m: Messages) -> list[int]:
                last[:] = [m]
                if pics:
                    return self._media_tokens(m, pics, tools, switches)
                return self._chat_tokens(m, tools, switches)

            fitted = overflow.fit_chat(
                msgs, policy, render=render, budget=budget, too_long=context_error,
                tokenize=lambda t: vocab.tokenize(t, add_bos=False), detokenize=self._detokenize, bos_id=bos,
                known=self._cached_sequences, n_ctx=n_ctx)
            # the prompt that runs, rendered last: the reasoning reads its text, a vision model its images
            # (already so when it was the last one fit_chat rendered: a prompt that fits, the usual case)
            assert fitted.messages is not None  # fit_chat says which messages it rendered
            if not last or last[0] is not fitted.messages:
                render(fitted.messages)
            return fitted, list(template.stops)
        if req.prompt_tokens is not None:
            from ggufdesk.engine.runtime.tokens import check_ids

            tokens = check_ids(vocab, req.prompt_tokens)
        elif req.prompt is None:
            raise KnownError("a generate request needs a prompt or messages")
        else:
            tokens = vocab.tokenize(req.prompt)
        return overflow.fit_text(tokens, policy, n_ctx=n_ctx, budget=budget, bos_id=bos, too_long=context_error,
                                 known=self._cached_sequences), []

    def _cached_sequences(self) -> list[list[int]]:
        """What the KV caches hold, memory and disk (rolling keeps cutting where they already do)."""
        batch = _need(self.batch)
        held = [list(s.reusable) for s in batch.slots.slots if s.tokens]
        if batch.saved is not None:
            held += batch.saved.held()
        return held

    def _detokenize(self, tokens: list[int]) -> str:
        vocab = _need(self.vocab)
        return b"".join(vocab.piece(t) for t in tokens).decode("utf-8", "replace")

    def _chat_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     switches: dict[str, Any] | None = None) -> list[int]:
        text = self._chat_text(messages, tools, switches)
        return self._text_tokens(text)

    def _text_tokens(self, text: str) -> list[int]:
        """A rendered chat prompt's tokens (a BOS only when the template did not write one)."""
        bos = llama_bos_text(_need(self.lm))
        return _need(self._prompt_tokens).tokenize(text, add_bos=not (bos and text.startswith(bos)))

    # ---- tokenize ---------------------------------------------------------------------------------

    def tokenize(self, req: P.Tokenize) -> None:
        """Answer a Tokenize at once (between steps): text -> tokens, messages -> the prompt's tokens
        as a generation renders it, tokens -> text."""
        from ggufdesk.engine.runtime.tokens import detokenize, pieces, tokenize

        try:
            if self.vocab is None or self.lm is None:
                raise KnownError("no model is loaded")
            if req.tokens is not None:
                out = P.Tokenized(id=req.id, tokens=list(req.tokens), text=detokenize(self.vocab, req.tokens))
            elif req.messages is not None:
                text = self._render(req)
                out = P.Tokenized(id=req.id, tokens=self._text_tokens(text), text=text)
            elif req.text is not None:
                out = P.Tokenized(id=req.id, text=req.text, tokens=tokenize(
                    self.lm, req.text, add_special=req.add_special, parse_special=req.parse_special))
            else:
                raise KnownError("tokenize needs a text, messages or tokens")
            if req.with_pieces:
                out.pieces = pieces(self.vocab, out.tokens)
        except (KnownError, TypeError) as e:
            self._emit(P.Error(kind=P.error_kind(e, "settings"), id=req.id, message=str(e)))
            return
        self._emit(out)

    def _render(self, req: P.Tokenize) -> str:
        """The chat prompt a Generate with these messages, tools and think setting would be given
        (before fitting): the same inputs (_template_inputs) through the same template."""
        from ggufdesk.engine.runtime.image_parts import without_keys

        as_generate = P.Generate(id=req.id, messages=req.messages, tools=req.tools, tool_choice=req.tool_choice,
                                 think=req.think)
        structured = self._structured(as_generate, SamplingSettings())
        msgs, tools, switches = self._template_inputs(req.messages or [], structured, req.think)
        extra = {} if req.add_generation_prompt else {"add_generation_prompt": False}
        return _need(self.template).render(without_keys(msgs), tools=tools, **switches, **extra)

    def _template_inputs(self, messages: Messages, structured: Structured | None,
                         think: bool | str | None) -> tuple[Messages, list[dict[str, Any]] | None, dict[str, Any]]:
        """What a chat prompt is rendered from: the messages as the template gets them (tools explained
        where the template cannot, earlier reasoning dropped), the tools a template renders itself, and
        the template variables for `think` (core/reasoning.py)."""
        from ggufdesk.core.reasoning import strip_reasoning, template_switches
        from ggufdesk.engine.structured.request import prepare_messages

        tools = structured.tools if structured is not None and structured.fmt is not None \
            and structured.fmt.native else None
        msgs = prepare_messages(messages, structured) if structured is not None else messages
        switches, _ = template_switches(_need(self.template).source, think)
        return strip_reasoning(msgs, self.reasoning), tools, switches

    def _chat_text(self, messages: Messages, tools: list[dict[str, Any]] | None = None,
                   switches: dict[str, Any] | None = None) -> str:
        from ggufdesk.engine.runtime.image_parts import without_keys

        text = _need(self.template).render(without_keys(messages), tools=tools, **(switches or {}))
        self._prompt_text = text
        return text

    # ---- images (a vision model: engine/runtime/vision.py) ----------------------------------------

    def _images(self, req: P.Generate) -> tuple[Messages, dict[str, Pixels]]:
        """The request's messages with each image as the projector's marker, and its decoded images."""
        from ggufdesk.engine.runtime.image_parts import decode_images, flatten, has_images, vision_refusal

        if not has_images(req.messages):
            return req.messages or [], {}
        if self.projector is None:
            raise vision_refusal(f"{os.path.basename(_need(self.lm).path)} reads text only: it was loaded without a "
                                 "vision projector (mmproj), so it cannot see images")
        self.projector.check_usable()
        msgs, keys = flatten(req.messages or [], self.projector.marker)
        return msgs, decode_images(keys, req.images)

    def _media_tokens(self, messages: Messages, pics: dict[str, Pixels], tools: list[dict[str, Any]] | None,
                      switches: dict[str, Any] | None) -> list[int]:
        from ggufdesk.engine.runtime.image_parts import images_of, vision_refusal

        proj = _need(self.projector, "the model reads no images")
        text = self._chat_text(messages, tools, switches)
        keys = images_of(messages)
        if text.count(proj.marker) != len(keys):
            raise vision_refusal(f"the model's chat template kept {text.count(proj.marker)} of the "
                                 f"{len(keys)} images in the conversation; it cannot show them to the model")
        bos = llama_bos_text(_need(self.lm))
        self._media = proj.tokenize(text, [pics[k] for k in keys], add_special=not (bos and text.startswith(bos)))
        return self._media.tokens

    def _calibrate(self, n_gen: int, tok_s: float) -> None:
        """Feed a plain run's real decode speed back to the planner (hardware.record_decode_run),
        so later predictions on this machine use its effective bandwidth."""
        lm = _need(self.lm)
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

            if self._decode_work is None:
                info = gguf_meta.read_gguf(lm.path)
                self._decode_work = planner.weight_bytes_per_token(info), planner.matmuls_per_token(info)
            nbytes, matmuls = self._decode_work
            hardware.record_decode_run(where=where, bytes_per_token=nbytes, tok_s=tok_s, n_layer=lm.n_layer,
                                       matmuls=matmuls)
        except (KnownError, OSError, ValueError) as e:
            log.warning("could not record the decode speed: %s", e)

    def _ready_drafting(self, lm: LoadedModel, mode: str) -> None:
        """What a drafter of `mode` needs, made once per loaded model: before Loaded when the load turns
        speculation on, else by the first request that does. Its modules (imports: ~5 ms on this 2-core
        machine with a bytecode cache, 12-20 ms without one, as this project's test machine runs with
        PYTHONDONTWRITEBYTECODE) and lookup's vocabulary readers would otherwise run on the first
        request's way to its first token (issue 29: a one-shot `run --lookup` measured 1.12x plain's
        time to first token with them there)."""
        from ggufdesk.engine.speculation import speculative

        if mode == "lookup" and self._token_text is None:
            self._token_text = speculative.TokenText.of(lm)

    def _drafter(self, spec: SpeculationSettings, prompt: list[int], max_tokens: int) -> Drafter | None:
        if spec.mode == "off":
            return None
        from ggufdesk.engine.speculation import speculative

        lm = _need(self.lm)
        self._start_calibration()  # (no-op once measured) a request turned speculation on
        self._ready_drafting(lm, spec.mode)
        return speculative.make_drafter(spec, prompt=prompt, draft=self.draft, target=lm,
                                       max_tokens=max_tokens, costs=self.verify_costs,
                                       ngrams=self.ngrams if spec.lookup_history else None,
                                       text=self._token_text)


# What every chat request imports (tools and response formats, reasoning, images asked about, a prompt
# fitted to the context): ~15 ms on this 2-core machine, which runs without a bytecode cache.
_REQUEST_MODULES = ("ggufdesk.engine.structured.request", "ggufdesk.engine.structured.reasoning",
                    "ggufdesk.engine.runtime.image_parts", "ggufdesk.engine.runtime.overflow")


def _is_policy(name: str) -> TypeGuard[P.OverflowPolicy]:
    return name in get_args(P.OverflowPolicy)


def _policy(name: str) -> P.OverflowPolicy:
    """A context_overflow setting (SamplingSettings checked it) as the policy it names."""
    if not _is_policy(name):
        raise KnownError(f"unknown context overflow policy {name!r}")
    return name


def _need(part: T | None, missing: str = "no model is loaded") -> T:
    """A part of the loaded model that the caller's path has already checked is there (KnownError if not)."""
    if part is None:
        raise KnownError(missing)
    return part


_OOM = re.compile(r"out of (device )?memory|failed to allocate|alloc_buffer|cudaMalloc|"
                  r"ErrorOutOfDeviceMemory|not enough memory", re.I)


def out_of_memory(reason: str) -> bool:
    """Does llama.cpp's reason for a failure say that memory ran out? (Read once, here, where
    llama.cpp's words are known; the receivers branch on Error.out_of_memory.)"""
    return bool(_OOM.search(reason))


def _think(req: P.Generate, sampling: SamplingSettings) -> bool | str | None:
    """The request's `think`, else the conversation's setting."""
    from ggufdesk.core.settings import think_value

    return req.think if req.think is not None else think_value(sampling.think)


def _projector_for(req: P.Load) -> str | None:
    """The projector to load: the request's, or (None) the one beside the model file; "" means none."""
    if req.mmproj is not None:
        return req.mmproj or None
    from ggufdesk.core.projector import projector_beside

    found = projector_beside(req.model)
    return str(found) if found is not None else None


def _rpc_offload(model: str, settings: LoadSettings) -> Offload | None:
    """With RPC workers: check them, split the model, register their devices (engine/runtime/rpc.py)."""
    if not settings.rpc:
        return None
    from ggufdesk.engine.runtime.rpc import prepare_offload

    return prepare_offload(model, settings)


def _piece(lm: LoadedModel, token_id: str | None) -> str:
    if not token_id:
        return ""
    try:
        return lm.token_text(int(token_id)).decode("utf-8", "replace")
    except (ValueError, TypeError):
        return ""


def llama_bos_text(lm: LoadedModel) -> str:
    return _piece(lm, str(lm.bos_id))


_LINE_ID = re.compile(r'\{"type": "[a-z]+", "id": "([^"\\]{1,200})"')


def _read_requests(stdin: TextIO, inbox: queue.Queue[P.Message], book: CancelBook, emit: Emitter) -> None:
    """The reader thread: Cancel and Ping are answered here, at once, even while the main thread is
    busy in a decode; everything else queues for the main loop. EOF means the client is gone."""
    for line in stdin:
        if not line.strip():
            continue
        try:
            msg = P.decode(line)
        except P.ProtocolError as e:  # answered under the request's id when one can be read, so it does not wait
            m = _LINE_ID.match(line)
            emit(P.Error(kind="protocol", id=m.group(1) if m else None, message=str(e)))
            continue
        if isinstance(msg, P.Ping):
            emit(P.Pong(id=msg.id))
            continue
        if isinstance(msg, P.Cancel):
            book.cancel(msg.id)
        inbox.put(msg)
    book.cancel_current()  # stop a running generation so that the Shutdown below is seen
    inbox.put(P.Shutdown())
    lifeline.exit_soon()


def main() -> int:
    lifeline.guard()
    events_fd = os.dup(1)
    os.dup2(2, 1)  # C code printing to stdout now lands on stderr
    out = os.fdopen(events_fd, "w", encoding="utf-8", buffering=1 << 16)  # Emitter flushes
    sys.stdout = sys.stderr
    engine_log.configure()  # our log lines reach the client's log (engine/link/engine_log.py)
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    emit = Emitter(out)
    book = CancelBook()
    inbox: queue.Queue[P.Message] = queue.Queue()
    try:
        import llama_cpp

        from ggufdesk.engine.runtime.devices import ggml_devices

        engine = Engine(emit, book)
        emit(P.Ready(pid=os.getpid(), llama_cpp_version=llama_cpp.__version__,
                     system_info=llama_cpp.llama_print_system_info().decode(errors="replace"),
                     devices=ggml_devices()))
    except Exception as e:  # noqa: BLE001 - the parent must hear why we cannot start
        emit(P.Error(kind="bug", message=f"the engine could not start: {e}", detail=traceback.format_exc()))
        return 1
    threading.Thread(target=_read_requests, args=(stdin, inbox, book, emit), daemon=True,
                     name="engine-requests").start()
    while True:
        msg = engine.next_request(inbox)
        try:
            if isinstance(msg, P.Shutdown):
                engine.unload(quiet=True)
                return 0
            if isinstance(msg, P.Load):
                engine.load(msg)
            elif isinstance(msg, P.Generate):
                engine.generate(msg)
            elif isinstance(msg, P.Embed):
                engine.embed(msg)
            elif isinstance(msg, P.Tokenize):
                engine.tokenize(msg)
            elif isinstance(msg, P.Unload):
                engine.unload(quiet=True)
                emit(P.Unloaded(id=msg.id))
            elif isinstance(msg, P.Cancel):
                pass  # handled on the reader thread
            else:
                emit(P.Error(kind="protocol", message=f"not a request: {msg.TYPE}"))
        except Exception as e:  # noqa: BLE001 - a bug of ours must not kill the engine
            emit(P.Error(kind="bug", id=getattr(msg, "id", None), message=f"internal error: {e or type(e).__name__}",
                         detail=traceback.format_exc()))


def run() -> None:
    """Exit without interpreter finalization: the request reader is a daemon thread blocked on
    stdin, and finalizing while it holds stdin's lock aborts the process (so would llama.cpp's
    static destructors racing its threads)."""
    code = main()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
