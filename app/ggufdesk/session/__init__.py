"""A conversation's lifecycle without Qt: the answer state machine and the history write path.

The GUI window, the terminal chat and the local server all drive a conversation through this
package (docs/architecture.md, "The session layer"); it uses core/ and the engine client, never Qt.
"""
from __future__ import annotations

from ggufdesk.session.conversation import ChatSession, Refused, SessionView
from ggufdesk.session.models import ModelSession, ModelState, ModelView
from ggufdesk.session.prompt import build_request, title_from
from ggufdesk.session.turns import Turn
from ggufdesk.session.writer import HistoryWriter, SaveState

__all__ = ["ChatSession", "HistoryWriter", "ModelSession", "ModelState", "ModelView", "Refused",
           "SaveState", "SessionView", "Turn", "build_request", "title_from"]
