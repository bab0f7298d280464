"""Grammar-constrained sampling: JSON schema -> GBNF (llama-cpp-python's converter, plus integer
ranges it lacks) and llama.cpp's grammar sampler, checked on the sampled token first.

Why check first: applying a grammar to Gemma's 262k-token vocabulary costs tens of milliseconds
per token (naive constrained sampling through the high-level API ran at 0.23x on the starter).
llama.cpp's common sampler samples unconstrained, asks the grammar about that one token, and only
when it is rejected applies the grammar to the whole vocabulary and samples again. The result is
the same distribution: a token the grammar allows has the same logit with and without the grammar.
"""
from __future__ import annotations

import codecs
import ctypes
import itertools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import llama_cpp
import numpy as np
from llama_cpp import llama_grammar

from ggufdesk.core import schema as S
from ggufdesk.core import tools as T
from ggufdesk.core.tools import ToolFormat
from ggufdesk.core.errors import KnownError
from ggufdesk.engine.link import protocol as P

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


# ---- JSON schema -> GBNF ----------------------------------------------------------------------


def _digits_range(lo: str, hi: str) -> str:
    """GBNF for the decimal strings of equal length from lo to hi (inclusive), digit by digit."""
    if lo == hi:
        return f'"{lo}"'
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    n = len(lo) - 1
    if lo[0] == hi[0]:
        return f'"{lo[0]}" ({_digits_range(lo[1:], hi[1:])})'
    alts = []
    a, b = int(lo[0]), int(hi[0])
    if lo[1:] == "0" * n:
        a -= 1  # lo's whole first-digit block is full: fold it into the middle
    else:
        alts.append(f'"{lo[0]}" ({_digits_range(lo[1:], "9" * n)})')
    if hi[1:] == "9" * n:
        b += 1
        tail_hi = None
    else:
        tail_hi = f'"{hi[0]}" ({_digits_range("0" * n, hi[1:])})'
    if b - a > 1:
        first = f'"{a + 1}"' if b - a == 2 else f"[{a + 1}-{b - 1}]"
        alts.append(first + " [0-9]" * n)
    if tail_hi:
        alts.append(tail_hi)
    return " | ".join(f"({x})" for x in alts)


