"""Reasoning fields of the APIs as the engine's `think` and `reasoning_budget` (core/reasoning.py).

OpenAI: `reasoning_effort` ("none"|"minimal" off, "low"|"medium"|"high"), llama-server's
`chat_template_kwargs: {"enable_thinking": bool}` and `reasoning_budget` (tokens; -1 no limit), Ollama's
`think` (bool or effort). Anthropic: `thinking: {"type": "enabled", "budget_tokens": N}` |
`{"type": "adaptive"}` | `{"type": "disabled"}`. A request that says nothing gets the server's
`--think` and `--reasoning-budget` (its default SamplingSettings).
"""
from __future__ import annotations

from typing import Any

from ggufdesk.core.reasoning import EFFORTS
from ggufdesk.server.errors import invalid


def _budget(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise invalid(f"{param} must be a whole number of tokens (-1: no limit)", param=param)
    return value


def openai_fields(*, effort: Any = None, template_kwargs: Any = None, budget: Any = None,
                  think: Any = None) -> dict[str, Any]:
    """Generate fields for an OpenAI-style request."""
    out: dict[str, Any] = {}
    if effort is not None:
        if effort in ("none", "minimal"):
            out["think"] = False
        elif effort in EFFORTS:
            out["think"] = effort
        else:
            raise invalid("reasoning_effort must be none, minimal, low, medium or high", param="reasoning_effort")
    if isinstance(template_kwargs, dict) and isinstance(template_kwargs.get("enable_thinking"), bool):
        out["think"] = template_kwargs["enable_thinking"]
    if think is not None:
        if not (isinstance(think, bool) or think in EFFORTS):
            raise invalid("think must be true, false, \"low\", \"medium\" or \"high\"", param="think")
        out["think"] = think
    if budget is not None:
        out["reasoning_budget"] = _budget(budget, "reasoning_budget")
    return out


def anthropic_fields(thinking: Any) -> dict[str, Any]:
    """Generate fields for Anthropic's `thinking`."""
    if thinking is None:
        return {}
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return {"think": False}
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        return {"think": True, **({"reasoning_budget": _budget(budget, "thinking.budget_tokens")}
                                  if budget is not None else {})}
    if kind == "adaptive":
        return {}
    raise invalid("thinking.type must be enabled, adaptive or disabled", param="thinking")
