"""What the front ends ask of an engine client: the typed surface EngineClient offers and fakes copy."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine.link import protocol as P

OnEvent = Callable[[P.Event], None]


class EngineAPI(Protocol):
    """engine/link/client.py's EngineClient as the window's bridge (ui/engine_adapter.py) and the
    server's pool (server/pool.py) use it. Events arrive through the `on_event` callback the client
    was made with, on the client's threads."""

    ready: P.Ready | None
    supports_logprobs: bool  # Generate.logprobs is honoured (the server's `logprobs` field)

    @property
    def pid(self) -> int | None: ...

    def problem(self) -> str | None: ...

    def start(self, timeout: float = ..., *, wait: bool = True) -> P.Ready | None: ...

    def load(self, model: str, *, settings: LoadSettings | dict[str, Any] | None = None,
             speculation: SpeculationSettings | dict[str, Any] | None = None, draft: str | None = None,
             wait: bool = True, timeout: float = ...) -> P.Loaded | None: ...

    def generate(self, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                 sampling: SamplingSettings | dict[str, Any] | None = None,
                 speculation: SpeculationSettings | dict[str, Any] | None = None,
                 request_id: str | None = None,
                 logprobs: int = 0, **extra: Any) -> str: ...

    def start_embed(self, inputs: list[str | list[int]], *, truncate: bool = False,
                    request_id: str | None = None) -> str: ...

    def tokenize(self, *, text: str | None = None, messages: list[dict[str, Any]] | None = None,
                 tokens: list[int] | None = None, timeout: float = ..., **options: Any) -> P.Tokenized: ...

    def cancel(self, rid: str) -> None: ...

    def unload(self) -> None: ...

    def shutdown(self, timeout: float = ...) -> None: ...

    def kill(self, reason: str = "") -> None: ...


ClientFactory = Callable[..., EngineAPI]  # called with on_event= (and the client's options)