def _nonneg_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the integers lo..hi (hi None: up to INT_DIGITS digits), no leading zeros."""
    alts = []
    max_digits = len(str(hi)) if hi is not None else S.INT_DIGITS
    for d in range(len(str(lo)), max_digits + 1):
        a = max(lo, 10 ** (d - 1) if d > 1 else 0)
        b = 10 ** d - 1 if hi is None else min(hi, 10 ** d - 1)
        if a <= b:
            alts.append(_digits_range(str(a).zfill(d), str(b).zfill(d)))
    return alts


def int_range_gbnf(lo: int | None, hi: int | None) -> str:
    """A GBNF expression matching exactly the JSON integers in [lo, hi] (None: unbounded)."""
    alts: list[str] = []
    if lo is None or lo < 0:  # negative part: "-" then |x| in [max(1, -hi), -lo]
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        neg_hi = None if lo is None else -lo
        if neg_hi is None or neg_lo <= neg_hi:
            alts += [f'"-" ({a})' for a in _nonneg_range(neg_lo, neg_hi)]
    if hi is None or hi >= 0:
        alts += _nonneg_range(max(lo or 0, 0), hi)
    if not alts:
        raise S.SchemaError(f"the integer range [{lo}, {hi}] is empty")
    return " | ".join(f"({a})" for a in alts)


# JSON forbids raw control characters in strings; llama-cpp-python 0.3.36's `char` allows them.
_JSON_CHAR = llama_grammar.BuiltinRule(
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])', [])
# A calendar date (upstream's rule let any month have 31 days, February 30 and the year 0000): each
# month its days, February 29 in leap years only (every 4th year, centuries every 400th), years 0001-9999.
_LEAP = '([02468] [48] | [13579] [26] | [2468] "0")'
_D28 = '("0" [1-9] | "1" [0-9] | "2" [0-8])'
_DATE = llama_grammar.BuiltinRule(
    '([1-9] [0-9] [0-9] [0-9] | "0" [1-9] [0-9] [0-9] | "00" [1-9] [0-9] | "000" [1-9]) "-" ('
    f'("0" [13578] | "1" [02]) "-" ({_D28} | "29" | "30" | "31") | ("0" [469] | "11") "-" ({_D28} | "29" | "30") '
    f'| "02-" {_D28}) | ([0-9] [0-9] {_LEAP} | {_LEAP} "00") "-02-29"', [])


if TYPE_CHECKING:
    class _SchemaConverter:
        """The typed face of llama_grammar.SchemaConverter (llama-cpp-python 0.3.36 leaves it unannotated):
        the methods used here, as they behave."""

        def __init__(self, *, prop_order: dict[str, int], allow_fetch: bool, dotall: bool,
                     raw_pattern: bool) -> None: ...
        def _add_rule(self, name: str, rule: str) -> str: ...
        def _format_literal(self, literal: str) -> str: ...
        def _add_primitive(self, name: str, rule: llama_grammar.BuiltinRule) -> str: ...
        def resolve_refs(self, schema: dict[str, Any], url: str) -> Any: ...
        def _build_object_rule(self, properties: list[tuple[str, Any]], required: set[str], name: str,
                               additional_properties: Any) -> str: ...
        _refs: dict[str, Any]
        _rules: dict[str, str]
        def _visit_pattern(self, pattern: str, name: str) -> str: ...
        def visit(self, schema: Any, name: str) -> str: ...
        def format_grammar(self) -> str: ...
else:
    _SchemaConverter = llama_grammar.SchemaConverter


_KVS = re.compile(r'^(\S+) \( "," space \1 \)\*$')  # upstream's additional-kvs rule
# What a GBNF string literal must escape (llama-cpp-python's list lacks the backslash).
_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n", "\t": "\\t"}


class _Converter(_SchemaConverter):
    """llama-cpp-python's schema converter, plus the numeric ranges it ignores, JSON's string rule,
    literals with their backslashes escaped and a property named "" that is not the root."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._visited = False  # the root was visited (a later name "" is a property's)
        self._named: dict[str, list[str]] = {}  # additional keys' rule name -> the object's named keys

    def _add_primitive(self, name: str, rule: llama_grammar.BuiltinRule) -> str:
        return super()._add_primitive(name, {"char": _JSON_CHAR, "date": _DATE}.get(name, rule))

    def _format_literal(self, literal: str) -> str:
        """A GBNF literal of `literal` (JSON text of an enum value, a const or a property name; or one
        character). Upstream leaves backslashes as they are, so llama.cpp read JSON's escapes as its own:
        a key "a\\b" came out as "a\b" (not JSON), "\\n" as a raw newline (not JSON either), and
        "\\ud83d\\ude42" as the encoding of two surrogates (no token can follow). JSON text is
        rewritten with its characters as they are (a model writes "é", not its escape) where it can be."""
        try:
            text = json.dumps(json.loads(literal), ensure_ascii=False)
            text.encode()  # a lone surrogate (JSON allows "\\ud800") keeps its escape
            literal = text
        except (ValueError, UnicodeEncodeError, RecursionError):
            pass
        return '"' + "".join(_GBNF_ESCAPES.get(c, c) for c in literal) + '"'

    def _add_rule(self, name: str, rule: str) -> str:
        if name == "dot" and rule in (llama_grammar.DOT, llama_grammar.DOTALL):
            rule = _JSON_PATTERN_CHAR  # a pattern's `.`: any character a JSON string holds as it is
        named = self._named.pop(name, None)
        if named is not None and rule.startswith("string "):  # an additional property's key: not a named one
            rule = super()._add_rule(name[:-len("kv")] + "key", _other_key(named)) + rule[len("string"):]
        return super()._add_rule(name, rule)

    def _build_object_rule(self, properties: list[tuple[str, Any]], required: set[str], name: str,
                           additional_properties: Any) -> str:
        """Upstream's object, with additional properties' keys other than the named ones: it let the
        answer write a named key again as an additional one, with a value its own schema refuses."""
        if additional_properties is True or isinstance(additional_properties, dict):
            self._named[f"{name}{'-' if name else ''}additional-kv"] = [key for key, _ in properties]
        return super()._build_object_rule(properties, required, name, additional_properties)

    def format_grammar(self) -> str:
        # Upstream ends the chain of optional properties with the additional ones as `X-rest ::= kvs`:
        # required, and with no comma before them, so an answer that wrote a named property could not
        # end there and glued the next key on ({"a": 1"x": 2}); later llama.cpp writes `( "," space kv )*`.
        for key, body in self._rules.items():
            kvs = _KVS.match(self._rules.get(body, "")) if key.endswith("-rest") else None
            if kvs is not None:
                self._rules[key] = f'( "," space {kvs.group(1)} )*'
        return super().format_grammar()

    def _visit_pattern(self, pattern: str, name: str) -> str:
        return super()._visit_pattern(json_safe_pattern(pattern), name)

    def visit(self, schema: Any, name: str) -> str:
        if not name and self._visited:
            name = "empty-key"  # a top-level property named "": its rule would take the name "root"
        self._visited = True
        rule = self._own_rule(schema, name) if isinstance(schema, dict) else None
        return rule if rule is not None else super().visit(schema, name)

    def _own_rule(self, schema: dict[str, Any], name: str) -> str | None:
        """The rule for what upstream gets wrong (None: upstream's rule)."""
        rule_name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
        if "allOf" in schema and schema.get("type") in (None, "object") \
                and not {"$ref", "anyOf", "oneOf", "const", "enum"} & schema.keys():
            props, required = _all_of(schema, self._refs)
            return self._add_rule(rule_name, self._build_object_rule(props, required, name, additional_properties=[]))
        if not (schema.keys() - S.ANNOTATIONS - {"propertyNames"}):
            # {} or annotations alone (Claude Code's {"description": ...}) accept any JSON value,
            # where the upstream converter would take them for an object
            return self._add_rule(rule_name, self._add_primitive("value", llama_grammar.PRIMITIVE_RULES["value"]))
        if {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & schema.keys():
            return self._number_rule(schema, rule_name)
        return None

    def _number_rule(self, schema: dict[str, Any], rule_name: str) -> str | None:
        if schema.get("type") == "integer":
            lo, hi = S.int_bounds(schema)
            return self._add_rule(rule_name, f"({int_range_gbnf(lo, hi)}) space")
        if schema.get("type") == "number":
            lo, hi = S.number_bounds(schema)
            frac = '("." [0-9]{1,15})?'
            body = f"({int_range_gbnf(lo, None if hi is None else hi - 1)}) {frac}"
            if hi is not None:
                body = f'({body}) | ("{hi}" ("." "0"{{1,15}})?)'
            return self._add_rule(rule_name, f"({body}) space")
        return None


# A pattern's characters land inside a JSON string as they are: no quote, backslash or control character.
_JSON_PATTERN_CHAR = r'[^"\\\x7F\x00-\x1F]'
Ranges = list[tuple[int, int]]
_UNSAFE: Ranges = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]
# \d \w as JSON Schema's regexes (ECMA-262) read them: ASCII; \s a space alone (JSON escapes the others),
# \S none of ECMA-262's spaces
_SHORT: dict[str, Ranges] = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
                             "s": [(0x20, 0x20)]}
