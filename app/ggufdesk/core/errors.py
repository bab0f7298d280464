"""The two kinds of error: the environment's fault (shown plainly) and ours (logged with a trace)."""
from __future__ import annotations


class KnownError(Exception):
    """Something outside our code went wrong: disk full, network gone, bad file, not enough memory.

    The message is written for the user and is shown as it is.
    """


class SettingsError(KnownError, ValueError):
    """A setting that cannot work, refused before the engine sees it."""


class BugError(Exception):
    """Something in ggufdesk itself is wrong; log it with a trace."""


def network_errors() -> tuple[type[BaseException], ...]:
    """The exception types a dropped, refused or timed-out connection raises (through any HTTP library)."""
    errs: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for mod in ("httpx2", "httpx", "requests"):
        try:
            m = __import__(mod)
        except ImportError:
            continue
        errs += [getattr(m, n) for n in ("TransportError", "HTTPError", "RequestException") if hasattr(m, n)]
    return tuple(errs)
