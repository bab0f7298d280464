"""Structured output through the real engine on tiny random-weight models: a random model writes
valid JSON only because the grammar makes it, so every output validating proves the constraint."""
from __future__ import annotations

import json

import jsonschema
import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link.client import EngineClient
from tests.engine.helpers import collect, greedy
from tests.fixtures import ggufs
from tests.fixtures.schemas import SCHEMAS, UNSUPPORTED

LOAD = LoadSettings(n_ctx=4096, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)


def _validate(text: str, schema: dict) -> object:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_every_schema_validates_greedy(engine, name, schema):
    r = collect(engine, engine.generate(prompt="the cat", sampling=greedy(400), json_schema=schema))
    assert r.error is None, r.error
    assert r.done.finish_reason == "stop", (name, r.text)
    _validate(r.text, schema)


@pytest.fixture(scope="module")
def lookup_engine(tiny_model):
    from ggufdesk.core.settings import SpeculationSettings

    client = EngineClient(auto_restart=True)
    client.start()
    client.load(str(tiny_model), settings=LOAD, speculation=SpeculationSettings(mode="lookup", adaptive=False, k_max=8))
    yield client
    client.shutdown()


@pytest.mark.parametrize("name,schema", SCHEMAS[::4], ids=[n for n, _ in SCHEMAS[::4]])
def test_prompt_lookup_drafts_under_a_grammar_and_the_answer_is_plain_decodings(lookup_engine, name, schema):
    """A constrained request speculates too (it ran without before): the second time the same request
    comes, lookup drafts from the first answer (the conversation's n-grams), and the answer is the
    same; speculation off gives it as well."""
    def ask(**spec):
        return collect(lookup_engine, lookup_engine.generate(prompt="the cat", sampling=greedy(400),
                                                             json_schema=schema, speculation=spec or None))

    off = ask(mode="off")
    first, second = ask(), ask()
    assert off.error is None and off.done.finish_reason == "stop", (name, off.error, off.text)
    _validate(off.text, schema)
    assert first.text == second.text == off.text, name
    assert second.stats.speculation.startswith("lookup"), second.stats
    assert second.stats.accepted > 0, second.stats


def test_sampled_outputs_validate_too(engine):
    for seed, (name, schema) in enumerate(SCHEMAS[::5]):
        r = collect(engine, engine.generate(
            prompt="a dog", json_schema=schema,
            sampling={"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed,
                      "max_tokens": 400}))
        assert r.done is not None and r.done.finish_reason == "stop", (name, r.error, r.text)
        _validate(r.text, schema)


def test_grammar_and_json_object_requests(engine):
    r = collect(engine, engine.generate(prompt="x", sampling=greedy(20),
                                        grammar='root ::= ("yes" | "no") "."'))
    assert r.text in ("yes.", "no.") and r.done.finish_reason == "stop"


@pytest.mark.parametrize("schema,word", UNSUPPORTED[:6], ids=[w for _, w in UNSUPPORTED[:6]])
def test_unsupported_schema_is_a_clear_error_and_the_engine_lives(engine, schema, word):
    r = collect(engine, engine.generate(prompt="x", sampling=greedy(5), json_schema=schema))
    assert r.error is not None and r.error.kind == "schema" and word in r.error.message
    ok = collect(engine, engine.generate(prompt="x", sampling=greedy(3)))
    assert ok.error is None and ok.done.finish_reason == "length"


def test_bad_requests_are_refused(engine):
    for kw, msg in [({"grammar": "not a grammar"}, "root"),
                    ({"json_schema": {"type": "boolean"}, "grammar": "root ::= \"a\""}, "one of"),
                    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "chat request")]:
        r = collect(engine, engine.generate(prompt="x", sampling=greedy(5), **kw))
        assert r.error is not None and msg in r.error.message, r.error


# ---- tools ------------------------------------------------------------------------------------

# Minimal templates that render `tools`, calls and tool results the way each family's real one does.
def _loop(call: str, result: str) -> str:
    return ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}"
            "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}" + call + "{% endfor %}{% endif %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


