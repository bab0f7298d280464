"""The words the window and the exports use for who wrote a message, its state and why it ended."""
from __future__ import annotations

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
# Completion mode is one text the model continues, not a conversation.
COMPLETION_NAMES = {"user": "Your text", "assistant": "Continued by the model", "system": "System"}
STATUS_NOTES = {
    "streaming": "writing…",
    "partial": "partial: the engine stopped",
    "cancelled": "stopped",
    "error": "failed",
}
# Why an answer ended (Done.finish_reason), in words.
FINISH_WORDS = {
    "stop": "finished",
    "length": "stopped at the token limit",
    "cancelled": "stopped by you",
    "context": "stopped: the context is full",
    "tool_calls": "called a tool",
    "repeat": "stopped: it began repeating itself",
}


def role_name(role: str, mode: str = "chat") -> str:
    names = COMPLETION_NAMES if mode == "completion" else ROLE_NAMES
    return names.get(role, role.capitalize())


def state_note(status: str, finish_reason: str = "") -> str:
    """What is said beside a message that did not simply finish ('' when it did)."""
    if status == "cancelled" or (status == "done" and finish_reason not in ("", "stop")):
        return FINISH_WORDS.get(finish_reason or "cancelled", STATUS_NOTES.get(status, ""))
    return STATUS_NOTES.get(status, "")