_NEGATED: dict[str, Ranges] = {"D": _SHORT["d"], "W": _SHORT["w"], "S": [
    (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F),
    (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]}
_CONTROL_ESCAPES = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B}


def json_safe_pattern(pattern: str) -> str:
    """`pattern` rewritten for the converter's regex subset so that it writes only what a JSON string
    holds as it is: \\d \\w \\s and their negations, \\xHH \\uHHHH, escaped punctuation and every
    [class] become GBNF classes without quote, backslash or control characters. Upstream passed escapes
    through (\\d reached llama.cpp as an unknown escape: every pattern with one was refused) and let
    `.`, [^a] or [ -~] write a raw quote or newline inside the string. A pattern that can only match
    such a character, or uses an escape we do not read (\\b, \\n, \\p...), is refused by name."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "[":
            i, ranges, negated = _read_class(pattern, i)
            out.append(_gbnf_class(ranges, negated))
        elif c == "\\":
            e = pattern[i + 1:i + 2]
            if e in ("d", "w", "s", "D", "W", "S"):
                out.append(_gbnf_class(_NEGATED[e], True) if e.isupper() else _gbnf_class(_SHORT[e], False))
                i += 2
            else:
                code, i = _read_escape(pattern, i)
                out.append(_gbnf_class([(code, code)], False))
        elif c == '"' or ord(c) < 0x20 or c == "\x7f":
            raise _unsafe(c)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _read_escape(pattern: str, i: int) -> tuple[int, int]:
    """The code point of the escape at pattern[i] (a backslash) and where it ends."""
    e = pattern[i + 1:i + 2]
    width = {"x": 2, "u": 4, "U": 8}.get(e)
    if width is not None:
        digits = pattern[i + 2:i + 2 + width]
        if len(digits) == width and all(d in "0123456789abcdefABCDEF" for d in digits):
            return int(digits, 16), i + 2 + width
    elif e in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[e], i + 2
    elif e and e.isascii() and not e.isalnum() and e.isprintable():
        return ord(e), i + 2
    raise S.SchemaError(f"`pattern` uses the escape \\{e}, which structured output cannot enforce (supported: "
                        "\\d \\w \\s \\D \\W \\S, \\xHH \\uHHHH and escaped punctuation)")


def _read_class(pattern: str, i: int) -> tuple[int, Ranges, bool]:
    """The [class] at pattern[i]: where it ends, its ranges, whether it is negated."""
    j, n = i + 1, len(pattern)
    negated = pattern[j:j + 1] == "^"
    j += negated
    ranges: Ranges = []
    first = j
    while j < n and (pattern[j] != "]" or j == first):
        if pattern[j] == "\\" and pattern[j + 1:j + 2] in ("d", "w", "s"):  # ([^\\s]: none of ECMA's spaces)
            ranges += _NEGATED["S"] if negated and pattern[j + 1] == "s" else _SHORT[pattern[j + 1]]
            j += 2
            continue
        if pattern[j] == "\\" and pattern[j + 1:j + 2] in ("D", "W", "S"):
            raise S.SchemaError(f"`pattern` uses {pattern[j:j + 2]} inside a class, which structured output "
                                "cannot enforce")
        lo, j = _read_escape(pattern, j) if pattern[j] == "\\" else (ord(pattern[j]), j + 1)
        hi = lo
        if pattern[j:j + 1] == "-" and j + 1 < n and pattern[j + 1] != "]":
            hi, j = _read_escape(pattern, j + 1) if pattern[j + 1] == "\\" else (ord(pattern[j + 1]), j + 2)
        ranges.append((lo, hi))
    if j >= n:
        raise S.SchemaError("`pattern` has a `[` that is never closed")
    return j + 1, ranges, negated


def _gbnf_class(ranges: Ranges, negated: bool) -> str:
    """A GBNF class of `ranges` (negated: of everything else) without what a JSON string must escape."""
    if negated:
        ranges = ranges + _UNSAFE
    else:
        safe = _minus(ranges, _UNSAFE)
        if not safe:
            raise _unsafe(chr(ranges[0][0]))
        ranges = safe
    body = "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}" for lo, hi in ranges)
    return "[" + ("^" if negated else "") + body + "]"


def _minus(ranges: Ranges, cut: Ranges) -> Ranges:
    out = []
    for lo, hi in ranges:
        parts = [(lo, hi)]
        for a, b in cut:
            parts = [p for x, y in parts for p in ((x, min(y, a - 1)), (max(x, b + 1), y)) if p[0] <= p[1]]
        out += parts
    return out


def _cp(code: int) -> str:
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _other_key(named: list[str]) -> str:
    """A key (JSON string, then space) that is none of `named`, written without escapes: a trie of the
    names where every node may also leave them by any other character."""
    trie: dict[str, Any] = {}
    for word in named:
        node = trie
        for c in word:
            node = node.setdefault(c, {})
        node[""] = {}  # a name ends here

    def rest(node: dict[str, Any]) -> str:
        chars = [c for c in sorted(node) if c and _minus([(ord(c), ord(c))], _UNSAFE)]  # (others need escapes)
        alts = [f"[{_cp(ord(c))}] {rest(node[c])}" for c in chars]
        alts.append(_gbnf_class([(ord(c), ord(c)) for c in chars], True) + f" {_JSON_PATTERN_CHAR}*")
        return "(" + " | ".join(alts) + ")" + ("" if "" in node else "?")

    return f'"\\"" {rest(trie)} "\\"" space'


def _unsafe(c: str) -> S.SchemaError:
    return S.SchemaError(f"`pattern` matches only {c!r} there, which a JSON string holds only escaped; "
                         "structured output cannot enforce that")


def _all_of(schema: dict[str, Any], refs: dict[str, Any]) -> tuple[list[tuple[str, Any]], set[str]]:
    """The properties an `allOf` object has, each once, and those it must write (core/schema.py
    all_of_properties), with the node's own `properties` beside the parts. Upstream listed a property
    that two parts define twice, so the answer wrote its key twice (both times under the second part's
    schema); one defined in two ways is refused by the schema check (core/schema.py _check_all_of)."""
    props: dict[str, Any] = {}
    required: set[str] = set()
    for key, sub, must in S.all_of_properties(schema, refs.get):
        props.setdefault(key, sub)
        if must:
            required.add(key)
    return list(props.items()), required


def schema_to_gbnf(schema: dict[str, Any], *, meta: bool = True) -> str:
    """GBNF for a checked schema; SchemaError names what cannot be enforced. meta: see S.check_schema."""
    S.check_schema(schema, meta=meta)
    conv = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), "input")
        conv.visit(resolved, "")
    except S.SchemaError:
        raise
    except Exception as e:  # noqa: BLE001 - llama-cpp-python's converter on input a client wrote: any failure is "cannot"
        raise S.SchemaError(f"the schema cannot be turned into a grammar: {e or type(e).__name__}") from None
    return conv.format_grammar()


def check_bounded(gbnf: str) -> str:
    """The grammar, once its stack growth on a probe is under engine/structured/bounds.py's limits;
    SchemaError (a 400) otherwise, before llama.cpp builds it. (An agent's repeated tools are not probed
    again: engine/structured/request.py remembers their plan.)"""
    from ggufdesk.engine.structured.bounds import GrammarTooComplex, stack_peak

    try:
        stack_peak(gbnf)
    except GrammarTooComplex as e:
        raise S.SchemaError(f"{e}; simplify the schema (patterns with nested optional or repeated parts are "
                            "the usual cause)") from None
    return gbnf


# ---- tool calls -------------------------------------------------------------------------------


@dataclass
class ToolGrammar:
    gbnf: str
    marker: str  # the text that opens a call
    lazy: bool  # auto: free text until the marker, then the grammar


def _openings(fmt: ToolFormat, tools: list[dict[str, Any]] | None = None) -> list[bytes]:
    """Every way the grammar lets a call begin, as far as the triggering token may reach: up to the
    function name's opening quote (JSON formats) or through the name (harmony's text trigger)."""
    if fmt.name == "harmony":
        tails = ("", " ", " <|constrain|>json", " json", "<|channel|>commentary")
        return [(fmt.marker + t["function"]["name"] + tail).encode() for t in tools or [] for tail in tails]
    heads = [fmt.marker + w for w in ("", " ", "\n")] if fmt.name != "llama3" else [""]
    out = []
    for head in heads:
        for a, b, c in itertools.product(("", " "), repeat=3):
            out.append(f'{head}{{{a}"name"{b}:{c}"'.encode())
    return out


def _lit(text: str) -> str:
    """A GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def _schema_rules(schemas: dict[str, dict[str, Any]]) -> str:
    """GBNF rules named after the keys of `schemas`, one grammar sharing the JSON primitives (no root)."""
    conv = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        for name, schema in schemas.items():
            S.check_schema(schema)
            ref = conv.visit(conv.resolve_refs(json.loads(json.dumps(schema)), "input"), name)
            if ref != name:  # a primitive comes back under its own rule's name
                conv._add_rule(name, ref)
    except S.SchemaError:
        raise
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError, NotImplementedError) as e:
        raise S.SchemaError(f"the schema cannot be turned into a grammar: {e or type(e).__name__}") from None
    return conv.format_grammar()


