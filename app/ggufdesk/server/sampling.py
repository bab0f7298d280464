"""Sampling settings from an API's request fields, with the server's defaults for whatever is left out."""
from __future__ import annotations

from typing import Any

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.server.errors import invalid
from ggufdesk.server.service import Service


def sampling_from(svc: Service, *, max_tokens: int | None, stop: list[str] | None = None,
                  **given: Any) -> SamplingSettings:
    """SamplingSettings from the fields a request gave (None = not given: the server's default);
    `given` holds SamplingSettings field names. A value out of range is a 400 that names it."""
    d = svc.config.sampling
    fields = {name: getattr(d, name) if value is None else value for name, value in given.items()}
    try:
        return SamplingSettings(**{**{k: getattr(d, k) for k in ("temperature", "top_p", "top_k", "min_p",
                                                              "repeat_penalty", "repeat_last_n", "seed")},
                                   **fields, "max_tokens": max_tokens or svc.config.default_max_tokens,
                                   "stop": stop or list(d.stop)})
    except SettingsError as e:
        raise invalid(str(e)) from None
