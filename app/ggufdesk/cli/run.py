"""`ggufdesk run MODEL --prompt TEXT`: one generation through the engine process, as the GUI does it."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, overload

from ggufdesk.cli.worker import add_rpc_argument, describe_split, rpc_from_args
from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import OVERFLOW_POLICIES, LoadSettings, Preset, SamplingSettings, SpeculationSettings

if TYPE_CHECKING:
    from ggufdesk.engine.link.protocol import ErrorKind

NAME = "run"
HELP = "generate once from a prompt (through the engine process) and print text or JSON stats"


# Flags that a model's preset may set: given on the command line they win; left out, the preset (its
# section of the settings file, keyed by library id) applies, then the defaults. flag -> (section, fields)
PRESET_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ctx": ("load", ("n_ctx",)), "gpu_layers": ("load", ("n_gpu_layers",)), "batch": ("load", ("n_batch",)),
    "ubatch": ("load", ("n_ubatch",)), "threads": ("load", ("n_threads",)),
    "threads_batch": ("load", ("n_threads_batch",)), "flash_attn": ("load", ("flash_attn",)),
    "kv_type": ("load", ("type_k", "type_v")), "temperature": ("sampling", ("temperature",)),
    "top_k": ("sampling", ("top_k",)), "top_p": ("sampling", ("top_p",)), "min_p": ("sampling", ("min_p",)),
    "repeat_penalty": ("sampling", ("repeat_penalty",)), "seed": ("sampling", ("seed",)),
    "max_tokens": ("sampling", ("max_tokens",)), "draft_max": ("speculation", ("k_max",)),
    "n_cpu_moe": ("load", ("n_cpu_moe",)), "reasoning_budget": ("sampling", ("reasoning_budget",)),
    "think": ("sampling", ("think",)), "context_overflow": ("sampling", ("context_overflow",)),
}


def add_model_arguments(p: argparse.ArgumentParser, *, many: bool = False) -> None:
    """Load and sampling flags shared by `run`, `chat` and `serve` (defaults in brackets: a model's preset
    in the settings file comes before them, a flag given here before the preset)."""
    if many:
        p.add_argument("model", nargs="*", help="model paths or library ids (`ggufdesk library`); none: the "
                                                "whole library, each loaded when a request names it")
    else:
        p.add_argument("model", nargs="?", help="a .gguf path or a library id (`ggufdesk library`; default: "
                                                "the offline chat starter, smollm2-135m-instruct)")
    p.add_argument("--ctx", type=int, help="context length in tokens [4096]")
    p.add_argument("--threads", type=int,
                   help="decode threads (0 = the physical cores it may use, a hybrid CPU's fast ones) [0]")
    p.add_argument("--threads-batch", type=int, help="prefill threads (0 = the same default as --threads) [0]")
    p.add_argument("--batch", type=int, help="n_batch: prompt tokens per decode call [512]")
    p.add_argument("--ubatch", type=int, help="n_ubatch: physical micro-batch [512, at most --batch]")
    p.add_argument("--gpu-layers", type=int, help="layers to offload (-1 = all) [0]")
    p.add_argument("--n-cpu-moe", type=int, metavar="N",
                   help="mixture of experts: keep the experts of the first N layers in RAM (`plan` proposes N) [0]")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), help="[auto]")
    p.add_argument("--kv-type", help="KV cache type (f16, q8_0, q4_0, ...) [f16]")
    p.add_argument("--no-mmap", action="store_true", help="read the whole model into RAM")
    p.add_argument("--max-tokens", type=int, help="[256; serve: 1024]")
    p.set_defaults(default_max_tokens=256)
    p.add_argument("--temperature", type=float, help="[0.8]")
    p.add_argument("--top-k", type=int, help="[40]")
    p.add_argument("--top-p", type=float, help="[0.95]")
    p.add_argument("--min-p", type=float, help="[0.05]")
    p.add_argument("--repeat-penalty", type=float, help="[1.0]")
    p.add_argument("--seed", type=int, help="[-1: a new one each time]")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--context-overflow", choices=OVERFLOW_POLICIES,
                   help="a prompt longer than the context: error (refuse), rolling (drop older turns), "
                        "truncate-middle (cut its middle), shift (drop the oldest tokens while generating) "
                        "[run, serve: error; chat: rolling]")
    p.set_defaults(default_context_overflow="error")
    p.add_argument("--reasoning-budget", type=int, metavar="N",
                   help="reasoning models: tokens of thinking before the answer is forced (-1 = no limit) [-1]")
    p.add_argument("--think", choices=("auto", "on", "off", "low", "medium", "high"),
                   help="reasoning models: thinking on or off, or its effort (auto = the template's default) [auto]")
    spec = p.add_mutually_exclusive_group()
    spec.add_argument("--draft", help="draft model (.gguf path or library id) for speculative decoding")
    spec.add_argument("--lookup", action="store_true", help="prompt-lookup speculative decoding")
    p.add_argument("--draft-max", type=int, help="longest draft (K max) [16]")
    p.add_argument("--no-adaptive", action="store_true", help="keep the draft length fixed at --draft-max")
    p.add_argument("--mmproj", metavar="FILE", default=None,
                   help="a vision model's projector (default: the mmproj-*.gguf beside the model; 'none': no images)")
    add_rpc_argument(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--prompt", required=True, help="the prompt text ('-' reads standard input)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    p.add_argument("--system", default="", help="system prompt (with --chat)")
    p.add_argument("--image", metavar="FILE", action="append", default=[],
                   help="an image for a vision model (repeatable; PNG, JPEG, WebP); implies --chat")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", help="constrain the output to this JSON schema")
    shape.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    shape.add_argument("--tools", metavar="FILE", help="OpenAI-style tools (JSON list) the model may call")
    p.add_argument("--tool-choice", default="auto",
                   help="auto | required | none | the name of one tool (with --tools)")
    from ggufdesk.cli import mcp_tools

    mcp_tools.add_arguments(p, interactive=False)


def structured_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The Generate fields for --json-schema / --json-object / --tools (checked here, before loading)."""
    import json
    from pathlib import Path

    from ggufdesk.core import schema as S
    from ggufdesk.core import tools as T

    def read(path: str, what: str) -> str:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise KnownError(f"could not read the {what} file {path}: {e}") from None

    if args.json_object:
        return {"json_schema": "json_object"}
    if args.json_schema:
        return {"json_schema": S.load_schema(read(args.json_schema, "schema"), source=args.json_schema)}
    if args.tools:
        try:
            tools = json.loads(read(args.tools, "tools"))
        except ValueError as e:
            raise KnownError(f"{args.tools} is not valid JSON: {e}") from None
        checked = T.check_tools(tools)
        choice = args.tool_choice
        if choice not in ("auto", "required", "none"):
            choice = {"type": "function", "function": {"name": choice}}
        T.pick_tools(checked, choice)
        return {"tools": checked, "tool_choice": choice}
    return {}