def _params(tools: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(t["function"]["name"], t["function"].get("parameters") or {"type": "object"}) for t in tools]


def _deepseek_grammar(tools: list[dict[str, Any]], fmt: ToolFormat, parallel: bool) -> str:
    named = _params(tools)
    rules = _schema_rules({f"args{i}": p for i, (_, p) in enumerate(named)})
    if fmt.name == "deepseek_r1":
        alts = [f'{_lit(n + chr(10) + "```json" + chr(10))} args{i} {_lit(chr(10) + "```")}'
                for i, (n, _) in enumerate(named)]
        tc = f'tc ::= {_lit(T.DS_CALL + "function" + T.DS_SEP)} ({" | ".join(alts)}) {_lit(T.DS_CALL_END)}'
    else:
        alts = [f"{_lit(n + T.DS_SEP)} args{i}" for i, (n, _) in enumerate(named)]
        tc = f'tc ::= {_lit(T.DS_CALL)} ({" | ".join(alts)}) {_lit(T.DS_CALL_END)}'
    more = ' ("\\n"? tc){0,3}' if parallel else ""
    root = f'root ::= {_lit(T.DS_CALLS)} tc{more} {_lit(T.DS_CALLS_END)}'
    return "\n".join([root, tc, rules])


def _harmony_grammar(tools: list[dict[str, Any]]) -> str:
    """`to=functions.NAME`, the rest of the header (either order harmony allows), the JSON arguments."""
    named = _params(tools)
    rules = _schema_rules({f"args{i}": p for i, (_, p) in enumerate(named)})
    alts = [f"{_lit(n)} hdr {_lit('<|message|>')} args{i}" for i, (n, _) in enumerate(named)]
    # ("json" after a space or <|constrain|> only: glued to the name it would be read as part of it)
    hdr = 'hdr ::= ([ ]? "<|channel|>commentary" | [ ]? "<|constrain|>" "json"? | " json")*'
    return "\n".join([f'root ::= "to=functions." ({" | ".join(alts)})', hdr, rules])


