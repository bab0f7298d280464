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
