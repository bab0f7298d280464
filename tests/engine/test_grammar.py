"""JSON schema -> GBNF: the integer ranges we add to llama-cpp-python's converter are exact."""
from __future__ import annotations

import re

import pytest

from ggufdesk.core.schema import SchemaError
from ggufdesk.engine.structured.grammar import int_range_gbnf, schema_to_gbnf, tool_grammar
from ggufdesk.core import tools as T


def _as_regex(gbnf: str) -> re.Pattern:
    """Our range expressions use only "literals", [a-b] classes, groups, | and juxtaposition."""
    out = []
    for tok in re.findall(r'"[^"]*"|\[[^\]]*\]|[()|]|\s+', gbnf):
        if tok.startswith('"'):
            out.append(re.escape(tok[1:-1]))
        elif not tok.isspace():
            out.append(tok)
    return re.compile("".join(out))


@pytest.mark.parametrize("lo,hi", [(0, 9), (10, 99), (7, 1234), (-50, -3), (-12, 305), (0, 0),
                                   (1, 1), (99, 101), (-1, 1), (190, 2010), (None, 5), (1000, None),
                                   (None, -7), (-3, None)])
def test_integer_ranges_match_exactly(lo, hi):
    rx = _as_regex(int_range_gbnf(lo, hi))
    window = range((lo if lo is not None else (hi or 0) - 3000) - 300,
                   (hi if hi is not None else (lo or 0) + 3000) + 300)
    for n in window:
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(rx.fullmatch(str(n))) == inside, (lo, hi, n)
    # no leading zeros, no "-0"
    assert not rx.fullmatch("007") and not rx.fullmatch("-0")


def test_unbounded_integers_are_bounded_in_length():
    rx = _as_regex(int_range_gbnf(0, None))
    assert rx.fullmatch("9" * 16) and not rx.fullmatch("1" + "0" * 16)


def test_converter_errors_are_schema_errors():
    for pattern in ("ab", "^a$b"):  # not anchored: the converter refuses
        with pytest.raises(SchemaError, match="cannot be turned into a grammar"):
            schema_to_gbnf({"type": "string", "pattern": pattern})
    for pattern, word in (("(?<=a)b", "lookarounds"), ("^(?:ab)+$", "groups"), ("^(a)\\1$", "backreferences")):
        with pytest.raises(SchemaError, match=word):  # refused by name before the converter
            schema_to_gbnf({"type": "string", "pattern": pattern})
    assert "root ::=" in schema_to_gbnf({"type": "integer", "minimum": 3, "maximum": 5})


def test_tool_grammar_wraps_calls_in_the_format():
    tools = T.check_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 3}},
        "required": ["x"]}}}])
    g = tool_grammar(tools, T.HERMES, "required")
    assert g.gbnf.startswith("root ::= tc") and '"<tool_call>"' in g.gbnf and not g.lazy
    assert "call ::=" in g.gbnf and "\nroot ::=" not in g.gbnf.split("\n", 1)[1]
    assert tool_grammar(tools, T.MISTRAL, "auto").lazy


def test_qwen3_coder_values_follow_their_schema():
    """A plain string is raw text, a string enum its words (raw too), anything else the JSON of its
    own rule; the required parameters come first, in the schema's order, then the optional ones."""
    from ggufdesk.engine.structured.grammar import check_bounded

    tools = T.check_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": ["n", "s"], "properties": {
            "mode": {"enum": ["fast", "slow"]}, "s": {"type": "string"}, "tag": {"type": "string", "pattern": "^[a-z]+$"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9}}}}},
        {"type": "function", "function": {"name": "g"}}])
    g = tool_grammar(tools, T.QWEN3_CODER, "required", parallel=True).gbnf
    assert check_bounded(g) == g
    assert g.startswith("root ::= tc (nl tc){0,3}\n")
    body = ('"<function=f>" nl ("<parameter=s>" nl xml-text nl "</parameter>" nl) '
            '("<parameter=n>" nl v0-3 nl "</parameter>" nl) '
            '("<parameter=mode>" nl ("fast" | "slow") nl "</parameter>" nl | '
            '"<parameter=tag>" nl v0-2 nl "</parameter>" nl)* "</function>"')
    assert body in g and '"<function=g>" nl  "</function>"' in g
    assert re.search(r"^v0-3 ::= ", g, re.M) and re.search(r"^v0-2 ::= ", g, re.M)
    assert not re.search(r"^v0-[01] ::= ", g, re.M)  # the raw-text values need no JSON rule


