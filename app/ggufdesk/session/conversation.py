"""One open conversation and its answer lifecycle: send, stream, stop, crash, edit, regenerate.

The session is driven from one thread (the GUI thread, or the terminal chat's loop): calls and
engine events come in there, and everything the history writer reports is handed back to that
thread through `post`. It never waits for the engine or the database.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, Sequence

from ggufdesk.core import images as img
from ggufdesk.core.errors import KnownError
from ggufdesk.core.history import Conversation, History, Message
from ggufdesk.core.image_store import images_of
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.session.docs import Attached
from ggufdesk.session.guard import repeat_cut
from ggufdesk.session.prompt import ImageSource, build_request, context_note, title_from
from ggufdesk.session.tool_loop import ToolCall, ToolLoop
from ggufdesk.session.tool_turns import ToolTurns
from ggufdesk.session.turns import Ref, Turn
from ggufdesk.session.writer import HistoryWriter, SaveState

log = logging.getLogger("ggufdesk.session")

SAVE_PARTIAL_EVERY_S = 1.0
BASE_MODEL_TURN_END = "\n\n"  # a base model's chat answer ends at a blank line
THINKING = ("reasoning", "reasoning_tokens", "reasoning_s")  # an answer's stats about its thinking
Phase = Literal["idle", "saving", "streaming", "stopping", "tool"]  # tool: calls being decided or run
Level = Literal["info", "warning", "error"]
KEPT_STATS = ("model", "context_note", "citations", "sources_left_out")  # what the engine's stats do not replace


class Refused(KnownError):
    """The action cannot be done now; the message says why (shown as it is)."""


class Engine(Protocol):
    """What the session needs of the engine: EngineClient and the GUI's EngineBridge both fit."""

    def generate(self, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                 sampling: SamplingSettings | None = None, **extra: Any) -> str: ...

    def cancel(self, rid: str) -> None: ...


class SessionView:
    """What a front end is told. Every method has a do-nothing default; override what you show."""

    def show_conversation(self, conv: Conversation | None, turns: list[Turn]) -> None:
        """A whole new picture: another conversation, or turns were removed (edit, regenerate)."""

    def turn_added(self, turn: Turn) -> None: ...

    def turn_grew(self, turn: Turn, piece: str) -> None: ...

    def turn_thought(self, turn: Turn, piece: str) -> None:
        """A reasoning model's thinking grew (turn.reasoning; its tokens and time in turn.stats)."""

    def turn_changed(self, turn: Turn) -> None:
        """A turn's text was replaced (an answer's tool call taken out of it when it ended)."""

    def tool_call_changed(self, call: ToolCall) -> None:
        """A tool call appeared or moved on: pending, asking (show Allow once / Always / Deny and
        call ChatSession.decide), running, done, error, denied or stopped."""

    def turn_finished(self, turn: Turn) -> None:
        """An answer ended; turn.status is done | cancelled | partial | error."""

    def context_noted(self, turn: Turn) -> None:
        """The overflow policy dropped part of the conversation for this answer: turn.stats["context_note"]
        says what, in a quiet line ("3 earlier turns no longer fit the 4,096-token context")."""
        self.notice(str(turn.stats.get("context_note", "")))

    def phase_changed(self, phase: Phase) -> None: ...

    def save_state_changed(self, state: SaveState) -> None: ...

    def conversation_saved(self, conv: Conversation) -> None:
        """A conversation's row was written (created, renamed, its settings changed)."""

    def model_changed(self, model: P.Loaded | None) -> None: ...

    def base_model_loaded(self, model: P.Loaded) -> None:
        """A model without a chat template (a base model) was loaded; the window says so once."""
        self.notice(f"{Path(model.model).name} has no chat template: new conversations use "
                    "completion mode (the model continues your text)")

    def notice(self, text: str, level: Level = "info") -> None: ...


def _store_image(data: bytes) -> Callable[[History], str]:
    """A write that puts an image into the history's store."""
    return lambda h: h.images.put(data)


def _now(fn: Callable[[], None]) -> None:
    fn()


