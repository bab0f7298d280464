"""llama-server's own endpoints and request extensions: what tools written for llama.cpp's server send.

Native routes: /completion (and /completions, which is the same in llama-server), /tokenize,
/detokenize, /apply-template, /props, /slots, /models. Extensions on any completion request
(LlamaFields): grammar, json_schema, n_probs, n_predict, logit_bias (token ids or texts), ignore_eos,
timings_per_token, return_progress, return_tokens, response_fields, cache_prompt (false: no cached
prefix reused) and verbose (`__verbose`) are honoured; id_slot is accepted (ggufdesk shares one KV pool
across requests); samplers and options ggufdesk does not have (mirostat, typical_p, DRY, XTC, dynatemp,
n_indent, t_max_predict_ms, post_sampling_probs, lora, image data) are refused with a 400 when set to
anything but their neutral value, never silently dropped. Errors use llama-server's shape
({"error": {"code", "message", "type"}}).
"""
from __future__ import annotations

import re
import time
from typing import Any, AsyncIterator, Iterator

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk.engine.link import protocol as P
from ggufdesk.server import reasoning, structured
from ggufdesk.server.errors import ApiError, invalid, native_error, not_supported
from ggufdesk.server.http import caller, event_stream, off_loop, parse_body, service, sse
from ggufdesk.server.sampling import sampling_from
from ggufdesk.server.schemas import ContextOverflow, LlamaFields, LlamaRequest, Strict, stops, validate
from ggufdesk.server.service import GenSpec, Job, Service, complete_all, engine_error

# llama.cpp sampling options ggufdesk does not have, with the value that means "off"
NEUTRAL: dict[str, Any] = {"mirostat": 0, "typical_p": 1.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
                           "dynatemp_range": 0.0, "top_n_sigma": -1.0, "n_indent": 0, "t_max_predict_ms": 0,
                           "post_sampling_probs": False, "min_keep": 0,
                           "presence_penalty": 0.0, "frequency_penalty": 0.0}
MAX_PROMPTS = 64  # prompts in one /completion request (each is a request of its own)
MAX_BIAS = 1 << 16  # logit_bias entries
TOKEN_ID = re.compile(r"\s*[+-]?[0-9]+")  # a logit_bias key read as a token id (as strtol reads it)
REFUSED = ("lora", "image_data", "multimodal_data", "samplers")
MAX_TEXT_PIECES = 256  # texts among the token ids of one request's prompts (each is a round trip to the engine)


def refuse_extensions(req: Any) -> None:
    """A llama.cpp option set to something ggufdesk cannot do is a 400, never dropped silently."""
    for name, neutral in NEUTRAL.items():
        value = getattr(req, name, None)
        if value is not None and value != neutral:
            raise not_supported(f"{name} (ggufdesk samples with temperature, top_k, top_p, min_p, repeat_penalty "
                                "and seed)" if name not in ("ignore_eos", "post_sampling_probs") else name)
    for name in REFUSED:
        if getattr(req, name, None):
            raise not_supported(name)


def bias_fields(req: Any) -> dict[str, Any]:
    """Generate's logit_bias ({id: bias or None for never}) and logit_bias_text ([[text, bias]]) from
    OpenAI's {"id": bias} or llama.cpp's [[id or text, bias or false]] and {"text": bias}, and ignore_eos.
    As in llama-server, a key that is a whole number is a token id, any other is a text whose tokens
    all get the bias (the engine tokenizes it)."""
    out: dict[str, Any] = {"ignore_eos": True} if getattr(req, "ignore_eos", False) else {}
    raw = getattr(req, "logit_bias", None)
    if not raw:
        return out
    pairs = raw.items() if isinstance(raw, dict) else [tuple(p) for p in raw]
    if len(pairs) > MAX_BIAS:
        raise invalid(f"logit_bias: at most {MAX_BIAS} entries", param="logit_bias")
    ids: dict[str, float | None] = {}
    texts: list[list[Any]] = []
    for pair in pairs:
        key, value = _bias_pair(pair, by_name=isinstance(raw, dict))
        if isinstance(key, int):
            ids[str(key)] = value
        else:
            texts.append([key, value])
    return {**out, **({"logit_bias": ids} if ids else {}), **({"logit_bias_text": texts} if texts else {})}