def given_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The settings the command line sets explicitly, by section (what a preset must not override)."""
    given: dict[str, dict[str, Any]] = {"load": {}, "sampling": {}, "speculation": {}}
    for flag, (section, names) in PRESET_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            given[section].update(dict.fromkeys(names, value))
    if getattr(args, "no_mmap", False):
        given["load"]["use_mmap"] = False
    if getattr(args, "rpc", None):
        given["load"]["rpc"] = rpc_from_args(args)
    if getattr(args, "stop", None):
        given["sampling"]["stop"] = list(args.stop)
    if getattr(args, "draft", None):
        given["speculation"].update(mode="draft", draft_model=library_file(args.draft))
    elif getattr(args, "lookup", False):
        given["speculation"]["mode"] = "lookup"
    if getattr(args, "no_adaptive", False):
        given["speculation"]["adaptive"] = False
    return given


def settings_from_args(args: argparse.Namespace, preset: Preset | None = None,
                       ) -> tuple[LoadSettings, SamplingSettings, SpeculationSettings]:
    """Defaults, then the model's preset, then what the command line says."""
    given = given_settings(args)
    layers = [preset.known(name) if preset else {} for name in ("load", "sampling", "speculation")]
    load = {**layers[0], **given["load"]}
    if "n_ubatch" not in load:  # the micro-batch follows a smaller batch unless set
        load["n_ubatch"] = min(LoadSettings().n_ubatch, load.get("n_batch", LoadSettings().n_batch))
    sampling = {"max_tokens": getattr(args, "default_max_tokens", 256),
                "context_overflow": getattr(args, "default_context_overflow", "error"),
                **layers[1], **given["sampling"]}
    spec = {**layers[2], **given["speculation"]}
    if spec.get("draft_model"):
        spec["draft_model"] = library_file(spec["draft_model"])
    return LoadSettings(**load), SamplingSettings(**sampling), SpeculationSettings(**spec)


def preset_for(model: str) -> tuple[str, Preset | None]:
    """The model's library id and its preset from the settings file (a broken file: a warning, no preset)."""
    from ggufdesk.core import library
    from ggufdesk.core.errors import SettingsError
    from ggufdesk.core.settings import load_settings

    model_id = library.id_for(model)
    try:
        settings = load_settings()
    except SettingsError as e:
        print(f"ggufdesk: presets not used: {e}", file=sys.stderr)
        return model_id, None
    return model_id, settings.presets.get(model_id)