class ChatSession(ToolTurns):
    """The open conversation, its turns (the truth the view shows, saved or not), and the answer
    being written. `on_event` takes every engine event; `post` runs a callable on the session's
    thread (the GUI passes its run_on_main; single-threaded callers keep the default).
    Without a writer nothing is saved (terminal chat, server). With `tools` the conversation's
    MCP tools are offered and run (session/tool_turns.py)."""

    def __init__(self, *, engine: Engine, writer: HistoryWriter | None = None,
                 view: SessionView | None = None, post: Callable[[Callable[[], None]], None] = _now,
                 save_every: float = SAVE_PARTIAL_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 tools: ToolLoop | None = None, images: ImageSource | None = None) -> None:
        self.engine = engine
        self.writer = writer
        # the messages' images by sha256: those sent here, and the history's (`images`: its store's get)
        self.image_source = images
        self._image_bytes: dict[str, bytes] = {}
        self.view = view or SessionView()
        self.post = post
        self.save_every = save_every
        self.clock = clock
        self.conv: Conversation | None = None
        self.conv_row = Ref()
        self.turns: list[Turn] = []
        self.phase: Phase = "idle"
        self.answer: Turn | None = None
        self.rid: str | None = None
        self.editing: Turn | None = None
        self.model: P.Loaded | None = None
        self.no_model_reason = ""
        self._saved_at = 0.0
        self._loop_cut: int | None = None  # a base model's answer repeats itself: it ends here
        self._think_t0: float | None = None  # when the answer being written began to think
        self.docs: Attached | None = None  # a document collection the answers come from (session/docs.py)
        self._init_tools(tools)
        if writer is not None:
            writer.on_state = lambda st: self.post(lambda: self.view.save_state_changed(st))

    # ---- state ----------------------------------------------------------------------------------

    @property
    def save_state(self) -> SaveState:
        return self.writer.state if self.writer else SaveState()

    @property
    def busy(self) -> bool:
        return self.phase != "idle"

    def _set_phase(self, phase: Phase) -> None:
        if phase != self.phase:
            self.phase = phase
            self.view.phase_changed(phase)

    def _write(self, run: Callable[[History], Any], *, then: Callable[[Any], None] | None = None,
               key: Any = None, fills: Ref | None = None) -> None:
        """Queue a write; `then(result)` comes back on the session's thread. `fills`: the row id
        `run` notes, forgotten again if its transaction rolls back."""
        if self.writer is None:
            if then is not None:
                then(None)
            return
        back = None if then is None else (lambda result: self.post(lambda: then(result)))
        undo = None if fills is None else (lambda: setattr(fills, "id", None))
        self.writer.submit(run, then=back, key=key, undo=undo)

    @contextmanager
    def _action(self) -> Iterator[None]:
        """The writes of one user action (send, edit, regenerate) go to the database in one
        transaction: a crash or a full disk halfway leaves the history as it was before it."""
        if self.writer is None:
            yield
            return
        with self.writer.transaction():
            yield

    # ---- conversations --------------------------------------------------------------------------

    def new_conversation(self, *, title: str = "New chat", system_prompt: str = "",
                         sampling: SamplingSettings | None = None, mcp_off: tuple[str, ...] = ()) -> Conversation:
        """Open a new, empty conversation at once; its row is written in the background."""
        if self.busy:
            raise Refused("an answer is still being written; stop it first")
        mode = "completion" if self.model is not None and self.model.chat_format == "completion" \
            else "chat"
        now = time.time()
        conv = Conversation(id=0, title=title, created=now, updated=now, system_prompt=system_prompt,
                            sampling=sampling or SamplingSettings(), mode=mode, mcp_off=mcp_off)
        row = Ref()
        self._show(conv, [], row)

        model = self.model.model if self.model is not None else ""
        conv = dataclasses.replace(conv, model=model)
        self.conv = conv

        def create(h: History) -> Conversation:
            saved = h.new_conversation(title, system_prompt=system_prompt, sampling=conv.sampling,
                                       mode=mode, model=model, mcp_off=mcp_off)
            row.id = saved.id
            return saved

        self._write(create, then=lambda saved: self._conversation_saved(row, saved), fills=row)
        return conv

    def open(self, conv: Conversation, messages: list[Message],
             versions: dict[int, tuple[int, int]] | None = None) -> None:
        """Show a stored conversation (read by the caller, off its thread if it has a GUI);
        `versions` is History.versions(conv.id): which messages have earlier versions."""
        if self.busy:  # the user moved on: the answer stops where it is
            self.stop()
            self._finish("cancelled")
        versions = versions or {}
        self._show(conv, [Turn.from_message(m, versions.get(m.id, (1, 1))) for m in messages],
                   Ref(conv.id))

    def close_conversation(self) -> None:
        self._show(None, [], Ref())

    def _show(self, conv: Conversation | None, turns: list[Turn], row: Ref) -> None:
        self.conv, self.turns, self.conv_row, self.editing = conv, turns, row, None
        self.view.show_conversation(conv, list(turns))

    def _conversation_saved(self, row: Ref, saved: Conversation | None) -> None:
        if saved is None:
            return
        if self.conv_row is row and self.conv is not None:
            self.conv = dataclasses.replace(saved, title=self.conv.title, mode=self.conv.mode,
                                            system_prompt=self.conv.system_prompt,
                                            sampling=self.conv.sampling, model=self.conv.model,
                                            mcp_off=self.conv.mcp_off)
            saved = self.conv
        self.view.conversation_saved(saved)

    def update_conversation(self, *, title: str | None = None, system_prompt: str | None = None,
                            sampling: SamplingSettings | None = None, mode: str | None = None,
                            model: str | None = None, mcp_off: tuple[str, ...] | None = None) -> None:
        """Change the open conversation now; the row follows in the background."""
        if self.conv is None:
            return
        changes: dict[str, Any] = {k: v for k, v in (("title", title), ("system_prompt", system_prompt),
                                                     ("sampling", sampling), ("mode", mode),
                                                     ("model", model), ("mcp_off", mcp_off)) if v is not None}
        if "title" in changes:
            changes["title"] = changes["title"].strip() or "Untitled"
        self.conv = dataclasses.replace(self.conv, **changes)
        row = self.conv_row
        self._write(lambda h: h.update_conversation(row.get(), **changes),
                    then=lambda saved: self._conversation_saved(row, saved))

    def delete_conversation(self) -> None:
        if self.conv is None or self.busy:
            return
        row = self.conv_row
        self._write(lambda h: h.delete(row.get()))
        self.close_conversation()

    # ---- sending --------------------------------------------------------------------------------

    def check_can_send(self) -> None:
        if self.phase == "tool":
            raise Refused("a tool call is waiting: allow or deny it, or stop")
        if self.busy:
            raise Refused("an answer is still being written; stop it first")
        if self.model is None:
            raise Refused(f"no model is loaded: {self.no_model_reason}" if self.no_model_reason
                          else "no model is loaded yet: choose one first")

    def send(self, text: str, *, system_prompt: str = "",
             sampling: SamplingSettings | None = None, images: Sequence[bytes] = ()) -> Turn:
        """Add the user's message (with its images, for a model that sees) and start the answer. Raises
        Refused (nothing changes) when an answer is running, no model is loaded, or an image is refused.
        system_prompt/sampling are for a new conversation."""
        text = text.strip()
        if not text and not images:
            raise Refused("nothing to send")
        self.check_can_send()
        keys = self._check_images(images)
        with self._action():
            return self._send(text, system_prompt=system_prompt, sampling=sampling, images=images, keys=keys)

    def _send(self, text: str, *, system_prompt: str, sampling: SamplingSettings | None,
              images: Sequence[bytes], keys: list[str]) -> Turn:
        if self.conv is None:
            self.new_conversation(system_prompt=system_prompt, sampling=sampling)
        assert self.conv is not None
        for data in images:
            self._write(_store_image(data))  # the file before the message naming it
        user = Turn(role="user", content=text, stats={"images": keys} if keys else {})
        edited = self.editing
        retitle = self.conv.title == "New chat"
        if edited is not None and edited in self.turns:
            # The edited message and what followed it stay as an earlier version.
            first_user = next((t for t in self.turns if t.role == "user"), None)
            retitle = retitle or (edited is first_user
                                  and self.conv.title == title_from(edited.content))
            user.version = (edited.version[1] + 1, edited.version[1] + 1)
            self._add(user, status="done", replaces=self._replace_from(edited))
        else:
            self.editing = None
            self._add(user, status="done")
        if retitle:
            self.update_conversation(title=title_from(text))
        if self.model is not None and self.conv.model != self.model.model:
            self.update_conversation(model=self.model.model)  # the conversation remembers its model
        self.rounds = 0
        self._start_answer()
        return user

    def _check_images(self, images: Sequence[bytes]) -> list[str]:
        """The images' keys, each checked (Refused with the reason); kept for the requests that show them."""
        if not images:
            return []
        if self.model is None or not self.model.mmproj:
            name = Path(self.model.model).name if self.model is not None else "the model"
            raise Refused(f"{name} reads text only: it has no vision projector (mmproj), so it cannot see images")
        if self.conv is not None and self.conv.mode == "completion":
            raise Refused("images go in a chat, not in completion mode")
        if len(images) > img.MAX_IMAGES:
            raise Refused(f"at most {img.MAX_IMAGES} images in one message")
        keys = []
        for data in images:
            try:
                img.check(data)
            except img.ImageError as e:
                raise Refused(str(e)) from None
            keys.append(img.sha256(data))
            self._image_bytes[keys[-1]] = data
        return keys

    def image(self, key: str) -> bytes | None:
        """An image of the conversation by sha256: sent in this session, or read from the history."""
        data = self._image_bytes.get(key)
        if data is None and self.image_source is not None:
            data = self.image_source(key)
        return data

    def images_of(self, key: int) -> list[bytes]:
        """The images of turn `key` (to attach them again when it is edited)."""
        turn = self._turn(key)
        found = [self.image(k) for k in images_of(turn.stats)] if turn is not None else []
        return [d for d in found if d is not None]

    def continue_text(self) -> None:
        """Completion mode, nothing typed: the model writes on from where the text ends."""
        self.check_can_send()
        if self.conv is None or self.conv.mode != "completion" or not any(t.content for t in self.turns):
            raise Refused("write the beginning of a text first: the model continues it")
        self.rounds = 0
        with self._action():
            self._start_answer()

    def regenerate(self, key: int) -> None:
        """Answer turn `key` again. The current answer and every turn after it are kept as an
        earlier version (step back to it with step_version), never deleted."""
        self.check_can_send()
        turn = self._turn(key)
        if turn is None:
            return
        if turn.role != "assistant":
            raise Refused("only an answer can be written again")
        self.rounds = 0
        with self._action():
            self._start_answer(version=(turn.version[1] + 1, turn.version[1] + 1),
                               replaces=self._replace_from(turn))

    def step_version(self, key: int, step: int) -> None:
        """Show the previous (-1) or next (+1) version of turn `key`, with its own later turns."""
        if self.busy:
            raise Refused("an answer is still being written; stop it first")
        turn = self._turn(key)
        if turn is None or self.conv is None or self.writer is None:
            return
        conv, conv_row, row = self.conv, self.conv_row, turn.row

        def switch(h: History) -> tuple[list[Message], dict[int, tuple[int, int]]]:
            msgs = h.switch_version(conv_row.get(), row.get(), step)
            return msgs, h.versions(conv_row.get())

        def shown(result: tuple[list[Message], dict[int, tuple[int, int]]] | None) -> None:
            if result is None or self.conv_row is not conv_row or self.busy:
                return
            msgs, versions = result
            self._show(conv, [Turn.from_message(m, versions.get(m.id, (1, 1))) for m in msgs],
                       conv_row)

        self._write(switch, then=shown)

    def _replace_from(self, turn: Turn) -> Ref:
        """`turn` and what follows leave the screen. In the history they become an earlier version
        when the message that replaces them is written (replace_message: one write)."""
        self.editing = None
        self.turns = self.turns[:self.turns.index(turn)]
        self.view.show_conversation(self.conv, list(self.turns))
        return turn.row

    def edit(self, key: int) -> str:
        """Start editing turn `key`: returns its text; the next send replaces it and what follows."""
        if self.busy:
            raise Refused("an answer is still being written; stop it first")
        turn = self._turn(key)
        if turn is None:
            raise Refused("that message is gone")
        self.editing = turn
        return turn.content

    def _turn(self, key: int) -> Turn | None:
        return next((t for t in self.turns if t.key == key), None)

    def _add(self, turn: Turn, *, status: str, then: Callable[[Any], None] | None = None,
             replaces: Ref | None = None) -> None:
        """Show a new turn and write its row (in place of `replaces` and what followed it, which
        become an earlier version)."""
        self.turns.append(turn)
        self.view.turn_added(turn)
        conv_row, row, role, content = self.conv_row, turn.row, turn.role, turn.content
        stats = dict(turn.stats) if turn.stats else None

        def insert(h: History) -> int:
            if replaces is None:
                row.id = h.add_message(conv_row.get(), role, content, status=status, stats=stats).id
            else:
                row.id = h.replace_message(conv_row.get(), replaces.get(), role, content,
                                           status=status, stats=stats).id
            return row.id

        self._write(insert, then=then, fills=row)

    def _start_answer(self, version: tuple[int, int] | None = None,
                      replaces: Ref | None = None) -> None:
        """Commit the answer's (empty) row, then ask the engine: what the user wrote is on disk
        before generation for it starts."""
        assert self.conv is not None
        conv = self.conv
        request = build_request(conv, self.turns, images=self.image,
                                vision=bool(self.model is not None and self.model.mmproj))
        self._loop_cut = None
        if self.base_model and conv.mode == "chat":
            # A base model does not know where a chat turn ends: a turn is one paragraph.
            request["sampling"] = dataclasses.replace(
                conv.sampling, stop=[*conv.sampling.stop, BASE_MODEL_TURN_END])
        answer = Turn(role="assistant", content="", status="streaming",
                      stats={"model": Path(self.model.model).name} if self.model else {})
        self._ground(request, answer)
        if version is not None:
            answer.version = version
        self.answer = answer
        self._set_phase("saving")
        self.offer, self._stream = None, None
        self._add(answer, status="streaming", then=lambda _: self._offer_tools(answer, conv, request),
                  replaces=replaces)

    def attach_docs(self, docs: Attached | None) -> None:
        """Answer from a document collection from now on (None: no more)."""
        self.docs = docs

    def _ground(self, request: dict[str, Any], answer: Turn) -> None:
        """With documents attached: the question's sources go into the request, their citations into
        the answer's stats (saved with it); sources that do not fit are named in a notice."""
        question = next((t.content for t in reversed(self.turns) if t.role == "user"), "")
        if self.docs is None or not question or self.conv is None:
            return
        n_ctx = self.model.n_ctx if self.model is not None and self.model.n_ctx else 4096
        try:
            grounding = self.docs.apply(request, question, n_ctx=n_ctx, max_tokens=self.conv.sampling.max_tokens)
        except (KnownError, OSError) as e:
            self.view.notice(f"searching {self.docs.name!r} failed ({e}): this answer has no sources", "warning")
            return
        answer.stats.update(grounding.stats())
        if not grounding.cited:
            self.view.notice(f"nothing in {self.docs.name!r} matches the question, or no source fits the "
                             "context: this answer has no sources", "warning")
        elif grounding.left_out:
            self.view.notice(grounding.notice(), "warning")

    def _begin(self, answer: Turn, conv: Conversation, request: dict[str, Any], extra: dict[str, Any]) -> None:
        if self.answer is not answer or self.phase != "saving":
            return  # stopped (or replaced) before its row was on disk: the engine is never asked
        try:
            self.rid = self.engine.generate(**{"sampling": conv.sampling, **request, **extra})
        except (KnownError, OSError) as e:
            self._finish("error")
            self.view.notice(f"could not start the answer: {e}", "error")
            return
        self._saved_at = self.clock()
        self._set_phase("streaming")

    @property
    def base_model(self) -> bool:
        """The loaded model has no chat template (it continues text)."""
        return self.model is not None and self.model.chat_format == "completion"

    def _check_loop(self, answer: Turn) -> None:
        """A base model that writes the same span a third time is stopped after the first."""
        if self._loop_cut is None and self.base_model and self.rid is not None \
                and (cut := repeat_cut(answer.content)) is not None:
            self._loop_cut = cut
            self._set_phase("stopping")
            self.engine.cancel(self.rid)

    def stop(self) -> None:
        """Ask for the answer to stop (what was written is kept). The engine client kills and
        restarts an engine that does not stop within its grace period, so this always ends.
        Between answers, a tool that runs is stopped and calls not yet allowed never run."""
        if self.phase == "tool":
            self._stop_calls()
        elif self.phase == "saving":  # the engine has not been asked: end now, even if the disk waits
            self._finish("cancelled")
        elif self.phase == "streaming" and self.rid is not None:
            self._set_phase("stopping")
            self.engine.cancel(self.rid)

    def _finish(self, status: str, finish_reason: str = "", *, calls: list[dict[str, Any]] | None = None) -> None:
        """The answer ended; with `calls` (MCP tool calls) the tool loop goes on instead of idling."""
        answer = self.answer
        if answer is None:
            return
        self.answer, self.rid, self._stream, self._think_t0 = None, None, None, None
        answer.status, answer.finish_reason = status, finish_reason
        if finish_reason:
            answer.stats["finish_reason"] = finish_reason  # shown under the answer, also later
        if calls:
            answer.stats["tool_loop"] = True  # its calls are run here: shown as cards, not as text
        self._save_answer(answer, final=True)
        if calls:
            self.view.turn_finished(answer)
            self._start_calls(calls)
            return
        self._set_phase("idle")
        self.view.turn_finished(answer)

    def _save_answer(self, turn: Turn, *, final: bool) -> None:
        row, content = turn.row, turn.content
        status, stats = (turn.status, dict(turn.stats)) if final else (None, None)
        self._write(lambda h: h.update_message(row.get(), content=content, status=status, stats=stats),
                    key=("answer", turn.key))

    def close(self) -> None:
        """The front end is going away: an answer in progress is kept as a partial one."""
        if self.phase == "tool":
            self._stop_calls()
        if self.answer is not None:
            if self.rid is not None:
                self.engine.cancel(self.rid)
            self._finish("partial")

    # ---- engine events --------------------------------------------------------------------------

    def on_event(self, ev: P.Event) -> None:
        answer, rid = self.answer, self.rid
        mine = rid is not None and getattr(ev, "id", None) == rid
        if isinstance(ev, (P.Token, P.Stats, P.Done)):
            if mine and answer is not None:
                self._on_answer_event(answer, ev)
        elif isinstance(ev, P.Overflow):
            if mine and answer is not None:  # what the overflow policy left out: a quiet line above the answer
                answer.stats["context_note"] = context_note(ev)
                self.view.context_noted(answer)
        elif isinstance(ev, P.Error):
            self._on_error(ev, mine)
        elif isinstance(ev, P.Loaded):
            self._on_loaded(ev)
        elif isinstance(ev, P.Unloaded):
            self._set_model(None, "")
        elif isinstance(ev, P.Lifecycle):
            self._on_lifecycle(ev)

    def _on_answer_event(self, answer: Turn, ev: P.Token | P.Stats | P.Done) -> None:
        """A Token, Stats or Done of the answer being written."""
        if isinstance(ev, P.Token) and ev.reasoning:
            self._thought(answer, ev)
        elif isinstance(ev, P.Token):
            self._thinking_ended(answer)
            piece = self._shown_piece(ev.text)
            if piece:
                answer.content += piece
                self.view.turn_grew(answer, piece)
                self._check_loop(answer)
            if self.clock() - self._saved_at >= self.save_every:
                self._saved_at = self.clock()
                self._save_answer(answer, final=False)
        elif isinstance(ev, P.Stats):
            kept = {k: answer.stats[k] for k in (*KEPT_STATS, *THINKING) if k in answer.stats}
            answer.stats = {**dataclasses.asdict(ev), **kept}
        else:
            self._on_done(answer, ev)

    def _on_done(self, answer: Turn, ev: P.Done) -> None:
        self._settle_text(answer, ev)
        if ev.text and not answer.content and not (ev.tool_calls and self.offer is not None):
            answer.content = ev.text
        self._thinking_ended(answer, ev)
        if ev.tool_calls:  # shown as readable blocks under the answer (ui/message_widget.py)
            answer.stats["tool_calls"] = ev.tool_calls
            answer.stats["content"] = ev.content or ""
        if self._loop_cut is not None:  # we stopped it: it was repeating itself
            answer.content = answer.content[:self._loop_cut].rstrip()
            self._finish("done", "repeat")
        else:
            self._finish("cancelled" if ev.finish_reason == "cancelled" else "done",
                         ev.finish_reason, calls=ev.tool_calls if self._wants_tools(ev) else None)

    def _thought(self, answer: Turn, ev: P.Token) -> None:
        if self._think_t0 is None:
            self._think_t0 = self.clock()
        answer.reasoning += ev.text
        answer.stats["reasoning"] = answer.reasoning
        answer.stats["reasoning_tokens"] = int(answer.stats.get("reasoning_tokens") or 0) + 1
        answer.stats["reasoning_s"] = round(self.clock() - self._think_t0, 1)
        self.view.turn_thought(answer, ev.text)

    def _thinking_ended(self, answer: Turn, done: P.Done | None = None) -> None:
        """The answer began (or ended): the thinking's time is final; Done has its exact token count."""
        if done is not None and done.reasoning and not answer.reasoning:
            answer.reasoning = answer.stats["reasoning"] = done.reasoning
        if done is not None and "reasoning_tokens" in done.usage:
            answer.stats["reasoning_tokens"] = done.usage["reasoning_tokens"]
        if self._think_t0 is not None:
            answer.stats["reasoning_s"] = round(self.clock() - self._think_t0, 1)
            self._think_t0 = None

    def _on_error(self, ev: P.Error, mine: bool) -> None:
        if ev.kind in P.STOP_KINDS:
            self._set_model(None, "")
            if mine:
                self._finish("partial")
            self.view.notice(ev.message, "error")
        elif mine:
            self._finish("error")
            if ev.kind == "context":
                self.view.notice(f"the conversation does not fit the model's context: {ev.message}; "
                                 "start a new conversation or load the model with a larger context",
                                 "error")
            else:
                self.view.notice(f"the answer failed: {ev.message}", "error")
        elif ev.kind in P.LOAD_NOTICE_KINDS:
            self.view.notice(ev.message, "warning")
        elif ev.kind in ("load", "settings"):
            self._set_model(None, self.no_model_reason)
        elif ev.id is None or ev.id != self.rid:
            self.view.notice(ev.message, "error")

    def _on_loaded(self, ev: P.Loaded) -> None:
        self._set_model(ev, "")
        conv = self.conv
        if ev.chat_format == "completion":
            if conv is not None and conv.mode == "chat" and not self.turns:
                self.update_conversation(mode="completion")
            self.view.base_model_loaded(ev)

    def _on_lifecycle(self, ev: P.Lifecycle) -> None:
        if ev.state != "loaded":
            self._set_model(None, ev.reason)
        if ev.state == "loaded" and ev.restarted:
            self.view.notice("the engine restarted and the model is loaded again; nothing was lost")
        elif ev.state == "ready" and ev.reason:
            self.view.notice(ev.reason, "error")
        elif ev.state == "failed":
            self.view.notice(ev.reason or "the engine cannot run", "error")

    def _set_model(self, model: P.Loaded | None, reason: str) -> None:
        changed = model is not self.model
        self.model, self.no_model_reason = model, reason
        if changed:
            self.view.model_changed(model)
