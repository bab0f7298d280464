"""JSON schemas for structured output: which features we can enforce, checked before any grammar is built.

The engine turns a schema into a GBNF grammar (engine/structured/grammar.py) and llama.cpp's grammar sampler
makes every generated token fit it. A schema keyword the grammar cannot enforce is refused here
with its name and where it sits, so a user never gets an unconstrained answer silently.
"""
from __future__ import annotations

import collections
import hashlib
import json
import math
import re
import threading
from typing import Any, Callable, Iterator

from ggufdesk.core.errors import KnownError

# Keywords the converter enforces. Annotations (title, description, examples, default, ...) are
# accepted and ignored, as JSON Schema says they should be.
ENFORCED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum",
}
ANNOTATIONS = {
    "$schema", "$id", "$comment", "title", "description", "examples", "default", "deprecated",
    "readOnly", "writeOnly", "strict", "name", "nullable",
}
# Formats the grammar enforces; any other format is an annotation (JSON Schema's default meaning).
ENFORCED_FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
MAX_DEPTH = 64
MAX_NODES = 5000
INT_DIGITS = 16  # an integer without an upper bound has at most this many digits
# Bounded work before unbounded work (issue 34): the size of a schema as plain JSON is counted first,
# in one pass without recursion, before jsonschema's meta-schema check (about 80 us per value here:
# 100,000 properties had frozen the server for 74 s) and before any grammar is built.
MAX_VALUES = 4 * MAX_NODES  # JSON values (objects, arrays, strings, numbers...) in one schema
MAX_TOOL_VALUES = MAX_VALUES  # all tools of one request together (their call schema is one schema)
MAX_JSON_DEPTH = 2 * MAX_DEPTH + 8  # a schema level is two JSON levels ("properties" -> name -> schema)
MAX_REPEAT = 1000  # minItems/maxItems/minLength/maxLength and {m,n} in patterns: each unit is a grammar rule
MAX_PATTERN = 4096  # characters in one `pattern`
MAX_PATTERN_GROUPS = 32  # nested parentheses in one `pattern`


class SchemaError(KnownError):
    """A schema we cannot enforce (or not a schema at all); the message names the feature."""

    kind = "schema"  # the engine's error kind for it (a 400 at the server)


def load_schema(text: str | bytes, *, source: str = "the schema") -> dict[str, Any]:
    """Parse and check a schema given as JSON text."""
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SchemaError(f"{source} is not valid JSON: {e}") from None
    check_schema(schema)
    checked: dict[str, Any] = schema
    return checked


