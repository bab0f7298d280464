"""The grammar's stack growth is measured on a probe and an exploding grammar is refused before llama.cpp sees it
(issue 34, finding 3); every grammar the structured-output tests use passes, with room to spare."""
from __future__ import annotations

import pytest

from ggufdesk.core import tools as T
from ggufdesk.core.schema import SchemaError, json_object_schema
from ggufdesk.engine.structured import bounds as B
from ggufdesk.engine.structured.grammar import check_bounded, schema_to_gbnf, tool_grammar
from ggufdesk.engine.structured.request import plan
from tests.fixtures.schemas import SCHEMAS


def pattern(p: str) -> str:
    return schema_to_gbnf({"type": "string", "pattern": p})


@pytest.mark.parametrize("name,schema", SCHEMAS + [("json_object", json_object_schema())],
                         ids=[n for n, _ in SCHEMAS] + ["json_object"])
def test_every_test_schema_passes_with_few_stacks(name, schema):
    assert B.stack_peak(schema_to_gbnf(schema)) <= 40


def test_a_tool_grammar_for_many_tools_passes():
    tools = [{"type": "function", "function": {"name": f"tool{i}", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "integer", "minimum": 0},
                                         "tags": {"type": "array", "items": {"enum": ["x", "y"]}}},
        "required": ["a"]}}} for i in range(24)]
    tg = tool_grammar(T.check_tools(tools), T.GENERIC, "required", parallel=True)
    assert B.stack_peak(tg.gbnf) < B.MAX_STACKS // 2


@pytest.mark.parametrize("p", ["^((a?){0,30}){0,30}$", "^([ab]?[ab]?){0,40}$", "^(a?){0,60}(a?){0,60}$",
                               "^((a?){0,10}){0,10}$"])
def test_exploding_patterns_are_refused_as_schema_errors(p):
    with pytest.raises(SchemaError, match="grammar"):
        check_bounded(pattern(p))
    with pytest.raises(SchemaError, match="grammar"):
        plan(json_schema={"type": "string", "pattern": p}, template_source=None, chat=True)


def test_the_count_follows_llama_cpp_for_small_grammars():
    assert B.stack_peak('root ::= "a" | "b"') == 2
    assert B.stack_peak('root ::= "a"') == 1
    # "a": the second x (two ways) or the second "a" of the first; "aa": four ways, the end among them
    assert B.stack_peak('root ::= x x\nx ::= "a" | "a" "a"') == 4
    assert B.stack_peak('root ::= [a-c]{2,4}') == 2  # after two: the end, or a third
    # (a?){0,n}: after k a's the text can be read in about n ways
    assert 3 <= B.stack_peak('root ::= ("a"?){0,6}') <= 8


def test_the_probe_reads_what_the_converter_writes():
    g = B.parse_gbnf('root ::= "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4}) space # comment\nspace ::= | " " | "\\n" [ \\t]{0,20}')
    assert len(g.rules) > 3


@pytest.mark.parametrize("bad", ['root ::= "\\q"', "root ::= undefined", 'x ::= "a"', 'root ::= ("a"', "root ::= <[12]>"])
def test_unreadable_grammars_are_refused_plainly(bad):
    with pytest.raises(B.GrammarTooComplex, match="cannot read"):
        B.stack_peak(bad)


def test_deep_nesting_does_not_recurse():
    deep = "root ::= " + "(" * 5000 + '"a"' + ")" * 5000
    assert B.stack_peak(deep) == 1


def test_the_probe_itself_is_bounded():
    with pytest.raises(B.GrammarTooComplex, match="too complex to check"):
        B.stack_peak(pattern("^(a?){0,60}(a?){0,60}$"), budget=1000, max_stacks=10**6)