TEMPLATES = {
    "hermes": ("{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}"
               "{% endfor %}</tools>\nCall with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>"
               "<|im_end|>\n{% endif %}"
               + _loop("<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
                       "{{ c['function']['arguments'] }}}\n</tool_call>", "")),
    "llama3": ("{% if tools %}Environment: ipython\n{% for t in tools %}{{ t | tojson }}{% endfor %}"
               "\nRespond with {\"name\": function name, \"parameters\": dictionary}.\n{% endif %}"
               + _loop("<|python_tag|>{\"name\": \"{{ c['function']['name'] }}\", \"parameters\": "
                       "{{ c['function']['arguments'] }}}", "")),
    "mistral": ("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                "{% for m in messages %}{% if m['tool_calls'] %}[TOOL_CALLS]{{ m['tool_calls'] | tojson }}"
                "{% elif m['role'] == 'tool' %}[TOOL_RESULTS]{{ m['content'] }}[/TOOL_RESULTS]"
                "{% else %}[INST]{{ m['content'] }}[/INST]{% endif %}{% endfor %}"),
    "generic": ggufs.CHATML_TEMPLATE,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
        "required": ["hour"]}}},
]


@pytest.fixture(scope="module", params=list(TEMPLATES))
def tool_engine(request, model_dir):
    fmt = request.param
    path = ggufs.write_tiny_llama(model_dir / f"tiny-tools-{fmt}.gguf",
                                  ggufs.TinySpec(seed=3, chat_template=TEMPLATES[fmt]))
    client = EngineClient(auto_restart=True)
    client.start()
    client.load(str(path), settings=LOAD)
    yield fmt, client
    client.shutdown()


@pytest.mark.parametrize("choice", ["required", "get_weather", "set_alarm"])
def test_forced_tool_calls_round_trip(tool_engine, choice):
    fmt, engine = tool_engine
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    r = collect(engine, engine.generate(
        messages=[{"role": "user", "content": "weather in oslo?"}], sampling=greedy(1500),
        tools=TOOLS, tool_choice=tool_choice))
    assert r.error is None, r.error
    assert r.done.finish_reason == "tool_calls", (fmt, r.text)
    assert r.done.tool_calls, (fmt, r.text)
    assert choice == "required" or len(r.done.tool_calls) == 1  # one call unless parallel ones are asked for
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in r.done.tool_calls:
        name = call["function"]["name"]
        assert choice == "required" or name == choice
        jsonschema.validate(json.loads(call["function"]["arguments"]), by_name[name])


def test_tool_none_is_plain_text_and_history_with_tool_results_renders(tool_engine):
    fmt, engine = tool_engine
    r = collect(engine, engine.generate(messages=[{"role": "user", "content": "hi"}], sampling=greedy(8),
                                        tools=TOOLS, tool_choice="none"))
    assert r.error is None and r.done.tool_calls == []
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
    ]
    r = collect(engine, engine.generate(messages=history, sampling=greedy(8), tools=TOOLS))
    assert r.error is None, r.error


def test_auto_tool_choice_lets_the_model_answer_in_text(tool_engine):
    fmt, engine = tool_engine
    r = collect(engine, engine.generate(messages=[{"role": "user", "content": "hello"}], sampling=greedy(30),
                                        tools=TOOLS, tool_choice="auto"))
    assert r.error is None and r.done is not None
    # a random model does not open a call by itself: the text comes back untouched
    assert r.done.finish_reason in ("stop", "length") and r.done.tool_calls == []


def test_the_windows_tool_choice_setting_forces_the_named_tool(tool_engine):
    """The conversation's settings (no tools in the request): tool_choice reaches the engine."""
    fmt, engine = tool_engine
    sampling = greedy(1500, structured=json.dumps(TOOLS), tool_choice="set_alarm")
    r = collect(engine, engine.generate(messages=[{"role": "user", "content": "weather in oslo?"}],
                                        sampling=sampling))
    assert r.error is None and r.done.finish_reason == "tool_calls", (fmt, r.text)
    assert [c["function"]["name"] for c in r.done.tool_calls] == ["set_alarm"]