def check_size(value: Any, *, what: str, max_values: int = MAX_VALUES, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise SchemaError when `value` (plain JSON) holds more than max_values values or nests deeper than
    max_depth; one pass, no recursion, so it is cheap on anything a request body can hold."""
    count, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        count += 1
        if count > max_values:
            raise SchemaError(f"{what} is too large (more than {max_values} values)")
        if depth > max_depth:
            raise SchemaError(f"{what} is too large (nested more than {max_depth} levels deep)")
        if isinstance(node, dict):
            todo.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            todo.extend((v, depth + 1) for v in node)


def check_schema(schema: Any, *, meta: bool = True) -> None:
    """Raise SchemaError naming the first feature the grammar could not enforce.

    meta=False skips jsonschema's meta-schema check, for a schema made of parts that passed it already
    (the call schema of checked tools): it is the one costly step, and the engine should not repeat it.
    """
    if not isinstance(schema, dict):
        raise SchemaError("a JSON schema must be an object (for example {\"type\": \"object\"})")
    check_size(schema, what="the schema")
    if meta:
        _meta_check(schema)
    count = [0]
    try:
        _walk(schema, "#", 0, count, schema)
    except (AttributeError, TypeError) as e:  # a keyword of the wrong type that only meta-checking catches
        raise SchemaError(f"not a valid JSON schema: {e}") from None


# Schemas that passed the meta check, by a digest of their JSON: an agent sends the same tools on every
# turn, and jsonschema's check of Claude Code's 25 tools took 50-100 ms of each (bench/queue_stall.py).
_META_PASSED: collections.OrderedDict[bytes, None] = collections.OrderedDict()
_META_PASSED_MAX = 1024  # digests of 16 bytes; more distinct schemas than any client set sends
_META_LOCK = threading.Lock()


def json_digest(value: Any, *, sort_keys: bool) -> bytes | None:
    """A 16-byte digest of a value's JSON, a memo's key; None where it is not plain JSON (not remembered).
    sort_keys: whether objects whose keys stand in another order are the same value."""
    try:
        text = json.dumps(value, sort_keys=sort_keys, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _meta_check(schema: dict[str, Any]) -> None:
    key = json_digest(schema, sort_keys=True)  # (the check does not depend on the keys' order)
    with _META_LOCK:
        if key is not None and key in _META_PASSED:
            _META_PASSED.move_to_end(key)
            return
    _meta_check_once(schema)
    if key is not None:
        with _META_LOCK:
            _META_PASSED[key] = None
            while len(_META_PASSED) > _META_PASSED_MAX:
                _META_PASSED.popitem(last=False)


def _meta_check_once(schema: dict[str, Any]) -> None:
    from jsonschema import exceptions, validators

    try:
        # without a $schema, draft 7's rules: its tuple form `items: [...]` is still common (llama-server takes it)
        validators.validator_for(schema, default=validators.Draft7Validator).check_schema(schema)
    except RecursionError:
        raise SchemaError(f"the schema is too large (nested more than {MAX_DEPTH} levels deep)") from None
    except exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "the top level"
        raise SchemaError(f"not a valid JSON schema at {where}: {e.message}") from None


def _walk(node: Any, where: str, depth: int, count: list[int], root: dict[str, Any]) -> None:
    """Check one schema node and everything under it (refusing what structured output cannot follow)."""
    if isinstance(node, bool):
        if node is False:
            raise SchemaError(f"{where}: the schema `false` accepts nothing")
        return
    if not isinstance(node, dict):
        raise SchemaError(f"{where}: expected a schema object, got {type(node).__name__}")
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_NODES:
        raise SchemaError(f"the schema is too large (more than {MAX_DEPTH} levels or {MAX_NODES} parts)")
    _check_keywords(node, where, root)
    _check_combinations(node, where)
    _check_all_of(node, where, root)
    if "enum" in node and not node["enum"]:
        raise SchemaError(f"{where}: an empty `enum` accepts nothing")
    for sub_where, sub in _children(node, where):
        _walk(sub, sub_where, depth + 1, count, root)


def _check_keywords(node: dict[str, Any], where: str, root: dict[str, Any]) -> None:
    """The node's own keywords: known, with a known type, a local $ref that resolves, sane bounds."""
    for key in node:
        if key == "propertyNames" and node[key] in ({"type": "string"}, {}, True):
            continue  # every JSON key is a string: nothing to enforce (Claude Code's tools say so)
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise SchemaError(f"{where}: the keyword `{key}` is not supported for structured output")
    types = node.get("type")
    type_list = types if isinstance(types, list) else [types] if types else []
    for t in type_list:
        if t not in TYPES:
            raise SchemaError(f"{where}: unknown type {t!r}")
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        raise SchemaError(f"{where}: only local references (#/$defs/...) are supported, not {ref!r}")
    if ref is not None:
        _resolve(root, ref, where)
    _check_bounds(node, where, type_list)
    _check_counts(node, where)
    if "pattern" in node:
        check_pattern(node["pattern"], where)


def _check_combinations(node: dict[str, Any], where: str) -> None:
    """Keywords that are supported alone but not together (the grammar cannot enforce both)."""
    if node.get("format") in ENFORCED_FORMATS and "pattern" in node:
        raise SchemaError(f"{where}: `format` together with `pattern` is not supported")
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        raise SchemaError(f"{where}: `pattern` together with `minLength`/`maxLength` is not supported")
    if "items" in node and "prefixItems" in node:
        raise SchemaError(f"{where}: `items` together with `prefixItems` is not supported")
    if isinstance(node.get("items"), list) and ("minItems" in node or "maxItems" in node):
        raise SchemaError(f"{where}: a tuple (`items` as a list) with `minItems`/`maxItems` is not supported")
    for i, part in enumerate(node.get("allOf") or []):
        if not isinstance(part, dict) or not ({"properties", "$ref", "anyOf"} & part.keys()):
            raise SchemaError(f"{where}/allOf/{i}: `allOf` is supported only over object schemas "
                              "with `properties`")


def _check_all_of(node: dict[str, Any], where: str, root: dict[str, Any]) -> None:
    """An `allOf` object whose parts (or the node itself) define one property in two ways: the grammar
    writes a property once, under one schema, and cannot hold its value to both."""
    if not isinstance(node.get("allOf"), list):
        return
    seen: dict[str, Any] = {}
    for key, sub, _ in all_of_properties(node, lambda ref: _resolve(root, ref, where)):
        if key in seen and _bare(seen[key]) != _bare(sub):
            raise SchemaError(f"{where}: `allOf` defines the property {key!r} in two ways; structured "
                              "output cannot hold its value to both")
        seen.setdefault(key, sub)


def all_of_properties(node: dict[str, Any], resolve: Callable[[str], Any]) -> Iterator[tuple[str, Any, bool]]:
    """(key, schema, required) for every property an `allOf` object names, as structured output reads
    it (llama-cpp-python's converter): the node's own (required when its `required` says so), every
    property of a part (required), those of a part's `anyOf` branches (optional); `resolve` reads a `$ref`."""
    def properties(part: Any) -> Any:
        if isinstance(part, dict) and isinstance(part.get("$ref"), str):
            part = resolve(part["$ref"])
        props = part.get("properties") if isinstance(part, dict) else None
        return props.items() if isinstance(props, dict) else ()

    own = node.get("required")
    for key, sub in properties(node):
        yield key, sub, isinstance(own, list) and key in own
    for part in node["allOf"]:
        branches = part.get("anyOf") if isinstance(part, dict) else None
        for branch in branches if isinstance(branches, list) else [part]:
            for key, sub in properties(branch):
                yield key, sub, branch is part


def _bare(schema: Any) -> Any:
    """A schema without its annotations (two definitions that differ only in those are one)."""
    if isinstance(schema, dict):
        return {k: _bare(v) for k, v in schema.items() if k not in ANNOTATIONS}
    if isinstance(schema, list):
        return [_bare(v) for v in schema]
    return schema


def _children(node: dict[str, Any], where: str) -> Iterator[tuple[str, Any]]:
    """(where, sub-schema) for every schema nested in the node, in the order they are checked."""
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, sub in enumerate(node.get(key) or []):
            yield f"{where}/{key}/{i}", sub
    items = node.get("items")
    if isinstance(items, list):
        for i, sub in enumerate(items):
            yield f"{where}/items/{i}", sub
    elif items is not None:
        yield f"{where}/items", items
    for name, sub in (node.get("properties") or {}).items():
        yield f"{where}/properties/{name}", sub
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield f"{where}/additionalProperties", extra
    for key in ("$defs", "definitions"):
        for name, sub in (node.get(key) or {}).items():
            yield f"{where}/{key}/{name}", sub


def _resolve(root: dict[str, Any], ref: str, where: str) -> Any:
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SchemaError(f"{where}: the reference {ref!r} points nowhere")
        node = node[part]
    return node


COUNTS = ("minItems", "maxItems", "minLength", "maxLength")


def relax_bounds(node: Any) -> Any:
    """A tool's parameters with length and item-count bounds above MAX_REPEAT left out: a tool's own
    server checks them, and Claude Code's `maxLength: 524288` must not refuse the whole request."""
    if isinstance(node, list):
        return [relax_bounds(x) for x in node]
    if not isinstance(node, dict):
        return node
    return {key: value if key in ("enum", "const", "default", "examples") else relax_bounds(value)
            for key, value in node.items()
            if not (key in COUNTS and isinstance(value, (int, float)) and not isinstance(value, bool)
                    and value > MAX_REPEAT)}


def _check_counts(node: dict[str, Any], where: str) -> None:
    """minItems/maxItems/minLength/maxLength: whole numbers up to MAX_REPEAT (each unit becomes a grammar
    rule: a billion had raised MemoryError while the grammar was written)."""
    for key in COUNTS:
        v = node.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < 0:
            raise SchemaError(f"{where}: `{key}` must be a whole number >= 0, not {v!r}")
        if v > MAX_REPEAT:
            raise SchemaError(f"{where}: `{key}` {int(v)} is more than this server can enforce "
                              f"(at most {MAX_REPEAT})")


# Regular-expression features the grammar converter cannot express. Each is refused by name: a
# backreference or a lookaround would otherwise reach llama.cpp as a broken grammar (a 500).
_PATTERN_REFUSED = (
    (re.compile(r"\\[1-9k]|\(\?P="), "backreferences"),
    (re.compile(r"\(\?<?[=!]"), "lookarounds"),
    (re.compile(r"\(\?"), "groups of the form (?...) (named, non-capturing or with flags)"),
)
_PATTERN_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_pattern(pattern: Any, where: str) -> None:
    """A `pattern` we can turn into a grammar: valid, anchored features only, bounded repeats and nesting."""
    if not isinstance(pattern, str):
        raise SchemaError(f"{where}: `pattern` must be a string")
    if len(pattern) > MAX_PATTERN:
        raise SchemaError(f"{where}: `pattern` is longer than {MAX_PATTERN} characters")
    plain = _without_escapes_and_classes(pattern)
    for rx, what in _PATTERN_REFUSED:
        if rx.search(plain):
            raise SchemaError(f"{where}: `pattern` uses {what}, which structured output cannot enforce")
    depth = deepest = 0
    for c in plain:
        depth += (c == "(") - (c == ")")
        deepest = max(deepest, depth)
    if deepest > MAX_PATTERN_GROUPS:
        raise SchemaError(f"{where}: `pattern` nests groups more than {MAX_PATTERN_GROUPS} deep")
    for m in _PATTERN_REPEAT.finditer(plain):
        if max(int(m.group(1)), int(m.group(2) or 0)) > MAX_REPEAT:
            raise SchemaError(f"{where}: `pattern` repeats something {m.group(0)} times; at most {MAX_REPEAT}")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise SchemaError(f"{where}: `pattern` is not a valid regular expression: {e}") from None


def _without_escapes_and_classes(pattern: str) -> str:
    """The pattern with [...] classes and escaped characters blanked out (so their brackets do not count);
    the escapes that are references (\\1-\\9, \\k) are kept, for check_pattern to find."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1:i + 2]
            out.append("\\" + nxt if nxt in ("k", *"123456789") else "__")
            i += 2
        elif c == "[":
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            out.append("_" * (min(j, n - 1) - i + 1))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _finite(node: dict[str, Any], key: str, where: str) -> None:
    v = node[key]
    if isinstance(v, bool) and key.startswith("exclusive"):
        return  # draft 4's boolean exclusiveMinimum/exclusiveMaximum
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SchemaError(f"{where}: `{key}` must be a finite number, not {v!r}")
    if abs(v) >= 10 ** INT_DIGITS:
        raise SchemaError(f"{where}: `{key}` {v!r} is beyond what structured output enforces "
                          f"(at most {INT_DIGITS} digits)")


def _check_bounds(node: dict[str, Any], where: str, types: list[Any]) -> None:
    keys = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in node]
    if not keys:
        return
    for key in keys:
        _finite(node, key, where)
    if types == ["integer"]:
        lo, hi = int_bounds(node)
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(f"{where}: the range [{lo}, {hi}] is empty")
        return
    if types == ["number"]:
        lo, hi = number_bounds(node, where)
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(f"{where}: the range [{lo}, {hi}] is empty")
        return
    raise SchemaError(f"{where}: `{keys[0]}` needs `type` to be exactly \"integer\" or \"number\"")


def int_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
    """Inclusive integer bounds from minimum/maximum/exclusive* (draft 4 booleans too)."""
    lo = hi = None
    if "minimum" in node:
        lo = math.ceil(node["minimum"])
    if "maximum" in node:
        hi = math.floor(node["maximum"])
    emin, emax = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if emin is True and lo is not None:
        lo = lo + 1 if lo == node["minimum"] else lo
    elif isinstance(emin, (int, float)) and not isinstance(emin, bool):
        v = math.floor(emin) + 1
        lo = v if lo is None else max(lo, v)
    if emax is True and hi is not None:
        hi = hi - 1 if hi == node["maximum"] else hi
    elif isinstance(emax, (int, float)) and not isinstance(emax, bool):
        v = math.ceil(emax) - 1
        hi = v if hi is None else min(hi, v)
    return lo, hi


def number_bounds(node: dict[str, Any], where: str = "#") -> tuple[int | None, int | None]:
    """Bounds of a `number` we can enforce exactly: inclusive, whole-number, lower bound >= 0."""
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node:
            raise SchemaError(f"{where}: `{key}` on a number is not supported (use integer bounds "
                              "with `minimum`/`maximum`)")
    lo, hi = node.get("minimum"), node.get("maximum")
    for key, v in (("minimum", lo), ("maximum", hi)):
        if v is not None and (not isinstance(v, (int, float)) or v != int(v)):
            raise SchemaError(f"{where}: `{key}` on a number must be a whole number to be enforced, "
                              f"not {v!r}")
    if lo is None or lo < 0:
        raise SchemaError(f"{where}: a number range is supported only with `minimum` >= 0 "
                          "(use type integer for other ranges)")
    return int(lo), None if hi is None else int(hi)


def json_object_schema() -> dict[str, Any]:
    """Any JSON object (OpenAI's `json_object` response format)."""
    return {"type": "object"}
