"""Chat templates by name, for `serve --chat-template NAME` (llama-server's built-in names that clients use most)."""
from __future__ import annotations

from ggufdesk.core.errors import SettingsError

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
NAMED = {"chatml": CHATML, "llama3": LLAMA3}


def template_for(value: str) -> str:
    """A built-in template's Jinja text by name, or `value` itself when it is Jinja text."""
    if value in NAMED:
        return NAMED[value]
    if not value.strip():
        raise SettingsError(f"an empty chat template: give Jinja text, a file (--chat-template-file), "
                            f"or one of {', '.join(sorted(NAMED))}")
    return value  # Jinja text (as llama-server takes any other value: a literal text is a valid template)