def _bias_pair(pair: tuple[Any, ...], *, by_name: bool) -> tuple[int | str, float | None]:
    """(token id or text, bias or None for never) of one logit_bias entry; a 400 for a malformed one."""
    if len(pair) != 2 or isinstance(pair[0], (bool, float)) or not _is_bias(pair[1]):
        raise invalid("logit_bias: give {\"token id or text\": bias} or [[token id or text, bias or false]] "
                      "(bias: a number, or false for never)", param="logit_bias")
    key, value = pair
    if isinstance(key, str) and by_name and TOKEN_ID.fullmatch(key):
        key = int(key)
    return key, None if value is False else float(value)


def _is_bias(value: Any) -> bool:
    return value is False or (isinstance(value, (int, float)) and not isinstance(value, bool))


def extension_structured(req: LlamaFields, response_format: dict[str, Any] | None = None) -> dict[str, Any]:
    """Generate's structured fields from grammar, json_schema or response_format (with llama.cpp's
    {"type": "json_object", "schema": ...} form); at most one of them; the logit bias; cache_prompt."""
    return {**_constraint(req, response_format), **bias_fields(req),
            **({} if req.cache_prompt else {"cache_prompt": False})}


def _constraint(req: LlamaFields, response_format: dict[str, Any] | None) -> dict[str, Any]:
    given = [n for n, v in (("grammar", req.grammar), ("json_schema", req.json_schema),
                            ("response_format", response_format)) if v]
    if len(given) > 1:
        raise invalid(f"use one of {' and '.join(given)}", param=given[1])
    if req.grammar:
        return {"grammar": req.grammar}
    if req.json_schema:
        return {"json_schema": structured.response_format({"type": "json_schema",
                                                           "json_schema": {"schema": req.json_schema}})}
    if response_format and response_format.get("type") == "json_object" and "schema" in response_format:
        return {"json_schema": structured.response_format({"type": "json_schema",
                                                           "json_schema": {"schema": response_format["schema"]}})}
    schema = structured.response_format(response_format)
    return {"json_schema": schema} if schema is not None else {}


def timings(job: Job) -> dict[str, Any]:
    """llama-server's `timings` (Job.timings: /metrics counts the same figures)."""
    return job.timings()


def progress(ev: P.Progress, t0: float) -> dict[str, Any]:
    """llama-server's prompt_progress: the whole prompt, the cached part, what is read so far."""
    total = ev.n_prompt or ev.total
    cached = total - ev.total
    return {"total": total, "cache": cached, "processed": cached + ev.done,
            "time_ms": (time.perf_counter() - t0) * 1000}