@overload
def library_file(name: str) -> str: ...
@overload
def library_file(name: None) -> None: ...
def library_file(name: str | None) -> str | None:
    """A library id as its file; anything else (a path, even a missing one) unchanged, for the engine to judge."""
    if not name or "/" in name or name.lower().endswith(".gguf"):
        return name
    from ggufdesk.core import library

    hit = library.find(name, library.entries())
    return str(library.file_for(hit)) if hit is not None else name


def resolve_model(model: str | None) -> str:
    """A path or library id as the file to load; nothing means the default (chat) starter."""
    from ggufdesk.core import library

    return library.resolve(model)


def mcp_host(args: argparse.Namespace, structured: dict[str, Any]) -> Any:
    """The MCP host when this run offers MCP tools (--mcp-config or --allow-tools), else None."""
    if not (args.mcp_config or args.allow_tools):
        return None
    if structured:
        raise KnownError("MCP tools (--mcp-config, --allow-tools) cannot be combined with --tools, --json-schema "
                         "or --json-object")
    from ggufdesk.cli import mcp_tools

    return mcp_tools.open_host(args, err=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from ggufdesk.cli import preflight

    model = resolve_model(args.model)
    _, preset = preset_for(model)
    load, sampling, spec = settings_from_args(args, preset)
    if not args.system and preset is not None and preset.system_prompt:
        args.system = preset.system_prompt  # the model's own system prompt, unless one is given
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    structured = structured_from_args(args)
    if structured.get("tools") and not args.chat:
        args.chat = True  # tools are offered through the chat template
    images = read_images(args.image)  # refused here, before anything loads
    if images:
        args.chat = True  # images go in a user message, through the chat template
    host = mcp_host(args, structured)
    if host is not None:
        args.chat = True
    info = preflight.check(model, load, spec)  # before the engine: broken files, a plan that cannot fit
    try:
        return _run(args, model, info, load, sampling, spec, prompt, structured, host, images)
    finally:
        if host is not None:
            host.close()


def read_images(paths: list[str]) -> dict[str, bytes]:
    """--image files by sha256, each checked (format, size, pixels) before the model loads."""
    from ggufdesk.core import images as img

    out: dict[str, bytes] = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read(img.MAX_BYTES + 1)
        except OSError as e:
            raise KnownError(f"could not read the image {path}: {e.strerror or e}") from None
        try:
            img.check(data)
        except img.ImageError as e:
            raise KnownError(f"{path}: {e}") from None
        out[img.sha256(data)] = data
    return out


def mmproj_from_args(args: argparse.Namespace) -> str | None:
    """--mmproj as the load's projector: a file, '' (none), or None (the one beside the model)."""
    value = getattr(args, "mmproj", None)
    if value is None:
        return None
    return "" if value.lower() == "none" else value


def _run(args: argparse.Namespace, model: str, info: Any, load: LoadSettings, sampling: SamplingSettings,
         spec: SpeculationSettings, prompt: str, structured: dict[str, Any], host: Any,
         images: dict[str, bytes]) -> int:
    from ggufdesk.cli import print_json
    from ggufdesk.engine.link import protocol as P
    from ggufdesk.engine.link.client import EngineClient

    rounds: list[dict[str, Any]] | None = None
    with EngineClient(auto_restart=False) as client:
        loaded = client.load(model, settings=load, speculation=spec, mmproj=mmproj_from_args(args))
        notices = {e.kind: e.message for e in client.events(timeout=0)
                   if isinstance(e, P.Error) and e.kind in P.LOAD_NOTICE_KINDS}
        _check_loaded(args, info, spec, loaded, notices, model, images)
        if host is not None:
            from ggufdesk.cli import mcp_tools

            text, stats, done, rounds = mcp_tools.run_once(client, loaded, host, args, prompt, sampling)
        else:
            text, stats, done = _generate(client, args, prompt, sampling, structured, images)
    result = _result(model, loaded, text, stats, done, rounds, images)
    if args.json:
        print_json(result)
    else:
        if not result["text"].endswith("\n"):
            print()  # the text is a line of its own: the shell prompt (or the next line in a file) starts fresh
        print(f"[{result['tokens']} tokens, TTFT {result['ttft_s'] or 0:.3f} s, prefill "
              f"{result['prefill_tok_s'] or 0:.1f} tok/s, decode {result['decode_tok_s'] or 0:.1f} tok/s"
              + (f" ({result['threads']} thread{'s' if result['threads'] > 1 else ''})" if result["threads"] else "")
              + (f", accepted {result['accepted']}/{result['drafted']}" if result["drafted"] else "")
              + f", {result['finish_reason']}]", file=sys.stderr)
    return 0


def _check_loaded(args: argparse.Namespace, info: Any, spec: SpeculationSettings, loaded: Any,
                  notices: dict[ErrorKind, str], model: str, images: dict[str, bytes]) -> None:
    """Refuse a load that lost what was asked for (the draft model; the projector for images; the chat
    template with --chat)."""
    if spec.mode == "draft" and not loaded.draft:
        raise KnownError(f"the draft model {spec.draft_model} was refused: "
                         f"{notices.get('draft', 'the engine did not load it')}")
    if images and not loaded.mmproj:
        raise KnownError(notices.get("projector") or no_projector(model))
    if args.chat and info.chat_template is not None and loaded.chat_format != "template":
        raise KnownError(f"--chat: {notices.get('template', 'the model chat template was refused')} "
                         "(without --chat the prompt is sent as plain text)")
    if loaded.rpc and not args.json:
        print(f"[{describe_split(loaded.rpc)}]", file=sys.stderr)


def _result(model: str, loaded: Any, text: str, stats: dict[str, Any], done: Any,
            rounds: list[dict[str, Any]] | None, images: dict[str, bytes]) -> dict[str, Any]:
    """The `run --json` object (docs/architecture.md, "The CLI contract"): the answer, its figures and the load's."""
    result: dict[str, Any] = {
        "model": model, "text": text, "tokens": stats.get("n_gen", 0),
        "prompt_tokens": stats.get("n_prompt", 0),
        "ttft_s": stats.get("ttft_s"), "prefill_tok_s": stats.get("prefill_tok_s"),
        "decode_tok_s": stats.get("decode_tok_s"),
        "drafted": stats.get("drafted", 0), "accepted": stats.get("accepted", 0),
        "draft_len": stats.get("draft_len", 0), "speculation": stats.get("speculation", "off"),
        "threads": stats.get("threads", 0),
        "llama_perf": stats.get("llama_perf", {}),
        "finish_reason": done.finish_reason if done else None,
        "tool_calls": done.tool_calls if done else [],
        "cached_tokens": done.usage.get("cached_tokens", 0) if done else 0,
        "truncated_tokens": done.usage.get("truncated_tokens", 0) if done else 0,
        "context_overflow": done.overflow if done else "",
    }
    usage = done.usage if done else {}
    if loaded.reasoning:
        result["reasoning"] = (done.reasoning if done else None) or ""
        result["reasoning_tokens"] = usage.get("reasoning_tokens", 0)
    result.update({"chat_format": loaded.chat_format, "load_s": loaded.load_s, "memory": loaded.memory})
    if images:
        result.update({"images": len(images), "image_tokens": usage.get("image_tokens", 0), "mmproj": loaded.mmproj})
    if loaded.rpc:
        result["rpc"] = loaded.rpc
    if rounds is not None:
        result["tool_rounds"] = rounds
    return result


def no_projector(model: str) -> str:
    """Why a model cannot take images, and how to get its projector."""
    from ggufdesk.core.library import projector_hint

    return f"{model} reads text only: no vision projector (mmproj) was found beside it. " + projector_hint(model)


def _generate(client: Any, args: argparse.Namespace, prompt: str, sampling: SamplingSettings,
              structured: dict[str, Any], images: dict[str, bytes] | None = None) -> tuple[str, dict[str, Any], Any]:
    """One generation, streamed to stdout unless --json: (text, the final stats, the Done event)."""
    import base64
    import dataclasses

    from ggufdesk.engine.link import protocol as P

    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        content: Any = prompt
        extra: dict[str, Any] = {}
        if images:
            content = [{"type": "image", "image": k} for k in images] + [{"type": "text", "text": prompt}]
            extra["images"] = {k: base64.b64encode(v).decode("ascii") for k, v in images.items()}
        rid = client.generate(messages=msgs + [{"role": "user", "content": content}], sampling=sampling,
                              **structured, **extra)
    else:
        rid = client.generate(prompt=prompt, sampling=sampling, **structured)
    text: list[str] = []
    stats: dict[str, Any] = {}
    done = None
    for ev in client.stream(rid):
        if isinstance(ev, P.Token):
            if not ev.reasoning:
                text.append(ev.text)
            if not args.json:  # a reasoning model's thinking on stderr, the answer on stdout
                out = sys.stderr if ev.reasoning else sys.stdout
                out.write(ev.text)
                out.flush()
        elif isinstance(ev, P.Stats):
            stats = dataclasses.asdict(ev)
        elif isinstance(ev, P.Overflow) and not args.json:
            from ggufdesk.session.prompt import context_note

            print(f"[{context_note(ev)}]", file=sys.stderr)
        elif isinstance(ev, P.Done):
            done = ev
        elif isinstance(ev, P.Error):
            raise KnownError(ev.message)
    return "".join(text), stats, done

