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
# The next three render as llama.cpp's built-in templates of the same name do (src/llama-chat.cpp):
# contents trimmed; Command R skips roles other than system/user/assistant, Gemma folds the system
# text into the first user turn and calls the assistant "model"; no BOS written (the engine adds it).
COMMAND_R = (
    "{%- for m in messages -%}{%- set head = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'}"
    ".get(m['role']) -%}{%- if head -%}{{- '<|START_OF_TURN_TOKEN|><|' + head + '_TOKEN|>' + (m['content'] or '')"
    " | trim + '<|END_OF_TURN_TOKEN|>' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"
)
GEMMA = (
    "{%- set ns = namespace(system='') -%}{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.system = ns.system + (m['content'] or '') | trim -%}{%- else -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}{{- '<start_of_turn>' + role + '\n' -}}"
    "{%- if ns.system and role != 'model' -%}{{- ns.system + '\n\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
    "{{- (m['content'] or '') | trim + '<end_of_turn>\n' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)
PHI3 = (
    "{%- for m in messages -%}{{- '<|' + m['role'] + '|>\n' + (m['content'] or '') + '<|end|>\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}"
)
NAMED = {"chatml": CHATML, "llama3": LLAMA3, "command-r": COMMAND_R, "gemma": GEMMA, "phi3": PHI3}


def template_for(value: str) -> str:
    """A built-in template's Jinja text by name, or `value` itself when it is Jinja text."""
    if value in NAMED:
        return NAMED[value]
    if not value.strip():
        raise SettingsError(f"an empty chat template: give Jinja text, a file (--chat-template-file), "
                            f"or one of {', '.join(sorted(NAMED))}")
    return value  # Jinja text (as llama-server takes any other value: a literal text is a valid template)