def test_a_tool_whose_schema_cannot_be_enforced_is_offered_without_a_grammar_for_its_arguments():
    from ggufdesk.engine.structured.request import plan

    strict = {"type": "function", "function": {"name": "tags", "parameters": {
        "type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}}}}
    plain = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
    with pytest.raises(SchemaError, match="uniqueItems"):
        plan(tools=[strict, plain], template_source=None, chat=True)
    st = plan(tools=[strict, plain], tools_without_grammar=["tags"], template_source=None, chat=True)
    assert st.tools[0]["function"]["parameters"]["properties"]["t"]["uniqueItems"] is True  # shown as it is
    assert "uniqueItems" not in st.gbnf and '"\\"x\\""' in st.gbnf  # f's arguments are still enforced
    assert st.marker == "<tool_call>"


def test_literals_are_json_in_the_answer():
    """Keys, enum values and constants: JSON's escapes stay JSON (a GBNF literal escapes its backslashes),
    characters are written as they are, and a lone surrogate (which JSON allows) keeps its escape."""
    g = schema_to_gbnf({"type": "object", "required": ["a\\b"], "properties": {
        "a\\b": {"const": "line\nbreak \"q\""}, "é": {"enum": ["café", "🙂", "\ud800"]}}})
    assert r'"\"a\\\\b\""' in g and r'"\"line\\nbreak \\\"q\\\"\""' in g
    assert r'"\"café\"" | "\"🙂\"" | "\"\\ud800\""' in g


def test_a_property_named_empty_is_not_the_root():
    g = schema_to_gbnf({"type": "object", "properties": {"": {"type": "boolean"}}, "required": [""]})
    assert g.splitlines()[[r.split(" ::=")[0] for r in g.splitlines()].index("root")].startswith('root ::= "{"')


def test_allof_holds_every_part_and_the_node_s_own_properties_each_once():
    g = schema_to_gbnf({"type": "object", "properties": {"id": {"type": "boolean"}}, "required": ["id"],
                        "allOf": [{"properties": {"name": {"type": "null"}, "id": {"type": "boolean",
                                                                                  "title": "again"}}}]})
    root = next(r for r in g.splitlines() if r.startswith("root ::="))
    assert root.count("id-kv") == 1 and root.count("name-kv") == 1
    with pytest.raises(SchemaError, match="two ways"):
        schema_to_gbnf({"allOf": [{"properties": {"a": {"type": "integer"}}},
                                  {"properties": {"a": {"type": "string"}}}]})


@pytest.mark.parametrize("pattern,cls", [
    (r"^\d{3}$", r"[\x30-\x39]"), (r"^\w+$", r"[\x30-\x39\x41-\x5A\x5F\x61-\x7A]"), (r"^a\.b$", r"[\x2E]"),
    (r"^[ -~]+$", r"[\x20-\x21\x23-\x5B\x5D-\x7E]"), (r'^[^"]+$', r"[^\x22\x00-\x1F\x22\x5C\x7F]"),
    (r"^[\u4e00-\u9fff]+$", r"[\u4E00-\u9FFF]"), (r"^\S$", r"[^\x20\xA0\u1680\u2000-\u200A"),
    (r"^[^\s,]$", r"[^\x20\xA0\u1680\u2000-\u200A"),
])
def test_pattern_escapes_and_classes_become_json_string_content(pattern, cls):
    """Escapes reached llama.cpp as unknown GBNF escapes (every pattern with \\d was refused), and
    classes and `.` let the answer write a raw quote, backslash or newline inside its string."""
    g = schema_to_gbnf({"type": "string", "pattern": pattern})
    assert cls in g
    assert r'dot ::= [^"\\\x7F\x00-\x1F]' in schema_to_gbnf({"type": "string", "pattern": "^.$"})


@pytest.mark.parametrize("pattern,word", [(r"^a\bc$", r"\b"), (r'^"$', "escaped"), (r"^\n$", "escaped"),
                                          (r"^[\D]$", "inside a class"), (r"^\p{L}$", r"\p")])
def test_patterns_a_json_string_cannot_hold_are_refused_by_name(pattern, word):
    with pytest.raises(SchemaError, match=re.escape(word)):
        schema_to_gbnf({"type": "string", "pattern": pattern})


def test_the_date_format_is_a_calendar_date():
    """Upstream's date let every month have 31 days, February 30 and the year 0000; now each month has
    its days and February 29 only leap years (a validator's date check reads every answer)."""
    import datetime

    from ggufdesk.engine.structured.grammar import _DATE

    rx = _as_regex(_DATE.content)
    years = [*range(0, 9), *range(96, 105), *range(396, 405), *range(1896, 1905), *range(1996, 2005), 2100, 9999]
    for y, m, d in ((y, m, d) for y in years for m in range(14) for d in range(33)):
        text = f"{y:04d}-{m:02d}-{d:02d}"
        try:
            valid = bool(datetime.date.fromisoformat(text))
        except ValueError:
            valid = False
        assert bool(rx.fullmatch(text)) == valid, text
    assert "date ::= ([1-9]" in schema_to_gbnf({"type": "string", "format": "date-time"})


def test_an_additional_property_s_key_is_none_of_the_named_ones():
    """Upstream's key for additional properties was any string, so an answer could write a named key
    again, with a value its own schema refuses; now it is any other key (written without escapes)."""
    from ggufdesk.engine.structured.grammar import _other_key

    rule = _other_key(["a", "ab", "", 'q"'])
    body = rule.removeprefix('"\\"" ').removesuffix(' "\\"" space')
    rx = re.compile("".join(t if not t.isspace() else "" for t in re.findall(r"\[[^\]]*\]|[()|?*]|\s+", body)))
    for key, other in (("a", False), ("ab", False), ("", False), ("abc", True), ("b", True), ("aa", True),
                       ("x y", True), ("q", True), ("é", True), ('q"', False), ("a\\b", False)):
        assert bool(rx.fullmatch(key)) == other, key
    g = schema_to_gbnf({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True})
    assert "additional-kv ::= additional-key " in g
