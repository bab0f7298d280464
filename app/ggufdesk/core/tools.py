"""Tool calling: the formats models are trained on, detecting a template's format, checking tools.

Formats (what the model writes when it calls a tool; core/toolcalls.py reads them back):
- hermes:  <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Qwen 2.5/3, Hermes, generic)
- qwen3_coder: <tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>
- harmony: <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>   (gpt-oss)
- deepseek_r1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
               <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>   (R1 and its distills, V3-0324)
- deepseek_v3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...   (V3.1)
- llama3:  {"name": ..., "parameters": {...}}, optionally after <|python_tag|>   (Llama 3.1-3.3)
- mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]   (Mistral 7B v0.3, Nemo, Small)
Models whose template knows no tools (Gemma 3, Phi, base models) get the hermes format explained
in a system message (`generic`). Calls come back as OpenAI-style dicts:
{"id": "call_...", "type": "function", "function": {"name": ..., "arguments": "<json text>"}}.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ggufdesk.core.schema import ENFORCED_FORMATS, SchemaError, check_schema, check_size, load_schema, relax_bounds

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 128
DS_CALLS, DS_CALL, DS_SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"
DS_CALL_END, DS_CALLS_END = "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"


@dataclass(frozen=True)
class ToolFormat:
    name: str
    marker: str  # the text that opens a call (the lazy grammar's trigger)
    args_key: str  # "arguments" or "parameters"
    native: bool  # the model's own template renders the tools
    starts: tuple[str, ...] = ()  # texts that may open a call (streaming holds text back from them)
    object_args: bool = True  # the template wants a call's arguments as an object, not JSON text
    tokens: tuple[str, ...] = ()  # the format's special tokens (the engine shows them as text)

    @property
    def openers(self) -> tuple[str, ...]:
        return self.starts or (self.marker,)


HERMES = ToolFormat("hermes", "<tool_call>", "arguments", True, tokens=("<tool_call>", "</tool_call>"))
GENERIC = ToolFormat("generic", "<tool_call>", "arguments", False)
QWEN3_CODER = ToolFormat("qwen3_coder", "<tool_call>", "arguments", True,
                         tokens=("<tool_call>", "</tool_call>"))
HARMONY = ToolFormat("harmony", "to=functions.", "arguments", True, starts=("<|", "to=functions."),
                     object_args=False, tokens=("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                                "<|end|>", "<|call|>", "<|return|>"))
DEEPSEEK_R1 = ToolFormat("deepseek_r1", DS_CALLS, "arguments", True, starts=(DS_CALLS, DS_CALL),
                         object_args=False, tokens=(DS_CALLS, DS_CALL, DS_SEP, DS_CALL_END, DS_CALLS_END))
DEEPSEEK_V3 = ToolFormat("deepseek_v3", DS_CALLS, "arguments", True, starts=(DS_CALLS, DS_CALL),
                         object_args=False, tokens=(DS_CALLS, DS_CALL, DS_SEP, DS_CALL_END, DS_CALLS_END))
LLAMA3 = ToolFormat("llama3", '{"name"', "parameters", True, starts=('{"name"', "<|python_tag|>"),
                    tokens=("<|python_tag|>",))
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "arguments", True, tokens=("[TOOL_CALLS]", "[ARGS]"))
FORMATS = {f.name: f for f in (HERMES, GENERIC, QWEN3_CODER, HARMONY, DEEPSEEK_R1, DEEPSEEK_V3, LLAMA3, MISTRAL)}


def detect_format(template: str | None) -> ToolFormat:
    """The tool format a chat template was written for (generic when it renders no tools)."""
    t = template or ""
    if "<|channel|>" in t and "to=functions." in t:
        return HARMONY
    if "tool▁calls▁begin" in t:
        return DEEPSEEK_R1 if "```json" in t else DEEPSEEK_V3
    if "tools" not in t:
        return GENERIC
    if "<function=" in t and "<parameter=" in t:
        return QWEN3_CODER
    if "<tool_call>" in t:
        return HERMES
    if "[TOOL_CALLS]" in t or "[AVAILABLE_TOOLS]" in t:
        return MISTRAL
    if "<|python_tag|>" in t or "ipython" in t:
        return LLAMA3
    return GENERIC


def model_format(model_path: str, template: str | None = None) -> ToolFormat:
    """The tool format the engine will use for this model (from its chat template, or `template` that
    replaces it; generic if unknown)."""
    from ggufdesk.core.gguf_meta import read_gguf

    if template is not None:
        return detect_format(template)
    try:
        return detect_format(read_gguf(model_path).chat_template)
    except Exception:  # noqa: BLE001 - an unreadable header: the engine falls back the same way
        return GENERIC


def check_tools(tools: Any, loose: frozenset[str] | set[str] = frozenset()) -> list[dict[str, Any]]:
    """Validate OpenAI-style tools; returns them normalised ({"type": "function", "function": {...}}).
    Tools named in `loose` may have parameters the grammar cannot enforce (only an object is
    required of their arguments: see loosen)."""
    if not isinstance(tools, list) or not tools:
        raise SchemaError("`tools` must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    if len(tools) > MAX_TOOLS:
        raise SchemaError(f"at most {MAX_TOOLS} tools are supported, got {len(tools)}")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise SchemaError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise SchemaError(f"tools[{i}]: the function name {name!r} must be 1-64 letters, digits, _ . -")
        if name in seen:
            raise SchemaError(f"tools[{i}]: the function name {name!r} is used twice")
        seen.add(name)
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if name in loose:
            if not isinstance(params, dict):
                raise SchemaError(f"tools[{i}] ({name}) parameters must be a JSON schema object")
        else:
            try:
                check_size(params, what="the schema")  # before relax_bounds walks it
                params = relax_bounds(params)
                check_schema(params)
            except SchemaError as e:
                raise SchemaError(f"tools[{i}] ({name}) parameters: {e}") from None
        norm = {"name": name, "parameters": params}
        if isinstance(fn.get("description"), str):
            norm["description"] = fn["description"]
        out.append({"type": "function", "function": norm})
    return out


TOOL_CHOICES = ("auto", "required", "none")


def tool_choice_value(choice: str) -> Any:
    """A conversation's tool choice as the API's tool_choice: auto | required | none, or a name."""
    return choice if choice in TOOL_CHOICES else {"type": "function", "function": {"name": choice}}


def request_fields(structured: str, tool_choice: str = "auto") -> dict[str, Any]:
    """A conversation's structured-output setting as Generate fields: "" (off), "json_object", a
    JSON schema (an object) or tools (a list, called as `tool_choice` says). Raises SchemaError
    naming what is wrong."""
    text = structured.strip()
    if not text:
        return {}
    if text == "json_object":
        return {"json_schema": "json_object"}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SchemaError(f"structured output: not valid JSON ({e})") from None
    if isinstance(value, list):
        tools = check_tools(value)
        choice = tool_choice_value(tool_choice)
        pick_tools(tools, choice)  # a name that is not among the tools is refused here
        return {"tools": tools, "tool_choice": choice}
    return {"json_schema": load_schema(text, source="the structured-output schema")}


def pick_tools(tools: list[dict[str, Any]], choice: Any) -> tuple[list[dict[str, Any]], str]:
    """Apply tool_choice: returns (the tools the model may call, mode) with mode none|auto|required."""
    if choice in (None, "auto"):
        return tools, "auto"
    if choice == "none":
        return [], "none"
    if choice in ("required", "any"):
        return tools, "required"
    name = None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
    if isinstance(name, str):
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise SchemaError(f"tool_choice names {name!r}, which is not among the tools")
        return chosen, "required"
    raise SchemaError("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}")


def loosen(tools: list[dict[str, Any]], names: frozenset[str] | set[str]) -> list[dict[str, Any]]:
    """The tools as the grammar sees them: those in `names` take any JSON object as arguments
    (their own schema is still shown to the model, and the tool's server checks it)."""
    if not names:
        return tools
    return [{"type": "function", "function": {**t["function"], "parameters": {"type": "object"}}}
            if t["function"]["name"] in names else t for t in tools]


def xml_raw(schema: Any) -> bool:
    """Whether Qwen3-Coder's XML calls write a parameter of this schema as raw text (a plain string, or a
    string enum or const); any other value is written as JSON (engine/structured/grammar.py, and
    core/toolcalls.py reads it back the same way). A string the grammar holds to a pattern, a length
    or a format it enforces is JSON too (its rule is the JSON string's); other formats (`uri`, `email`:
    annotations) leave it raw, as the model's template writes it."""
    if not isinstance(schema, dict):
        return False
    words = schema.get("enum", [schema.get("const")]) if {"enum", "const"} & schema.keys() else None
    if words is not None:
        return bool(words) and all(isinstance(w, str) for w in words)
    bounded = {"pattern", "minLength", "maxLength"} & schema.keys() or schema.get("format") in ENFORCED_FORMATS
    return schema.get("type") == "string" and not bounded


def call_schema(tools: list[dict[str, Any]], fmt: ToolFormat) -> dict[str, Any]:
    """The JSON schema of one call to any of `tools` in this format (what the grammar enforces)."""
    alts = []
    for t in tools:
        fn = t["function"]
        alts.append({"type": "object", "properties": {"name": {"const": fn["name"]},
                                                      fmt.args_key: fn["parameters"]},
                     "required": ["name", fmt.args_key]})
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def system_prompt(tools: list[dict[str, Any]]) -> str:
    """How to call tools, for templates that cannot render them (the generic format)."""
    listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return ("You can call functions. The functions, as JSON schemas:\n<tools>\n" + listing + "\n</tools>\n"
            "To call one, reply with exactly:\n<tool_call>\n{\"name\": <function name>, "
            "\"arguments\": <arguments as a JSON object>}\n</tool_call>")


def call_text(call: dict[str, Any]) -> str:
    """An OpenAI-style call as the JSON object models write ({"name": ..., "arguments": {...}})."""
    fn = call.get("function") or {}
    args = fn.get("arguments") or "{}"
    try:
        args_obj = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        args_obj = {}
    return json.dumps({"name": fn.get("name", ""), "arguments": args_obj}, ensure_ascii=False)
