"""The tool sets real agent clients send (recorded in tests/fixtures/clients/) become tool-call grammars."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggufdesk.engine.structured.request import plan
from tests.fixtures import ggufs

CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


def claude_code_tools() -> list[dict]:
    body = json.loads((CLIENTS / "claude_code_2.1.197_main.json").read_text())
    return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["input_schema"]}} for t in body["tools"]]


@pytest.mark.parametrize("template", [None, ggufs.CHATML_TEMPLATE])
def test_claude_codes_24_tools_plan_into_a_grammar(template):
    tools = claude_code_tools()
    assert len(tools) >= 24
    st = plan(tools=tools, tool_choice="auto", template_source=template, chat=True)
    assert st.gbnf and st.marker == "<tool_call>" and len(st.tools) == len(tools)
    assert "Workflow" in st.gbnf  # the tool whose `args` takes any JSON value


def test_codexs_function_tools_plan_into_a_grammar():
    body = json.loads((CLIENTS / "codex_0.171.0_exec.json").read_text())
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t["parameters"]}}
             for t in body["tools"] if t["type"] == "function"]
    st = plan(tools=tools, tool_choice="auto", template_source=None, chat=True)
    assert st.gbnf and len(st.tools) == len(tools) >= 7


def test_claude_codes_tools_make_a_grammar_llama_cpp_takes(tiny_model):
    """Its Workflow tool says `maxLength: 524288`: expanded, that grammar crashed llama.cpp's parser
    (SIGSEGV); tool parameters leave bounds above MAX_REPEAT unenforced instead (core/schema.relax_bounds)."""
    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.batching.vocab import Vocab
    from ggufdesk.engine.runtime.native import LlamaLog, load_model

    lm = load_model(str(tiny_model), LoadSettings(n_ctx=256, n_threads=1, n_threads_batch=1), LlamaLog())
    try:
        vocab = Vocab(lm)
        st = plan(tools=claude_code_tools(), tool_choice="auto", template_source=None, chat=True)
        c = st.constraint(lm.vocab, lm.n_vocab, piece=vocab.piece, tokenize=lambda t: vocab.tokenize(t, add_bos=False))
        assert c is not None
        c.close()
    finally:
        lm.close()


def test_a_response_schema_bound_too_large_for_a_grammar_is_refused_but_a_tools_is_left_out():
    from ggufdesk.core.schema import MAX_REPEAT, SchemaError
    from ggufdesk.core.tools import check_tools
    from ggufdesk.engine.structured.grammar import schema_to_gbnf

    assert schema_to_gbnf({"type": "string", "maxLength": MAX_REPEAT})
    with pytest.raises(SchemaError, match="more than this server can enforce"):
        schema_to_gbnf({"type": "array", "items": {"type": "string"}, "maxItems": MAX_REPEAT + 1})
    tool = {"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 524288, "minLength": 1}}}}}
    params = check_tools([tool])[0]["function"]["parameters"]
    assert params["properties"]["s"] == {"type": "string", "minLength": 1}
