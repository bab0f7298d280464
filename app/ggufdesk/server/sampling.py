"""Sampling settings from an API's request fields, with the model's defaults for whatever is left out."""
from __future__ import annotations

from typing import Any

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.server.errors import invalid
from ggufdesk.server.service import Service

KEPT = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "seed", "think",
        "reasoning_budget")


def sampling_from(svc: Service, model: str, *, max_tokens: int | None, stop: list[str] | None = None,
                  **given: Any) -> SamplingSettings:
    """SamplingSettings from the fields a request gave (None = not given: the server's default with the
    model's preset over it); `given` holds SamplingSettings field names. A value out of range is a 400."""
    d = svc.sampling_defaults(model)
    fields = {name: getattr(d, name) if value is None else value for name, value in given.items()}
    try:
        return SamplingSettings(**{**{k: getattr(d, k) for k in KEPT}, **fields,
                                   "max_tokens": max_tokens or d.max_tokens, "stop": stop or list(d.stop)})
    except SettingsError as e:
        raise invalid(str(e)) from None
