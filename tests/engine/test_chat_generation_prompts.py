"""How a chat prompt ends for reasoning templates under each think setting (as llama-server renders
them), Firefunction v2's `functions` variable, the built-in templates by name, and /apply-template's
Tokenize giving exactly the prompt a generation runs on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufdesk.core.chat_templates import NAMED, template_for
from ggufdesk.core.errors import KnownError
from ggufdesk.core.reasoning import COHERE, THINK, detect, split_all, starts_inside, template_switches
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.chat import ChatTemplate
from tests.fixtures import scripted
from tests.fixtures.scripted import write_scripted

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "templates" / "llamacpp"  # see its README.md
USER = [{"role": "user", "content": "What is today?"}]
TOOL = {"type": "function", "function": {"name": "ipython", "description": "Runs code",
                                         "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                        "required": ["code"]}}}
# Command R7B's generation prompt (its model licence keeps the real file out of the repo): the template
# closes an empty thinking block unless enable_thinking is on.
COMMAND_R7B = ("{% for m in messages %}<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ m.content }}<|END_OF_TURN_TOKEN|>"
               "{% endfor %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
               "{%- if not enable_thinking -%}<|START_THINKING|><|END_THINKING|>{%- endif %}")
# Firefunction v2's use of `functions` and `datetime` (the real template adds both to a string)
FIREFUNCTION = ("{%- set suffix = 'Available functions as JSON spec:' + '\\n' + functions -%}"
                "{%- set suffix = suffix + '\\nToday is ' + datetime + '.' -%}"
                "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\n{{ suffix }}<|eot_id|>"
                "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
                "{% endfor %}<|start_header_id|>assistant<|end_header_id|>\n\n")


def render(source: str, think: bool | None, tools: list | None = None, messages: list | None = None) -> str:
    t = ChatTemplate(source, bos="<s>", eos="</s>")
    return t.render(messages or USER, tools=tools, **template_switches(source, think)[0])


# what llama.cpp's tools/server/tests/unit/test_template.py::test_reasoning expects of llama-server
@pytest.mark.parametrize("tools", [None, [TOOL]])
@pytest.mark.parametrize("name,think,end", [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True, "<｜Assistant｜><think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", None, "<｜Assistant｜><think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", False, "<think>\n</think>"),
    ("Qwen-Qwen3-0.6B", None, "<|im_start|>assistant\n"),
    ("Qwen-Qwen3-0.6B", True, "<|im_start|>assistant\n"),
    ("Qwen-Qwen3-0.6B", False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("Qwen-QwQ-32B", None, "<|im_start|>assistant\n<think>\n"),
    ("Qwen-QwQ-32B", False, "<|im_start|>assistant\n<think>\n</think>"),
])
def test_real_reasoning_templates_end_as_llama_server_renders_them(name, think, end, tools):
    source = (REAL / f"{name}.jinja").read_text(encoding="utf-8")
    prompt = render(source, think, tools)
    assert prompt.endswith(end), prompt[-120:]
    if tools and name.startswith("Qwen"):
        assert '"ipython"' in prompt  # Qwen's templates list the tools themselves (R1's does not)
    # the engine reads a prompt that ends inside <think> as an answer that starts in its reasoning
    assert detect(source) is THINK
    assert starts_inside(THINK, prompt) is end.endswith("<think>\n")


@pytest.mark.parametrize("think,end", [
    (None, "<|CHATBOT_TOKEN|>"), (True, "<|CHATBOT_TOKEN|>"), (False, "<|START_THINKING|><|END_THINKING|>")])
def test_command_r7b_opens_its_own_turn_unless_thinking_is_off(think, end):
    assert render(COMMAND_R7B, think).endswith(end)


def test_command_r7b_thinking_is_read_apart():
    assert detect(COMMAND_R7B) is COHERE
    out = "<|START_THINKING|>The user asks the date.<|END_THINKING|>I cannot know today."
    assert split_all(COHERE, out) == ("The user asks the date.", "I cannot know today.")
    assert not starts_inside(COHERE, render(COMMAND_R7B, False))


def test_auto_sets_only_enable_thinking_and_only_where_the_engine_reads_the_thinking_apart():
    assert template_switches("{{ messages }}", None) == ({}, True)
    think = "{% if enable_thinking %}<think>{% endif %}"
    assert template_switches(think, None) == ({"enable_thinking": True}, True)
    # Gemma 4 thinks in channels of its own, off unless asked: auto keeps its default
    gemma4 = "{% if enable_thinking is defined and enable_thinking %}<|channel>thought{% endif %}{{ reasoning_content }}"
    assert template_switches(gemma4, None) == ({}, True)
    assert template_switches(gemma4, True) == ({"enable_thinking": True}, True)
    v31 = scripted.template("deepseek-v3")  # `thinking`, falling back on enable_thinking: off unless asked
    assert template_switches(v31, None) == ({}, True)
    assert template_switches(v31, True) == ({"enable_thinking": True, "thinking": True}, True)
    effort = "{{ reasoning_effort }}<|channel|>"  # gpt-oss: its own default effort, not forced
    assert template_switches(effort, None) == ({}, True)


def test_firefunction_gets_the_tools_as_json_text_and_today(monkeypatch):
    from datetime import datetime

    from ggufdesk.engine.runtime import chat

    monkeypatch.setattr(chat, "_now", lambda: datetime(2026, 12, 2, 9, 30))
    bare = render(FIREFUNCTION, None)
    assert "Available functions as JSON spec:\n\nToday is Dec 02 2026 09:30:00 " in bare
    with_tools = render(FIREFUNCTION, None, [TOOL])
    assert "Available functions as JSON spec:\n" + json.dumps([TOOL], indent=2) + "\nToday is Dec 02 2026" in with_tools
    # loads (the probe renders it): before, `functions` was None and the template was refused
    assert ChatTemplate(FIREFUNCTION, bos="", eos="").name == "template"


def test_a_template_that_misuses_functions_is_still_refused_clearly():
    with pytest.raises(KnownError, match="fails on a plain conversation"):
        ChatTemplate("{{ functions + 5 }}", bos="", eos="")
    with pytest.raises(KnownError, match="failed to render"):  # a list of tools is text: no .keys()
        ChatTemplate("{{ functions.keys() }}{{ messages[0].content }}", bos="", eos="", probe=False).render(
            USER, tools=[TOOL])


# llama.cpp's tests/test-chat-template.cpp: this conversation and each built-in template's expected output
CONVERSATION = [{"role": r, "content": c} for r, c in (
    ("system", "You are a helpful assistant"), ("user", "Hello"), ("assistant", "Hi there"),
    ("user", "Who are you"), ("assistant", "   I am an assistant   "), ("user", "Another question"))]
LLAMA_CPP_EXPECTED = {
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
                 "Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                 "<|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "gemma": "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\n"
             "Hi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n"
             "I am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
            "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\n"
            "Another question<|end|>\n<|assistant|>\n",
}


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_EXPECTED))
def test_built_in_templates_by_name_render_as_llama_cpps(name):
    t = ChatTemplate(template_for(name), bos="<s>", eos="</s>")
    assert t.render(CONVERSATION) == LLAMA_CPP_EXPECTED[name]
    bare = t.render(CONVERSATION, add_generation_prompt=False)
    assert LLAMA_CPP_EXPECTED[name].startswith(bare) and bare != LLAMA_CPP_EXPECTED[name]
    # a final assistant turn is continued (prefill), a tool turn or empty content does not break it
    prefill = t.render([*CONVERSATION[:2], {"role": "assistant", "content": "Sure"}])
    assert prefill.endswith("Sure")
    t.render([*CONVERSATION[:2], {"role": "assistant", "content": None, "tool_calls": [{"function": {}}]},
              {"role": "tool", "content": "42"}])


def test_command_r_by_name_as_llama_servers_apply_template_test():
    msgs = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]
    assert ChatTemplate(template_for("command-r"), bos="<s>", eos="</s>").render(msgs) == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
        "<|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    assert set(NAMED) >= {"chatml", "llama3", "command-r", "gemma", "phi3"}


# ---- the real engine: /apply-template's Tokenize is the prompt the generation runs on ---------------

LOAD = LoadSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    """A scripted model with DeepSeek-R1-Distill's real template: it opens <think> in the prompt."""
    source = (REAL / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text(encoding="utf-8")
    return write_scripted(tmp_path_factory.mktemp("r1") / "r1.gguf", "deepseek-r1",
                          "Two and two.\n</think>\n\nFour.", chat_template=source)


def _generate(client, **extra) -> P.Done:
    rid = client.generate(messages=USER, sampling={"temperature": 0.0, "max_tokens": 40}, **extra)
    done = [ev for ev in client.stream(rid, timeout=60) if isinstance(ev, (P.Done, P.Error))][-1]
    assert isinstance(done, P.Done), done
    return done


def test_tokenize_renders_the_prompt_a_generation_runs_on(client, r1):
    client.load(str(r1), settings=LOAD)
    auto, off = client.tokenize(messages=USER), client.tokenize(messages=USER, think=False)
    assert auto.text.endswith("<｜Assistant｜><think>\n") and off.text.endswith("<think>\n</think>")
    ran = _generate(client)  # think unset: auto, as the Tokenize without think
    assert ran.usage["prompt_tokens"] == len(auto.tokens)
    assert (ran.reasoning, ran.text) == ("Two and two.", "Four.")  # the answer started inside <think>
    ran_off = _generate(client, think=False)
    assert ran_off.usage["prompt_tokens"] == len(off.tokens) != len(auto.tokens)
    on = client.tokenize(messages=USER, think=True)
    assert on.text == auto.text and on.tokens == auto.tokens
    bare = client.tokenize(messages=USER, think=False, add_generation_prompt=False)
    assert "<think>" not in bare.text
