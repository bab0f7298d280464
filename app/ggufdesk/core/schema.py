"""JSON schemas for structured output: which features we can enforce, checked before any grammar is built.

The engine turns a schema into a GBNF grammar (engine/structured/grammar.py) and llama.cpp's grammar sampler
makes every generated token fit it. A schema keyword the grammar cannot enforce is refused here
with its name and where it sits, so a user never gets an unconstrained answer silently.
"""
from __future__ import annotations

import json
import math
from typing import Any

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


class SchemaError(KnownError):
    """A schema we cannot enforce (or not a schema at all); the message names the feature."""


def load_schema(text: str | bytes, *, source: str = "the schema") -> dict[str, Any]:
    """Parse and check a schema given as JSON text."""
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SchemaError(f"{source} is not valid JSON: {e}") from None
    check_schema(schema)
    checked: dict[str, Any] = schema
    return checked


def check_schema(schema: Any) -> None:
    """Raise SchemaError naming the first feature the grammar could not enforce."""
    if not isinstance(schema, dict):
        raise SchemaError("a JSON schema must be an object (for example {\"type\": \"object\"})")
    from jsonschema import exceptions, validators

    try:
        # without a $schema, draft 7's rules: its tuple form `items: [...]` is still common (llama-server takes it)
        validators.validator_for(schema, default=validators.Draft7Validator).check_schema(schema)
    except RecursionError:
        raise SchemaError(f"the schema is too large (nested more than {MAX_DEPTH} levels deep)") from None
    except exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "the top level"
        raise SchemaError(f"not a valid JSON schema at {where}: {e.message}") from None
    count = [0]
    _walk(schema, "#", 0, count, schema)


def _walk(node: Any, where: str, depth: int, count: list[int], root: dict[str, Any]) -> None:
    if isinstance(node, bool):
        if node is False:
            raise SchemaError(f"{where}: the schema `false` accepts nothing")
        return
    if not isinstance(node, dict):
        raise SchemaError(f"{where}: expected a schema object, got {type(node).__name__}")
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_NODES:
        raise SchemaError(f"the schema is too large (more than {MAX_DEPTH} levels or {MAX_NODES} parts)")
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
    if node.get("format") in ENFORCED_FORMATS and "pattern" in node:
        raise SchemaError(f"{where}: `format` together with `pattern` is not supported")
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        raise SchemaError(f"{where}: `pattern` together with `minLength`/`maxLength` is not supported")
    if "items" in node and "prefixItems" in node:
        raise SchemaError(f"{where}: `items` together with `prefixItems` is not supported")
    if isinstance(node.get("items"), list) and ("minItems" in node or "maxItems" in node):
        raise SchemaError(f"{where}: a tuple (`items` as a list) with `minItems`/`maxItems` is not supported")
    if "allOf" in node:
        for i, part in enumerate(node["allOf"]):
            if not isinstance(part, dict) or not ({"properties", "$ref", "anyOf"} & part.keys()):
                raise SchemaError(f"{where}/allOf/{i}: `allOf` is supported only over object schemas "
                                  "with `properties`")
    if "enum" in node and not node["enum"]:
        raise SchemaError(f"{where}: an empty `enum` accepts nothing")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, sub in enumerate(node.get(key) or []):
            _walk(sub, f"{where}/{key}/{i}", depth + 1, count, root)
    items = node.get("items")
    if isinstance(items, list):
        for i, sub in enumerate(items):
            _walk(sub, f"{where}/items/{i}", depth + 1, count, root)
    elif items is not None:
        _walk(items, f"{where}/items", depth + 1, count, root)
    for name, sub in (node.get("properties") or {}).items():
        _walk(sub, f"{where}/properties/{name}", depth + 1, count, root)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        _walk(extra, f"{where}/additionalProperties", depth + 1, count, root)
    for key in ("$defs", "definitions"):
        for name, sub in (node.get(key) or {}).items():
            _walk(sub, f"{where}/{key}/{name}", depth + 1, count, root)


def _resolve(root: dict[str, Any], ref: str, where: str) -> Any:
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SchemaError(f"{where}: the reference {ref!r} points nowhere")
        node = node[part]
    return node


def _check_bounds(node: dict[str, Any], where: str, types: list[Any]) -> None:
    keys = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in node]
    if not keys:
        return
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
