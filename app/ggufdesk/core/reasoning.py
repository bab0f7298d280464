"""Reasoning models: which templates reason and how, and splitting output into reasoning and answer as it streams.

Formats:
- think:    <think>...</think> then the answer (Qwen3, DeepSeek R1 and its distills, QwQ, SmolLM3,
            Phi-4-reasoning); the template may open the block in the prompt (R1 distills, DeepSeek
            V3.1 with thinking on), then the output starts inside it.
- mistral:  [THINK]...[/THINK] (Magistral).
- cohere:   <|START_THINKING|>...<|END_THINKING|> then the answer (Command R7B; its
            <|START_RESPONSE|> markers are special tokens, not text).
- harmony:  gpt-oss's channels: <|channel|>analysis<|message|>...<|end|> is reasoning,
            <|start|>assistant<|channel|>final<|message|>... the answer; a message addressed
            `to=functions.NAME` is a tool call and passes through whole for core/toolcalls.py.
A reasoning budget ends the reasoning by forcing `force_close` (the engine inserts its tokens).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Piece = tuple[bool, str]  # (is reasoning, text)


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    open: str
    close: str
    force_close: str  # what the engine inserts when the budget runs out
    tokens: tuple[str, ...]  # special tokens the engine must show as text


THINK = ReasoningFormat("think", "<think>", "</think>", "</think>", ("<think>", "</think>"))
MISTRAL = ReasoningFormat("mistral", "[THINK]", "[/THINK]", "[/THINK]", ("[THINK]", "[/THINK]"))
HARMONY = ReasoningFormat("harmony", "<|channel|>analysis<|message|>", "<|end|>",
                          "<|end|><|start|>assistant<|channel|>final<|message|>",
                          ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"))
COHERE = ReasoningFormat("cohere", "<|START_THINKING|>", "<|END_THINKING|>", "<|END_THINKING|>",
                         ("<|START_THINKING|>", "<|END_THINKING|>"))
EFFORTS = ("low", "medium", "high")


def _by_markers(t: str) -> ReasoningFormat | None:
    """The format whose markers the template itself writes."""
    if "<|channel|>" in t:
        return HARMONY
    if "[THINK]" in t:
        return MISTRAL
    if "<|START_THINKING|>" in t:
        return COHERE
    if "<think>" in t or "</think>" in t:
        return THINK
    return None


def detect(template: str | None) -> ReasoningFormat | None:
    """The reasoning format a chat template was written for, or None for a model that does not reason."""
    t = template or ""
    return _by_markers(t) or (THINK if "reasoning_content" in t else None)


def template_switches(template: str | None, think: bool | str | None) -> tuple[dict[str, Any], bool]:
    """Template variables for a request's `think` (None: auto; True/False; or an effort
    "low"|"medium"|"high"), and whether the template honoured an off switch (False: the engine must
    end the reasoning itself, with a budget of 0).

    Auto sets `enable_thinking` true where the template reads it and writes the markers of a format
    the engine splits, as llama-server does (its `--reasoning auto` passes enable_thinking=true to
    every template that can think): templates written for llama.cpp close the think block when the
    variable is missing (`{% if not enable_thinking %}`), and Qwen3's defaults to on anyway. A template
    whose thinking the engine would not read apart (Gemma 4's channels) keeps its own default, as do
    the other switches (DeepSeek V3.1's `thinking`, off by default, also where it falls back on
    enable_thinking; gpt-oss's effort)."""
    t = template or ""
    v31 = bool(re.search(r"\bthinking\b", t)) and "tool▁calls" in t  # DeepSeek V3.1's switch
    if think is None:
        auto_on = "enable_thinking" in t and _by_markers(t) is not None and not v31
        return ({"enable_thinking": True} if auto_on else {}), True
    on = think is not False
    out: dict[str, Any] = {}
    if "enable_thinking" in t:
        out["enable_thinking"] = on
    if v31:
        out["thinking"] = on
    if "reasoning_effort" in t:
        effort = think if isinstance(think, str) and think in EFFORTS else None
        out["reasoning_effort"] = effort or ("medium" if on else "low")
    honoured = on or "enable_thinking" in out or "thinking" in out
    return out, honoured


def starts_inside(fmt: ReasoningFormat, prompt: str) -> bool:
    """Does the prompt open the reasoning block, so the output starts inside it?"""
    return fmt.name != "harmony" and prompt.rstrip().endswith(fmt.open)


def strip_reasoning(messages: list[dict[str, Any]], fmt: ReasoningFormat | None) -> list[dict[str, Any]]:
    """Earlier answers without their reasoning: reasoning written into an assistant's content moves
    to its `reasoning_content`, which only a template that asks for it renders."""
    if fmt is None or fmt.name == "harmony":
        return messages
    out = []
    for m in messages:
        content = m.get("content")
        if m.get("role") == "assistant" and isinstance(content, str) and fmt.close in content:
            head, _, answer = content.partition(fmt.close)
            m = {**m, "content": answer.lstrip(),
                 "reasoning_content": m.get("reasoning_content") or head.replace(fmt.open, "", 1).strip()}
        out.append(m)
    return out


class ReasoningSplit:
    """Output text in, (is reasoning, text) pieces out, as it streams; nothing is lost or repeated.

    The markers themselves are dropped, and the spaces around them: reasoning is trimmed, the answer
    starts at its first visible character. Text held back (a marker may be starting) comes out at
    `finish`, also when the block is never closed.
    """

    def __init__(self, fmt: ReasoningFormat, *, inside: bool = False) -> None:
        self.fmt = fmt
        self._buf = ""
        self._state = "reasoning" if inside else "start"
        self._kind = ""  # harmony: the current message's kind (reasoning | answer | call)
        self._final = False  # harmony: the current message is the final channel's (it ends the output)
        self._started = False  # reasoning text shown yet (its leading spaces are dropped)
        self.reasoning = ""
        self.answer = ""

    @property
    def in_reasoning(self) -> bool:
        if self.fmt.name == "harmony":
            return self._state == "body" and self._kind == "reasoning"
        return self._state == "reasoning"

    @property
    def settled(self) -> bool:
        """No reasoning can come any more: a think block closed, or the answer began without one.
        Harmony opens a message per channel, and analysis may follow a commentary message (a preamble
        to the user), so only its final message settles it: that one ends with <|return|>, which
        ends the output (llama.cpp counts it, and <|call|>, as end of generation; <|end|> it does not)."""
        if self.fmt.name == "harmony":
            return self._final or self._state == "plain"
        return self._state in ("after", "answer")

    def push(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        step = self._harmony if self.fmt.name == "harmony" else self._think
        while step(out, final=False):
            pass
        return self._record(out)

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        step = self._harmony if self.fmt.name == "harmony" else self._think
        while step(out, final=True):
            pass
        if self._buf:
            out.append((self._state == "reasoning" or self._kind == "reasoning", self._buf))
            self._buf = ""
        return self._record(out)

    def _record(self, out: list[Piece]) -> list[Piece]:
        merged: list[Piece] = []
        for is_r, text in out:
            if not text:
                continue
            if is_r:
                self.reasoning += text
            else:
                self.answer += text
            if merged and merged[-1][0] == is_r:
                merged[-1] = (is_r, merged[-1][1] + text)
            else:
                merged.append((is_r, text))
        return merged

    # ---- <think>...</think> -------------------------------------------------------------------------

    def _think(self, out: list[Piece], *, final: bool) -> bool:
        """One step of the think-block machine; True while there is more to do now."""
        f, buf = self.fmt, self._buf
        if self._state == "start":
            body = buf.lstrip()
            if body.startswith(f.open):
                self._state, self._buf = "reasoning", body[len(f.open):]
                return True
            if f.open.startswith(body) and not final:
                return False  # maybe the opening marker, still coming
            self._state = "answer"
            return True
        if self._state == "reasoning":
            i = buf.find(f.close)
            if i >= 0:
                self._reason(out, buf[:i].rstrip())
                self._state, self._buf = "after", buf[i + len(f.close):]
                return True
            upto = len(buf) if final else len(buf[:len(buf) - _partial(buf, f.close)].rstrip())
            self._reason(out, buf[:upto])  # spaces wait: they end the reasoning if the marker follows
            self._buf = buf[upto:]
            return False
        if self._state == "after":
            body = buf.lstrip()
            if not body and not final:
                self._buf = ""
                return False
            self._state, self._buf = "answer", body
            return True
        out.append((False, buf))
        self._buf = ""
        return False

    def _reason(self, out: list[Piece], text: str) -> None:
        if not self._started:
            text = text.lstrip()
            self._started = bool(text)
        out.append((True, text))

    # ---- harmony channels -------------------------------------------------------------------------

    def _harmony(self, out: list[Piece], *, final: bool) -> bool:
        buf = self._buf
        if self._state in ("start", "header"):
            body = buf.lstrip()
            if self._state == "start" and body and not any(body.startswith(h) or h.startswith(body)
                                                           for h in ("<|", "to=")):
                # not harmony at all: all answer (decided on the first visible characters, as a stream
                # must, even where a <|message|> comes later: the whole answer then reads as the stream)
                self._state, self._kind = "plain", "answer"
                return True
            i = buf.find("<|message|>")
            if i < 0:
                return False
            header = buf[:i]
            channel = re.search(r"<\|channel\|>\s*([a-z]+)", header)
            name = channel.group(1) if channel else ""
            self._kind = "call" if "to=functions." in header else "reasoning" if name == "analysis" else "answer"
            # (the current message's: output that opens analysis after its final message, which a
            # well-formed one cannot, is bounded by the budget again)
            self._final = name == "final" and self._kind == "answer"
            if self._kind == "call":
                out.append((False, buf[:i + len("<|message|>")]))
            self._state, self._buf = "body", buf[i + len("<|message|>"):]
            return True
        if self._state == "plain":
            out.append((False, buf))
            self._buf = ""
            return False
        m = re.search(r"<\|(end|call|return|start)\|>", buf)
        if m is None:
            keep = 0 if final else _partial_any(buf, ("<|end|>", "<|call|>", "<|return|>", "<|start|>"))
            out.append((self._kind == "reasoning", buf[:len(buf) - keep]))
            self._buf = buf[len(buf) - keep:]
            return False
        end = m.end() if m.group(1) != "start" else m.start()
        body = buf[:m.start()] + (buf[m.start():end] if self._kind == "call" else "")
        out.append((self._kind == "reasoning", body))
        self._state, self._kind, self._buf = "header", "", buf[end:]
        return True


def _partial(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _partial_any(text: str, markers: tuple[str, ...]) -> int:
    return max(_partial(text, m) for m in markers)


def split_all(fmt: ReasoningFormat, text: str, *, inside: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole output."""
    s = ReasoningSplit(fmt, inside=inside)
    s.push(text)
    s.finish()
    return s.reasoning, s.answer