def probabilities(items: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """completion_probabilities: each token with its logprob and the top n."""
    def one(t: dict[str, Any]) -> dict[str, Any]:
        return {"id": t.get("id", -1), "token": t["token"], "bytes": list(t["token"].encode("utf-8")),
                "logprob": t["logprob"]}

    return [{**one(t), "top_logprobs": [one(x) for x in (t.get("top") or [])[:n]]} for t in items]


# ---- /completion --------------------------------------------------------------------------------------


class CompletionRequest(LlamaRequest):
    # text, token ids, text and ids mixed, {"prompt_string": ...}, or a list of those (prompts_of)
    prompt: str | dict[str, Any] | list[Any] = ""
    temperature: float | int | None = Field(None, ge=0, le=5)
    repeat_last_n: int | None = Field(None, ge=-1)
    seed: int | None = None  # (a negative seed: a random one, as llama-server takes it)
    response_fields: list[str] | None = None
    model: str | None = None
    context_overflow: ContextOverflow = None  # ours, as on every API (docs/context.md)


Prompt = str | list[int | str]  # one prompt: text, or token ids with text among them


def prompts_of(prompt: str | dict[str, Any] | list[Any]) -> list[Prompt]:
    """llama-server's prompt forms: text, token ids (text may stand among them: [12, "text", 34]),
    {"prompt_string": either of those}, or a list of such prompts (a list with a number at its top is
    one prompt). A 400 for anything else."""
    if isinstance(prompt, list) and not any(_is_id(p) for p in prompt):
        if not prompt:
            raise invalid("prompt must not be empty", param="prompt")
        if len(prompt) > MAX_PROMPTS:
            raise invalid(f"at most {MAX_PROMPTS} prompts in one request, got {len(prompt)}", param="prompt")
        out = [_one_prompt(p) for p in prompt]
    else:
        out = [_one_prompt(prompt)]
    if sum(isinstance(x, str) for p in out if isinstance(p, list) for x in p) > MAX_TEXT_PIECES:
        raise invalid(f"at most {MAX_TEXT_PIECES} texts among the token ids of a request's prompts", param="prompt")
    return out


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _one_prompt(p: Any) -> Prompt:
    if isinstance(p, dict):
        if p.get("multimodal_data"):
            raise not_supported("multimodal_data (this model reads text only)")
        if "prompt_string" not in p:
            raise invalid("a prompt object needs \"prompt_string\"", param="prompt")
        p = p["prompt_string"]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(_is_id(x) or isinstance(x, str) for x in p):
        return list(p)
    raise invalid("each prompt must be a string, a list of token ids (text may stand among them) or "
                  "{\"prompt_string\": ...}", param="prompt")


async def prompt_input(svc: Service, model: str, p: Prompt) -> dict[str, Any]:
    """GenSpec's prompt or prompt_tokens for one prompt: text among token ids is tokenized here (the
    first piece with the model's BOS when it is text, as llama-server does)."""
    if isinstance(p, str):
        return {"prompt": p}
    tokens: list[int] = []  # (prompts_of bounds the texts: each one is a round trip)
    for i, x in enumerate(p):
        if isinstance(x, str):
            tokens += (await svc.tokenize(model, text=x, add_special=i == 0, parse_special=True)).tokens
        else:
            tokens.append(x)
    if not tokens:
        raise invalid("prompt must not be empty", param="prompt")
    return {"prompt_tokens": tokens}


def pieces_text(pieces: list[str | list[int]] | None) -> str:
    """Tokens' pieces (Tokenized.pieces) joined into their text."""
    return b"".join(p.encode("utf-8") if isinstance(p, str) else bytes(p) for p in pieces or []).decode(
        "utf-8", "replace")


async def prompt_echo(svc: Service, model: str, spec: GenSpec) -> str:
    """The prompt as the model read it, its special tokens as text (llama-server's `prompt` and
    `__verbose.prompt`: "<s> I believe..."); a prompt that cannot be read again gives its text."""
    if spec.messages is not None:
        fields: dict[str, Any] = {"messages": spec.messages, "tools": spec.structured.get("tools"),
                                  "tool_choice": spec.structured.get("tool_choice"),
                                  "think": spec.reasoning.get("think")}
    elif spec.prompt_tokens is not None:
        fields = {"tokens": spec.prompt_tokens}
    else:
        fields = {"text": spec.prompt or "", "add_special": True, "parse_special": True}
    try:
        return pieces_text((await svc.tokenize(model, with_pieces=True, **fields)).pieces)
    except ApiError:
        return spec.prompt or ""


def settings_of(svc: Service, req: CompletionRequest, model: str) -> Any:
    n = req.n_predict
    max_tokens = None if n is None else (1 << 20) if n < 0 else max(1, n)
    seed = None if req.seed is None else req.seed if 0 <= req.seed < 2**32 else -1
    return sampling_from(svc, model, max_tokens=max_tokens, stop=stops(req.stop), temperature=req.temperature,
                         top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, repeat_penalty=req.repeat_penalty,
                         repeat_last_n=req.repeat_last_n, seed=seed, context_overflow=req.context_overflow)


def generation_settings(job: Job, req: LlamaRequest) -> dict[str, Any]:
    """llama-server's generation_settings; logit_bias as the sampler applied it (text keys as their tokens,
    ignore_eos's end-of-generation tokens with null: never)."""
    s = job.spec.sampling
    applied = job.done.logit_bias if job.done is not None else []
    return {"n_predict": s.max_tokens, "seed": s.seed, "temperature": s.temperature, "top_k": s.top_k,
            "top_p": s.top_p, "min_p": s.min_p, "repeat_penalty": s.repeat_penalty, "repeat_last_n": s.repeat_last_n,
            "stop": list(s.stop), "n_probs": req.n_probs or 0, "ignore_eos": req.ignore_eos,
            "logit_bias": [{"token": t, "bias": b} for t, b in applied],
            "grammar": req.grammar or "", "stream": req.stream, "cache_prompt": req.cache_prompt}


def stop_type(job: Job) -> str:
    done = job.done
    if done is None:
        return "none"
    if done.finish_reason in ("length", "context"):
        return "limit"
    return "word" if done.stop else "eos"


def final_fields(job: Job, req: LlamaRequest, model: str, content: str, prompt: str) -> dict[str, Any]:
    """llama-server's native answer (/completion's, and `__verbose` elsewhere); `prompt` as prompt_echo gives it."""
    done = job.done
    out = {"index": 0, "content": content, "tokens": list(done.tokens) if done and req.return_tokens else [],
           "id_slot": 0, "stop": True, "model": model, "tokens_predicted": job.completion_tokens,
           "tokens_evaluated": job.prompt_tokens, "generation_settings": generation_settings(job, req),
           "prompt": prompt, "has_new_line": "\n" in content,
           "truncated": bool(getattr(done, "truncated", False) or job.truncated_tokens), "stop_type": stop_type(job),
           "stopping_word": (done.stop or "") if done else "",
           "tokens_cached": job.stats.n_reused if job.stats else 0, "timings": timings(job)}
    if req.n_probs:
        out["completion_probabilities"] = probabilities(job.logprobs, req.n_probs)
    return {**out, **job.context_fields()}


def pick(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama-server's response_fields: only these, nested ones named with a slash."""
    if not fields:
        return body
    out: dict[str, Any] = {}
    for f in fields:
        node: Any = body
        for part in f.split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out[f] = node
    return out


async def completion(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, CompletionRequest)
    refuse_extensions(req)
    model = svc.check_model(req.model)
    prompts = prompts_of(req.prompt)
    if len(prompts) > 1 and req.stream:
        raise not_supported("streaming several prompts at once")
    extra = await off_loop(extension_structured, req)
    inputs = [await prompt_input(svc, model, p) for p in prompts]
    jobs = []
    try:
        for given in inputs:
            spec = GenSpec(endpoint="completion", sampling=settings_of(svc, req, model), model=model, structured=extra,
                           logprobs=max(1, req.n_probs) if req.n_probs else 0, stream=req.stream, **given)
            jobs.append(await svc.start(caller(request), spec, request.receive))
    except BaseException:
        for j in jobs:
            j.close()
        raise
    if req.stream:
        return event_stream(_stream(svc, jobs[0], req, model))
    await complete_all(jobs)
    bodies = [pick({**final_fields(job, req, model, "".join(job.text),
                                   await prompt_echo(svc, model, job.spec) if _echo(req) else ""), "index": i},
                   req.response_fields) for i, job in enumerate(jobs)]
    return JSONResponse(bodies[0] if len(bodies) == 1 else bodies)


def _echo(req: CompletionRequest) -> bool:
    """Whether the answer carries the prompt (echoing it costs a tokenize round trip to the engine)."""
    return not req.response_fields or "prompt" in req.response_fields


async def _stream(svc: Service, job: Job, req: CompletionRequest, model: str) -> AsyncIterator[str]:
    t0 = time.perf_counter()
    try:
        async for ev in job.events():
            if job.disconnected:
                return
            prompt = await prompt_echo(svc, model, job.spec) if isinstance(ev, P.Done) and _echo(req) else ""
            for chunk in _chunks(ev, job, req, model, t0, prompt):
                yield sse(chunk)
    finally:
        job.close()


def _chunks(ev: Any, job: Job, req: CompletionRequest, model: str, t0: float,
            prompt: str) -> Iterator[dict[str, Any]]:
    head = {"index": 0, "id_slot": 0, "stop": False, "model": model}
    if isinstance(ev, P.Progress) and req.return_progress:
        yield {**head, "content": "", "prompt_progress": progress(ev, t0)}
    elif isinstance(ev, P.Token):
        chunk: dict[str, Any] = {**head, "content": ev.text, "tokens": []}
        if req.n_probs and ev.logprobs:
            chunk["completion_probabilities"] = probabilities(ev.logprobs, req.n_probs)
        if req.timings_per_token:
            chunk["timings"] = timings(job)
        yield chunk
    elif isinstance(ev, P.Done):  # the final chunk keeps to response_fields too, as llama-server's
        yield pick({**final_fields(job, req, model, "", prompt), "content": ""}, req.response_fields)
    elif isinstance(ev, P.Error):
        yield native_error(engine_error(ev))


# ---- tokenize, detokenize, apply-template ------------------------------------------------------------


class TokenizeRequest(Strict):
    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Strict):
    tokens: list[int] = Field(default_factory=list)


class TemplateRequest(Strict):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    add_generation_prompt: bool = True
    # the think setting, as on /chat/completions (server/reasoning.py); none given: the server's --think
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    think: bool | str | None = None


async def tokenize(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, TokenizeRequest)
    out = await svc.tokenize(svc.model_id, text=req.content, add_special=req.add_special,
                             parse_special=req.parse_special, with_pieces=req.with_pieces)
    if req.with_pieces:
        return JSONResponse({"tokens": [{"id": t, "piece": p} for t, p in zip(out.tokens, out.pieces or [])]})
    return JSONResponse({"tokens": out.tokens})


async def detokenize(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, DetokenizeRequest)
    out = await svc.tokenize(svc.model_id, tokens=req.tokens)
    return JSONResponse({"content": out.text})


async def apply_template(request: Request) -> Response:
    from ggufdesk.server.openai import chat_messages
    from ggufdesk.server.schemas import ChatRequest

    svc = service(request)
    req = await parse_body(request, TemplateRequest)
    msgs = chat_messages(validate(ChatRequest, {"model": "", "messages": req.messages}))
    tools = structured.openai_tools(req.tools, req.tool_choice, True) if req.tools else {}
    think = reasoning.openai_fields(effort=req.reasoning_effort, template_kwargs=req.chat_template_kwargs,
                                    think=req.think).get("think")
    out = await svc.tokenize(svc.model_id, messages=msgs, tools=tools.get("tools"), think=think,
                             tool_choice=tools.get("tool_choice"), add_generation_prompt=req.add_generation_prompt)
    return JSONResponse({"prompt": out.text})


# ---- props, slots, models ------------------------------------------------------------------------------


async def props(request: Request) -> Response:
    svc = service(request)
    m = svc.models()[0]
    s = svc.config.sampling
    params = {"n_predict": svc.config.default_max_tokens, "seed": s.seed, "temperature": s.temperature,
              "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "repeat_penalty": s.repeat_penalty,
              "repeat_last_n": s.repeat_last_n, "stop": list(s.stop), "n_probs": 0}
    return JSONResponse({
        "default_generation_settings": {"id": 0, "n_ctx": m.get("n_ctx", 0), "is_processing": False,
                                        "params": params},
        "total_slots": svc.config.parallel, "model_alias": svc.model_id, "model_path": m["path"],
        "chat_template": m.get("chat_template") or "", "modalities": {"vision": False, "audio": False},
        "build_info": f"ggufdesk {_version()}", "is_sleeping": False,
    })


async def slots(request: Request) -> Response:
    svc = service(request)
    if not svc.config.slots:
        raise ApiError(501, "this server does not support the slots endpoint (start it with --slots)",
                       code="not_supported", reason="invalid")
    n_ctx = svc.models()[0].get("n_ctx", 0)
    busy = svc.admission.running
    return JSONResponse([{"id": i, "n_ctx": n_ctx, "is_processing": i < busy} for i in range(svc.config.parallel)])


async def models(request: Request) -> Response:
    """llama-server's /models: the OpenAI list (with aliases) and its own `models` list."""
    svc = service(request)
    created = svc.created
    data, native = [], []
    for m in svc.models():
        data.append({"id": m["id"], "object": "model", "created": created, "owned_by": "ggufdesk",
                     "aliases": sorted({m["id"], *(m.get("aliases") or [])}), "tags": list(svc.config.tags),
                     "meta": {"n_ctx_train": m["context_length"], "n_params": m["n_params"], "size": m["size_bytes"]}})
        native.append({"name": m["id"], "model": m["id"], "size": m["size_bytes"], "digest": m["digest"],
                       "capabilities": m["capabilities"], "details": {"format": "gguf", "family": m["family"],
                                                                      "quantization_level": m["quant"]}})
    return JSONResponse({"object": "list", "data": data, "models": native})


def _version() -> str:
    from ggufdesk import __version__

    return __version__


ROUTES = [
    Route("/completion", completion, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/props", props, methods=["GET"]),
    Route("/slots", slots, methods=["GET"]),
    Route("/models", models, methods=["GET"]),
]
