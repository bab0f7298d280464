"""Chat prompts: the GGUF's own template in a sandboxed Jinja environment, or a built-in one by architecture."""
from __future__ import annotations

from typing import Any

import jinja2
from jinja2.sandbox import SecurityError
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ggufdesk.core.errors import KnownError

# For models that ship no template (base models such as the starter model): a plain transcript.
# Measured on the starter model, a base model continues "User:/Assistant:" sensibly, while chat
# turn tokens it was never trained on (Gemma's <start_of_turn>) make it ramble.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\n\n' }}"
    "{% else %}{{ ('Assistant' if m['role'] == 'assistant' else 'User') + ': ' + m['content'] + '\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
PLAIN_STOPS = ["\nUser:"]


class ChatTemplate:
    """Renders messages to a prompt; template problems become KnownError with a plain message."""

    def __init__(self, template: str | None, *, bos: str, eos: str) -> None:
        self.builtin = template is None
        self.source = template  # the model's own template text (tool format detection)
        self.name = "builtin:plain" if self.builtin else "template"
        self.stops = list(PLAIN_STOPS) if self.builtin else []
        source = PLAIN_TEMPLATE if self.builtin else template
        try:
            self._fmt = Jinja2ChatFormatter(source, eos_token=eos, bos_token=bos)
        except jinja2.TemplateError as e:
            raise KnownError(f"the model's chat template is broken ({e}); using completion mode") from None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt for `messages`; `tools` (OpenAI-style) go to the template's `tools` variable."""
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool") \
                    or not (isinstance(m.get("content"), str)
                            or (m.get("content") is None and m.get("tool_calls"))):
                raise KnownError(f"bad chat message: {str(m)[:100]}")
        try:
            return self._fmt(messages=messages, tools=tools or None).prompt
        except SecurityError as e:
            raise KnownError(f"the model's chat template tried an unsafe operation and was blocked ({e})") from None
        except (jinja2.TemplateError, ValueError, TypeError, KeyError, IndexError) as e:
            raise KnownError(f"the model's chat template failed to render: {e}") from None


def fit_messages(messages: list[dict[str, str]], count_tokens, budget: int) -> list[dict[str, str]]:
    """Drop the oldest turns (never the system prompt, never the last message) until the prompt fits.

    count_tokens(messages) -> int. Raises KnownError if even the shortest form does not fit.
    """
    system = [m for m in messages[:1] if m.get("role") == "system"]
    rest = messages[len(system):]
    while True:
        if count_tokens(system + rest) <= budget:
            return system + rest
        if len(rest) <= 1:
            raise KnownError(
                f"the message is too long for the context ({count_tokens(system + rest)} tokens, "
                f"room for {budget}); shorten it or load the model with a larger context"
            )
        rest = rest[1:]
        # a conversation should not start with an assistant turn
        while len(rest) > 1 and rest[0].get("role") == "assistant":
            rest = rest[1:]
