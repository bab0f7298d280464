"""Drawn JSON schemas, and random walks through their grammars: every answer the grammar lets through is
JSON that validates.

Each schema is drawn (fixed seeds) from the keywords structured output enforces, nested: objects with
awkward keys (a quote, a backslash, a tab, "", é, an emoji) and additional properties, arrays and
tuples, bounded numbers, strings with lengths, patterns and formats, enums and consts, anyOf/oneOf,
allOf, $ref. A schema the checks refuse is skipped (the refusal is the answer). Each accepted one is
walked twice: the engine's GrammarConstraint picks, at every step, the best token the grammar allows
under random logits (pushed towards closing brackets and the end as the walk grows), on the tiny test
model's vocabulary. Whatever the walk writes up to the end of generation must parse and validate:
a `oneOf` is read as `anyOf` and a pattern as ECMA-262 does (ASCII \\d \\w), as docs/structured-output.md
says. An answer in which a key repeats is not validated: two additional properties may share a key (a
grammar cannot remember the keys it wrote); that a named key never repeats is tests/engine/test_grammar_utf8.py's.

Found this way: keys and constants with a backslash, newline or emoji were not JSON; a property named
"" took the root's rule; allOf wrote a key twice; \\d in a pattern was refused and `.` wrote control
characters; June 31st; an additional property could reuse a named key with a value its schema refuses.
"""
from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import llama_cpp
import numpy as np
import pytest
from jsonschema import validators

from ggufdesk.core.errors import KnownError
from ggufdesk.core.schema import SchemaError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.structured.grammar import GrammarConstraint, check_bounded, schema_to_gbnf
from tests.engine.live import Live

SCHEMAS = 400  # by hand: seeds 0-19999, three walks each: all valid (one walk of an open-ended array ran past MAX_STEPS)
WALKS = 2
MAX_STEPS = 3000
PATTERNS = ["^[a-z]+$", "^[A-Z][a-z]{0,5}$", "^\\d{3}-\\d{4}$", "^(yes|no)$", "^[0-9a-f]{2,4}$", "^a*b?c+$",
            "^\\w+@\\w+\\.com$", "^.{1,3}$", '^[^"]+$', "^(ab|cd)*$", "^\\s?[a-z]$", "^[.]$", "^é+$",
            "^\\d{4}-\\d{2}-\\d{2}$", "^[ -~]{1,5}$", "^\\S+$", "^[^a]{2}$", "^[\\u4e00-\\u9fff]{1,3}$",
            "^\\D\\W?$", "^[\\d\\s,]+$", "^\\(\\d+\\)$", "^.+$", "^[^\\\\]*$"]
KEYS = ["a", "b", "name", "x y", "é", 'q"uote', "back\\slash", "1", "", "type", "$ref", "tab\tx", "🙂"]
VALUES = ["a", "b c", 1, 2.5, None, True, "é", [1], {"k": 1}, '"q"', "", "line\nbreak", -3]


def leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["boolean", "null", "integer", "number", "string", "enum", "const", "any", "types"])
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "integer":
        s: dict[str, Any] = {"type": "integer"}
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if rng.random() < 0.35:
                s[key] = rng.choice([rng.randint(-1000, 1000), rng.randint(-5, 5), round(rng.uniform(-50, 50), 2)])
        return s
    if kind == "number":
        s = {"type": "number"}
        if rng.random() < 0.5:
            s["minimum"] = rng.choice([0, 1, 5, 100])
            if rng.random() < 0.6:
                s["maximum"] = s["minimum"] + rng.choice([0, 1, 3, 1000])
        return s
    if kind == "string":
        s, r = {"type": "string"}, rng.random()
        if r < 0.25:
            s.update({"minLength": rng.randint(0, 4)} if rng.random() < 0.7 else {})
            s.update({"maxLength": s.get("minLength", 0) + rng.randint(0, 5)} if rng.random() < 0.7 else {})
        elif r < 0.7:
            s["pattern"] = rng.choice(PATTERNS)
        elif r < 0.9:
            s["format"] = rng.choice(["date", "time", "date-time", "uuid"])
        return s
    if kind == "enum":
        return {"enum": rng.sample(VALUES, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(VALUES + [{"a": [1, "b"]}])}
    if kind == "any":
        return rng.choice([{}, {"description": "anything"}])
    return {"type": rng.sample(["string", "null", "integer", "boolean", "number"], 2)}


def draw(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    if depth >= 3 or rng.random() < 0.45:
        return leaf(rng)
    kind = rng.choice(["object", "object", "array", "tuple", "anyOf", "oneOf", "allOf"])
    if kind == "object":
        keys = rng.sample(KEYS, rng.randint(0, 4))
        s: dict[str, Any] = {"type": "object", "properties": {k: draw(rng, depth + 1) for k in keys}}
        if keys and rng.random() < 0.6:
            s["required"] = rng.sample(keys, rng.randint(1, len(keys)))
        r = rng.random()
        s.update({"additionalProperties": False} if r < 0.3 else {"additionalProperties": draw(rng, depth + 1)}
                 if r < 0.45 else {"additionalProperties": True} if r < 0.55 else {})
        return s
    if kind == "array":
        s = {"type": "array", "items": draw(rng, depth + 1)}
        s.update({"minItems": rng.randint(0, 3)} if rng.random() < 0.5 else {})
        s.update({"maxItems": s.get("minItems", 0) + rng.randint(0, 3)} if rng.random() < 0.5 else {})
        return s
    if kind == "tuple":
        return {"type": "array", "prefixItems": [draw(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    if kind in ("anyOf", "oneOf"):
        return {kind: [draw(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    parts = []
    for _ in range(rng.randint(1, 3)):
        keys = rng.sample(KEYS, rng.randint(1, 3))
        part: dict[str, Any] = {"type": "object", "properties": {k: draw(rng, depth + 2) for k in keys}}
        part.update({"required": keys[:1]} if rng.random() < 0.5 else {})
        parts.append(part)
    return {"allOf": parts}


def drawn_schema(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    s = draw(rng)
    if rng.random() < 0.2:
        s = {"$defs": {"thing": draw(rng, 1)}, "type": "object", "required": ["t"],
             "properties": {"t": {"$ref": "#/$defs/thing"}, "u": {"type": "array", "items": {"$ref": "#/$defs/thing"}}}}
    return s


def as_any_of(s: Any) -> Any:
    if isinstance(s, dict):
        return {("anyOf" if k == "oneOf" else k): v if k in ("const", "enum") else as_any_of(v) for k, v in s.items()}
    return [as_any_of(v) for v in s] if isinstance(s, list) else s


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not re.search(pattern, instance, re.ASCII):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


Ecma = validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})
FORMATS = jsonschema.FormatChecker(["date", "uuid"])
TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"  # RFC 3339 full-time


# (jsonschema checks `time` and `date-time` as RFC 3339 only with rfc3339-validator installed)
@FORMATS.checks("time")
def _time(value: object) -> bool:
    return not isinstance(value, str) or bool(re.fullmatch(TIME, value))


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    date, _, time = value.partition("T")
    return FORMATS.conforms(date, "date") and bool(re.fullmatch(TIME, time))


@pytest.fixture(scope="module")
def live(tiny_model):
    lv = Live(tiny_model, LoadSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1))
    yield lv
    lv.close()


def walk(live: Live, c: GrammarConstraint, rng: np.random.Generator, *, closers: bytes = b'"}],',
         prefix: bytes = b"") -> bytes:
    """A random answer the grammar allows, to the end of generation: the best allowed token under random
    logits, those holding a byte of `closers` and the end pushed up as the walk grows (`prefix`: bytes
    taken first, one a token, as a lazy grammar's marker). Frees the constraint."""
    lm, pieces = live.lm, [live.vocab.piece(t) for t in range(live.lm.n_vocab)]
    pushed = np.array([t for t, p in enumerate(pieces) if p and any(c in p for c in closers)])
    eos = llama_cpp.llama_vocab_eos(lm.vocab)
    out = []
    try:
        for b in prefix:
            t = next(t for t, p in enumerate(pieces) if p == bytes([b]))
            c.accept(t)
            out.append(pieces[t])
        for step in range(MAX_STEPS):
            logits = rng.standard_normal(lm.n_vocab).astype(np.float32) * 2
            logits[pushed] += step / 15.0
            logits[eos] += step / 10.0
            t = c.sample(logits, None)
            if llama_cpp.llama_vocab_is_eog(lm.vocab, t):
                return b"".join(out)
            out.append(pieces[t])
        raise AssertionError(f"no end after {MAX_STEPS} tokens: {b''.join(out)[:200]!r}")
    finally:
        c.close()


@pytest.mark.parametrize("seed", range(SCHEMAS))
def test_every_walk_through_a_drawn_schema_s_grammar_validates(live, seed):
    schema = drawn_schema(seed)
    try:
        gbnf = check_bounded(schema_to_gbnf(schema))
    except SchemaError:
        return  # refused by name: what a request with it is told
    validator = Ecma(as_any_of(schema), format_checker=FORMATS)
    rng = np.random.default_rng(seed)
    for _ in range(WALKS):
        try:
            raw = walk(live, GrammarConstraint(live.lm.vocab, live.lm.n_vocab, gbnf, piece=live.vocab.piece), rng)
        except KnownError as e:  # the grammar led somewhere no token can leave
            raise AssertionError(f"{e}: {json.dumps(schema)}") from None
        repeated: list[str] = []
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=lambda kv, seen=repeated: _pairs(kv, seen))
        if not repeated:  # (a repeated additional key: which value counts is the reader's choice)
            validator.validate(value)


def _pairs(kv: list[tuple[str, Any]], repeated: list[str]) -> dict[str, Any]:
    keys = [k for k, _ in kv]
    repeated.extend(k for k in set(keys) if keys.count(k) > 1)
    return dict(kv)


def _parts(node: Any) -> Any:
    """Every keyword, property name, pattern, format and const in a schema."""
    if isinstance(node, list):
        for x in node:
            yield from _parts(x)
    elif isinstance(node, dict):
        for k, v in node.items():
            yield k
            if k in ("pattern", "format", "const") and not isinstance(v, (dict, list)):
                yield (k, v)
            if k == "properties":
                yield from (("key", name) for name in v)
            if k not in ("const", "enum"):
                yield from _parts(v)


def test_the_draws_reach_what_they_are_for():
    schemas = [drawn_schema(s) for s in range(SCHEMAS)]
    seen = {p for s in schemas for p in _parts(s)}
    assert {"allOf", "oneOf", "anyOf", "$ref", "prefixItems", "additionalProperties", "exclusiveMinimum"} <= seen
    assert {("key", k) for k in KEYS} <= seen and ("const", "line\nbreak") in seen
    assert {("format", f) for f in ("date", "time", "date-time", "uuid")} <= seen
    assert len({v for k, v in (p for p in seen if isinstance(p, tuple)) if k == "pattern"}) >= len(PATTERNS) - 3
    accepted = 0
    for s in schemas:
        try:
            schema_to_gbnf(s)
            accepted += 1
        except SchemaError:
            pass
    assert accepted > SCHEMAS * 2 // 3
