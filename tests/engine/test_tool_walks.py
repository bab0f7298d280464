"""Drawn tools, in every call format, and random walks through their grammars: the format's reader
finds every call the grammar lets through, names a tool offered, and the arguments validate.

The tools' parameters are drawn as in tests/engine/test_schema_walks.py (awkward keys, patterns,
formats, nested objects, additional properties); a format, `required` or one named tool, one call or
parallel ones. The walk writes what the grammar allows (from its marker, for harmony's lazy grammar)
and core/toolcalls.py reads it back.

Found this way: Qwen3-Coder's XML read a string with a pattern or a format, and a mixed enum, as raw
text where the grammar had written JSON; an XML parameter named "" was not read; harmony let "json"
follow the function's name with no space, which then read as part of the name; and the upstream
converter's objects with optional properties and additional ones glued the next key on without a comma.
"""
from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from ggufdesk.core import tools as T
from ggufdesk.core.schema import SchemaError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.structured.grammar import check_bounded, tool_grammar
from ggufdesk.engine.structured.request import Structured
from tests.engine import test_schema_walks as W
from tests.engine.live import Live

CASES = 240  # by hand: seeds 0-5999, every call read and valid
NAMES = ["get_weather", "search", "f", "run_cmd", "a.b", "x-y"]


def drawn_tools(rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for name in rng.sample(NAMES, rng.randint(1, 3)):
        params = W.draw(rng, 1)
        if params.get("type") != "object" or rng.random() < 0.3:
            keys = rng.sample(W.KEYS, rng.randint(0, 3))
            params = {"type": "object", "properties": {k: W.draw(rng, 2) for k in keys}}
            params.update({"required": keys[:rng.randint(1, len(keys))]} if keys and rng.random() < 0.6 else {})
        out.append({"type": "function", "function": {"name": name, "parameters": params}})
    return out


@pytest.fixture(scope="module")
def live(tiny_model):
    lv = Live(tiny_model, LoadSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1))
    yield lv
    lv.close()


def walk(live: Live, st: Structured, rng: np.random.Generator) -> str:
    vocab = live.vocab
    c = st.constraint(live.lm.vocab, live.lm.n_vocab, piece=vocab.piece,
                      tokenize=lambda t: vocab.tokenize(t, add_bos=False))
    assert c is not None
    # (a lazy grammar waits for its marker; raw XML text ends at "</")
    return W.walk(live, c, rng, closers=b'"}],</', prefix=(st.marker or "").encode()).decode("utf-8")


@pytest.mark.parametrize("seed", range(CASES))
def test_every_call_a_tool_grammar_lets_through_is_read_and_valid(live, seed):
    rng = random.Random(seed)
    tools = drawn_tools(rng)
    fmt = T.FORMATS[rng.choice(sorted(T.FORMATS))]
    parallel = rng.random() < 0.5
    choice = rng.choice(["required", {"type": "function", "function": {"name": tools[0]["function"]["name"]}}])
    try:
        chosen, mode = T.pick_tools(T.check_tools(tools), choice)
        tg = tool_grammar(chosen, fmt, mode, parallel=parallel)
        st = Structured(gbnf=check_bounded(tg.gbnf), marker=tg.marker if tg.lazy else None, tools=chosen, fmt=fmt,
                        mode=mode)
    except SchemaError:
        return  # refused by name
    text = walk(live, st, np.random.default_rng(seed))
    parsed = st.parse(text)
    assert parsed.calls and not parsed.warnings, (fmt.name, text)
    assert len(parsed.calls) == 1 or parallel, (fmt.name, text)
    params = {t["function"]["name"]: t["function"]["parameters"] for t in chosen}
    for call in parsed.calls:
        name = call["function"]["name"]
        assert name in params, (fmt.name, text)
        W.Ecma(W.as_any_of(params[name]), format_checker=W.FORMATS).validate(json.loads(call["function"]["arguments"]))


def test_the_draws_use_every_format():
    formats = set()
    for seed in range(CASES):
        rng = random.Random(seed)
        drawn_tools(rng)
        formats.add(rng.choice(sorted(T.FORMATS)))
    assert formats == set(T.FORMATS)


def test_what_the_walks_found_stays_fixed(live):
    from ggufdesk.core.toolcalls import parse
    from tests.engine.test_grammar_utf8 import takes

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "": {"type": "string"}, "p": {"type": "string", "pattern": "^a+$"}, "e": {"enum": [2.5, "a", ""]}}}}}
    xml = '<tool_call>\n<function=f>\n<parameter=>\nhi\n</parameter>\n<parameter=p>\n"aa"\n</parameter>\n' \
          '<parameter=e>\n""\n</parameter>\n</function>\n</tool_call>'
    assert takes(live, tool_grammar([tool], T.QWEN3_CODER, "required").gbnf, xml)
    call = parse(xml, T.QWEN3_CODER, [tool]).calls[0]
    assert json.loads(call["function"]["arguments"]) == {"": "hi", "p": "aa", "e": ""}
    harmony = tool_grammar([tool], T.HARMONY, "required").gbnf
    assert takes(live, harmony, 'to=functions.f <|constrain|>json<|message|>{}')
    assert not takes(live, harmony, 'to=functions.fjson<|message|>{}')