def _xml_value(sub: Any, rule: str, schemas: dict[str, dict[str, Any]]) -> str:
    """One parameter's value: raw text where core/tools.py xml_raw says so (a plain string, a string
    enum or const), else the JSON its schema says (the rule `rule`, whose schema goes into `schemas`)."""
    if not T.xml_raw(sub):
        schemas[rule] = sub if isinstance(sub, dict) else {}
        return rule
    if "enum" in sub or "const" in sub:  # its words, raw as XML values are
        return "(" + " | ".join(_lit(w) for w in sub.get("enum", [sub.get("const")])) + ")"
    return "xml-text"


def _xml_function(i: int, name: str, params: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> str:
    """`<function=NAME>` and its parameters: the required ones in the schema's order, then the optional
    ones (rules for JSON values go into `schemas`)."""
    props = params.get("properties") or {}
    required = [k for k in props if k in (params.get("required") or [])]
    ps: list[str] = []
    req: list[str] = []
    for k, (key, sub) in enumerate(props.items()):
        value = _xml_value(sub, f"v{i}-{k}", schemas)
        one = f'{_lit("<parameter=" + key + ">")} nl {value} nl "</parameter>" nl'
        (req if key in required else ps).append(one)
    body = " ".join(f"({r})" for r in req) + (f' ({" | ".join(ps)})*' if ps else "")
    return f'{_lit("<function=" + name + ">")} nl {body} "</function>"'


def _xml_grammar(tools: list[dict[str, Any]], parallel: bool) -> str:
    """Qwen3-Coder: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>;
    a string value is raw text, any other value the JSON its schema says. The required parameters
    come first, in the schema's order (as the template lists them), then any optional ones."""
    schemas: dict[str, dict[str, Any]] = {}
    funcs = [_xml_function(i, name, params, schemas) for i, (name, params) in enumerate(_params(tools))]
    rules = _schema_rules(schemas) if schemas else ""
    more = " (nl tc){0,3}" if parallel else ""
    return "\n".join([f"root ::= tc{more}", f'tc ::= "<tool_call>" nl ({" | ".join(funcs)}) nl "</tool_call>"',
                      'nl ::= "\\n"?', 'xml-text ::= ([^<] | "<" [^/])*', rules])


def tool_grammar(tools: list[dict[str, Any]], fmt: ToolFormat, mode: str, *,
                 parallel: bool = False) -> ToolGrammar:
    """The grammar of one call (parallel: one to four) to `tools` in `fmt` (mode: "required" or "auto")."""
    lazy = mode == "auto"
    if fmt.name in ("deepseek_r1", "deepseek_v3"):
        return ToolGrammar(gbnf=_deepseek_grammar(tools, fmt, parallel), marker=fmt.marker, lazy=lazy)
    if fmt.name == "harmony":
        return ToolGrammar(gbnf=_harmony_grammar(tools), marker=fmt.marker, lazy=True)
    if fmt.name == "qwen3_coder":
        return ToolGrammar(gbnf=_xml_grammar(tools, parallel), marker=fmt.marker, lazy=lazy)
    call = schema_to_gbnf(T.call_schema(tools, fmt), meta=False)  # each tool passed the meta check in check_tools
    call = re.sub(r"^root ::=", "call ::=", call, flags=re.M)
    ws = '[ \\n]?'
    if fmt.name == "mistral":
        more = f' ("," {ws} call){{0,3}}' if parallel else ""
        root = f'root ::= "[TOOL_CALLS]" "[" call{more} "]"'
    elif fmt.name == "llama3":
        root = "root ::= call"
    else:
        more = f" ({ws} tc){{0,3}}" if parallel else ""
        root = (f'root ::= tc{more}\n'
                f'tc ::= "<tool_call>" {ws} call {ws} "</tool_call>"')
    return ToolGrammar(gbnf=root + "\n" + call, marker=fmt.marker, lazy=lazy)


# ---- the sampler ------------------------------------------------------------------------------


class GrammarConstraint:
    """One request's grammar state: check the sampled token first, resample under it when rejected.

    marker (lazy grammars): the grammar applies only from the first time the output contains this
    text; before, every token is free. A marker that is one token of the vocabulary triggers on
    that token. A longer marker triggers on the text, and then only tokens that end at most at the
    call's opening (`{"name": "`) may complete it: llama.cpp feeds the grammar the rest of the
    triggering token and aborts the process if that rest does not fit.
    """

    def __init__(self, vocab: Any, n_vocab: int, gbnf: str, *, piece: Callable[[int], bytes],
                 marker: str | None = None, marker_tokens: list[int] | None = None,
                 openings: list[bytes] | None = None) -> None:
        self.n_vocab = n_vocab
        self.gbnf = gbnf
        self._vocab = vocab
        self._piece = piece
        self._marker = marker.encode() if marker else None
        self._openings = openings or []
        self._marker_tokens = marker_tokens or []
        self.awaiting = marker is not None
        self._buf = b""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        if marker is not None and marker_tokens:
            toks = (llama_cpp.llama_token * len(marker_tokens))(*marker_tokens)
            self._smp = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                vocab, gbnf.encode(), b"root", None, 0, toks, len(marker_tokens))
        elif marker is not None:
            pats = (ctypes.c_char_p * 1)(re.escape(marker).encode())
            self._smp = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                vocab, gbnf.encode(), b"root", pats, 1, None, 0)
        else:
            self._smp = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        if not self._smp:
            raise P.EngineRequestError("schema", "llama.cpp could not parse the grammar: it is not valid GBNF "
                                       "with a `root` rule")
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._all = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self.rejections = 0  # how often the fast check failed and the full vocabulary was used

    def _apply(self, smp: Any, data: np.ndarray) -> Any:
        arr = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(data), selected=-1,
            sorted=False)
        llama_cpp.llama_sampler_apply(smp, ctypes.byref(arr))
        return arr

    def allows(self, token: int) -> bool:
        if self.awaiting:
            if self._marker_tokens or self._marker is None:
                return True
            buf = self._buf + self._piece(token)
            i = buf.find(self._marker)
            return i < 0 or any(o.startswith(buf[i:]) for o in self._openings)
        return self._fits(self._smp, token)

    def _fits(self, smp: Any, token: int) -> bool:
        """The grammar state `smp` (this request's, or a copy `fitting` moves on) takes the token, and
        the output stays valid UTF-8 with it (from where the decoder stands)."""
        if not self._shows_as_read(token):
            return False
        self._one[0] = (token, 0.0, 0.0)
        self._apply(smp, self._one)
        return bool(np.isfinite(self._one[0]["logit"]))

    def _shows_as_read(self, token: int) -> bool:
        """The output stays valid UTF-8 with this token (llama.cpp's grammar counts a malformed
        byte sequence as one character; JSON readers would not), and the token writes what the
        grammar reads: llama.cpp's grammar reads a control token as its text ("<s>", "<unk>") where
        the answer shows nothing, so a string could pass minLength or a pattern on text that is not
        there (only an end of generation may be such a token)."""
        piece = self._piece(token)
        if not piece:
            return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        state = self._utf8.getstate()
        try:
            self._utf8.decode(piece)
            # Python's decoder raises on a surrogate's encoding (ED A0-BF ..) only at its last byte, and
            # llama.cpp's grammar does not check for one: taking ED A0 would leave no token that fits
            pending = self._utf8.getstate()[0]
            return not (len(pending) >= 2 and pending[0] == 0xED and pending[1] >= 0xA0)
        except UnicodeDecodeError:
            return False
        finally:
            self._utf8.setstate(state)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every token the grammar rejects set to -inf (a copy)."""
        data = self._all
        data["id"] = np.arange(self.n_vocab, dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        self._apply(self._smp, data)
        out = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        out[data["id"]] = data["logit"]
        return out

    def _pick(self, values: np.ndarray, chain: Any | None) -> int:
        if chain is None:
            return int(np.argmax(values))
        data = self._all
        data["id"] = np.arange(self.n_vocab, dtype=np.int32)  # samplers may reorder the array
        data["logit"] = values
        data["p"] = 0.0
        arr = self._apply(chain.sampler, data)
        if not 0 <= arr.selected < arr.size:
            raise KnownError("the sampler chose no token")
        return int(arr.data[arr.selected].id)

    def _best_allowed(self, logits: np.ndarray, k: int = 64) -> int | None:
        """Greedy after a rejection: the highest-logit allowed token among the top k, found by
        asking the grammar about k tokens instead of the whole vocabulary (exactly the argmax of
        the masked logits when one of them is allowed); None sends the caller to the full mask."""
        k = min(k, self.n_vocab)
        top = np.argpartition(logits, -k)[-k:]
        top = top[np.argsort(-logits[top])]
        data = np.zeros(k, dtype=_TOKEN_DATA)
        data["id"] = top
        data["logit"] = logits[top]
        self._apply(self._smp, data)
        for i in range(k):
            t = int(data["id"][i])
            if np.isfinite(data["logit"][i]) and self._shows_as_read(t) and (not self.awaiting or self.allows(t)):
                return t
        return None

    def sample(self, logits: np.ndarray, chain: Any | None) -> int:
        """Sample a token the grammar allows, and advance the grammar (and the chain) with it.

        chain: llama-cpp-python's LlamaSampler, or None for greedy.
        """
        token = self._pick(logits, chain)
        if not self.allows(token):
            self.rejections += 1
            if chain is None:
                best = self._best_allowed(logits)
                if best is not None:
                    self.accept(best)
                    return best
            values = self.mask(logits)
            for _ in range(64):
                if not np.isfinite(values).any():
                    raise KnownError("the grammar allows no token here (the schema cannot be completed)")
                token = self._pick(values, chain)
                if self.allows(token):
                    break
                values[token] = -np.inf
            else:
                raise KnownError("no token fits the grammar here")
        if chain is not None:
            llama_cpp.llama_sampler_accept(chain.sampler, token)
        self.accept(token)
        return token

    def accept(self, token: int) -> None:
        if not self.awaiting:
            self._utf8.decode(self._piece(token))
        if self.awaiting:
            if token in self._marker_tokens:
                self.awaiting = False
            elif self._marker is not None and not self._marker_tokens:
                self._buf += self._piece(token)
                self.awaiting = self._marker not in self._buf
        llama_cpp.llama_sampler_accept(self._smp, token)

    def fitting(self, draft: list[int]) -> int:
        """How many of a draft's first tokens the grammar allows in a row from here (on a copy of its
        state; nothing here changes). A token it refuses can never be sampled, so its row and the rows
        after it would be verified in vain: the planner drafts only this prefix. Before a lazy grammar's
        marker every token is free (the whole draft). The copy is not free with many tools: Claude Code's
        25 (a 138k-character grammar) cost 0.33 ms to copy and 0.5 ms for 8 tokens, which the planner
        bills to the drafter as part of its look, so lookup drafts there only where that pays."""
        if self.awaiting or not draft or not self._smp:
            return len(draft)
        smp, state = llama_cpp.llama_sampler_clone(self._smp), self._utf8.getstate()
        try:
            for i, t in enumerate(draft):
                if not self._fits(smp, t):
                    return i
                self._utf8.decode(self._piece(t))
                llama_cpp.llama_sampler_accept(smp, t)  # (past an allowed end of generation, nothing is taken)
            return len(draft)
        finally:
            self._utf8.setstate(state)
            llama_cpp.llama_sampler_free(smp)

    def close(self) -> None:
        if self._smp:
            llama_cpp.llama_sampler_free(self._smp)
            self._smp = None
