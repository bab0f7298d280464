"""Chat prompts: the GGUF's own template in a guarded Jinja sandbox, or a built-in one by architecture."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.runtime.template_guard import (PROBE_SECONDS, RENDER_SECONDS, GuardedEnvironment,
                                            TemplateBudgetError, render_with_deadline)

# For models that ship no template (base models such as the starter model): a plain transcript.
# Measured on the starter model, a base model continues "User:/Assistant:" sensibly, while chat
# turn tokens it was never trained on (Gemma's <start_of_turn>) make it ramble.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\n\n' }}"
    "{% else %}{{ ('Assistant' if m['role'] == 'assistant' else 'User') + ': ' + m['content'] + '\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
PLAIN_STOPS = ["\nUser:"]
CONTINUE_MARK = "\u2063<ggufdesk-continue>\u2063"  # where a prefilled assistant message ends (never in real text)
MAX_TEMPLATE_CHARS = 1 << 20  # real templates are a few KB; the largest known ~30 KB
# Conversations rendered at load time: a template that cannot render any of them is refused then,
# not at the first message. Templates may refuse a system turn (raise_exception), hence the fallbacks.
PROBES: tuple[list[dict[str, str]], ...] = (
    [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "Hello"}],
)


class TemplateRaised(jinja2.TemplateError):
    """The template itself called raise_exception (it refuses this conversation's shape)."""


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """Pass-through for Hugging Face's ``{% generation %}`` tag (as llama-cpp-python and Transformers do)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _now() -> datetime:
    return datetime.now()  # (local time, as llama.cpp's templates get it; tests replace this)


def _strftime_now(fmt: str) -> str:
    return _now().strftime(fmt)


def _dates() -> dict[str, str]:
    """Today for templates that take it as a variable rather than calling strftime_now, in the forms
    llama.cpp's server passes (common/chat.cpp): Llama 3.x reads `date_string` (else it says "26 Jul
    2024"), Firefunction v2 `datetime`."""
    now = _now().astimezone()  # (llama.cpp writes local time and calls it GMT; this names the zone)
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y %H:%M:%S %Z")}


def _functions(tools: Any) -> str:
    """The `functions` variable: the tools as JSON text (2-space indent), "" without tools, as llama.cpp
    passes it (common/chat.cpp's Firefunction v2 handler; Firefunction's template adds it to a string)."""
    return json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""


class ChatTemplate:
    """Renders messages to a prompt; template problems become KnownError with a plain message.

    The model's template is compiled in a guarded sandbox (template_guard: sizes and time bounded)
    and rendered once at load on a probe conversation, so a template that hangs, explodes or fails
    is refused when the model loads.
    """

    def __init__(self, template: str | None, *, bos: str, eos: str, probe: bool = True) -> None:
        self.builtin = template is None
        self.source = template  # the model's own template text (tool format detection)
        self.name = "builtin:plain" if self.builtin else "template"
        self.stops = list(PLAIN_STOPS) if self.builtin else []
        self.bos, self.eos = bos, eos
        source = PLAIN_TEMPLATE if template is None else template
        if len(source) > MAX_TEMPLATE_CHARS:
            raise KnownError(f"the model's chat template is {len(source)} characters long "
                             f"(limit {MAX_TEMPLATE_CHARS}); refused")
        env = GuardedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                 extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols])
        env.filters["tojson"] = GuardedEnvironment._guard_filter("tojson", _tojson)
        try:
            self._template: jinja2.Template = render_with_deadline(lambda: env.from_string(source), PROBE_SECONDS)
        except jinja2.TemplateSyntaxError as e:
            raise KnownError(f"the model's chat template is broken ({e})") from None
        except (jinja2.TemplateError, RecursionError, MemoryError, ValueError, TypeError, OverflowError) as e:
            raise KnownError(f"the model's chat template cannot be compiled ({type(e).__name__}: "
                             f"{str(e)[:200]})") from None
        if probe and not self.builtin:
            self._probe()

    def _probe(self) -> None:
        last: KnownError | None = None
        for messages in PROBES:
            try:
                self._render(messages, seconds=PROBE_SECONDS)
                return
            except _OverBudget:
                raise
            except _Refused as e:  # e.g. raise_exception('System role not supported'): try a simpler one
                last = e
        raise KnownError(f"the model's chat template fails on a plain conversation: {last}") from None

    def render(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        """The prompt for `messages`; `extra` are further template variables (tools=[...], OpenAI-style).

        A conversation that ends with an assistant message (text, no tool calls) is a prefill: the
        prompt ends inside that message, so the answer continues it (llama-server, Anthropic and
        vLLM's continue_final_message do the same) rather than starting a new turn after it.
        """
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool") \
                    or not (isinstance(m.get("content"), str)
                            or (m.get("content") is None and m.get("tool_calls"))):
                raise KnownError(f"bad chat message: {str(m)[:100]}")
        last = messages[-1] if messages else {}
        if last.get("role") == "assistant" and last.get("content") and not last.get("tool_calls"):
            marked = [*messages[:-1], {**last, "content": last["content"] + CONTINUE_MARK}]
            text = self._render(marked, seconds=RENDER_SECONDS, **{**extra, "add_generation_prompt": False})
            cut = text.rfind(CONTINUE_MARK)
            if cut >= 0:
                return text[:cut]
            # the template dropped or rewrote the final turn: answer after it instead
        return self._render(messages, seconds=RENDER_SECONDS, **extra)

    def _render(self, messages: list[dict[str, str]], *, seconds: float, **extra: Any) -> str:
        kwargs = dict(messages=messages, eos_token=self.eos, bos_token=self.bos, add_generation_prompt=True,
                      raise_exception=_raise_exception, strftime_now=_strftime_now, tools=None,
                      function_call=None, tool_choice=None, **_dates())
        kwargs.update(extra)
        kwargs["functions"] = _functions(kwargs["tools"])
        try:
            return render_with_deadline(lambda: self._template.render(**kwargs), seconds)
        except TemplateBudgetError as e:
            raise _OverBudget(f"the model's chat template went over its budget and was stopped ({e})") from None
        except SecurityError as e:
            raise _OverBudget(f"the model's chat template tried an unsafe operation and was blocked ({e})") from None
        except (jinja2.TemplateError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                RecursionError, MemoryError, OverflowError, ZeroDivisionError) as e:
            raise _Refused(f"the model's chat template failed to render: {type(e).__name__}: "
                           f"{str(e)[:200]}") from None


class _Refused(KnownError):
    """A render that failed; plain KnownError to callers."""


class _OverBudget(_Refused):
    """Stopped for time, size or safety: no other probe is tried."""
