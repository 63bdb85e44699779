"""One decoded stream event, checked: what it says, or that it is malformed.

vLLM's completions and chat chunks are JSON objects of a known shape. Every
field the timing uses is checked here, where a payload enters, so an event
of the wrong shape (a text that is not a string, choices that are not a
list, a token count that is negative, fractional or absurd) becomes one
counted malformed event, and nothing after this point guards against types.
An event is taken whole or not at all: a chunk whose usage is absurd is not
trusted for its text either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# No model's context comes near this; a bigger token count is garbage.
MAX_TOKEN_COUNT = 1 << 31


@dataclass(frozen=True)
class Chunk:
    """What one well-formed completions/chat chunk says."""

    text: str = ""
    has_choice: bool = False  # False: a usage-only chunk (the last one), no token
    finish_reason: str | None = None
    stop_reason: Any = None  # vLLM: the stop string or token id, any JSON value
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # running total with continuous usage stats
    metrics: dict | None = None  # vLLM's per-request metrics, when configured


@dataclass(frozen=True)
class ErrorEvent:
    """An `{"error": ...}` event: the server reporting a failure in the stream."""

    message: str
    status: int | None = None


class _Malformed(Exception):
    pass


def _opt_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _Malformed


def _opt_dict(value: Any) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    raise _Malformed


def _count(value: Any) -> int | None:
    if value is None:
        return None
    # bool is an int to Python, not to JSON; 1e400 decodes to inf, a float.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        raise _Malformed
    return value


def _error_event(err: Any) -> ErrorEvent:
    if isinstance(err, dict):
        msg, code = err.get("message"), err.get("code")
        status = code if isinstance(code, int) and not isinstance(code, bool) else None
        return ErrorEvent(str(msg) if msg not in (None, "") else "(no message)", status)
    return ErrorEvent(str(err))


def read_chunk(payload: Any, chat: bool) -> Chunk | ErrorEvent | None:
    """A decoded event (sse.decode_payload) as a Chunk or an ErrorEvent;
    None when its shape is not a completions (or, with chat, a chat) chunk."""
    if not isinstance(payload, dict):
        return None
    try:
        if payload.get("error") is not None and not payload.get("choices"):
            return _error_event(payload["error"])
        usage = _opt_dict(payload.get("usage"))
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        metrics = _opt_dict(payload.get("metrics")) or None
        choices = payload.get("choices")
        if choices is None and not usage:
            raise _Malformed  # neither a choice nor a usage: not a chunk of ours
        if choices is not None and not isinstance(choices, list):
            raise _Malformed
        if not choices:
            return Chunk(prompt_tokens=prompt, completion_tokens=completion, metrics=metrics)
        choice = choices[0]
        if not isinstance(choice, dict):
            raise _Malformed
        if chat:
            delta = _opt_dict(choice.get("delta"))
            # Reasoning models stream their thinking under one of two names
            # (vLLM renamed it); either is generated tokens.
            content, reasoning_content, reasoning = (_opt_str(delta.get(k)) for k in
                                                    ("content", "reasoning_content", "reasoning"))
            text = (content or "") + (reasoning_content or reasoning or "")
        else:
            text = _opt_str(choice.get("text")) or ""
        return Chunk(text, True, _opt_str(choice.get("finish_reason")), choice.get("stop_reason"),
                     prompt, completion, metrics)
    except _Malformed:
        return None
