"""What went wrong with a request to a vLLM server, in plain words.

ProbeError is the one error shape of probes, bursts and the helpers around
them (model lookup, prompt building): a `kind` to branch on and a message
for people. error_from_response reads an HTTP error answer (with vLLM's
"prompt too long" figures); classify_exception maps httpx's and aiohttp's
exceptions onto the same kinds.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import httpx


class ProbeErrorKind(StrEnum):
    """What kind of trouble a request met. A StrEnum: it compares equal to
    its value and is written as it in JSON, so run records are unchanged."""

    PROMPT_TOO_LONG = "prompt_too_long"
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    SERVER_ERROR = "server_error"
    HTTP_ERROR = "http_error"
    CONNECTION_REFUSED = "connection_refused"
    CONNECT_ERROR = "connect_error"
    TIMEOUT = "timeout"
    DISCONNECTED = "disconnected"
    STREAM_ERROR = "stream_error"
    BAD_RESPONSE = "bad_response"
    CANCELLED = "cancelled"
    OPEN_FILES = "open_files"  # the load's sockets do not fit under ulimit -n (load/open_files.py)


# Transport failures (as opposed to HTTP answers): the server is not there
# or not answering, so enough of them in a row stop a burst or a capacity run.
TRANSPORT_KINDS = frozenset({ProbeErrorKind.CONNECTION_REFUSED, ProbeErrorKind.CONNECT_ERROR,
                             ProbeErrorKind.TIMEOUT, ProbeErrorKind.DISCONNECTED})


@dataclass
class ProbeError:
    """What went wrong, for people; `kind` (a ProbeErrorKind, a plain string
    of one is converted) is what code branches on."""

    kind: ProbeErrorKind
    message: str
    status: int | None = None
    max_model_len: int | None = None  # prompt_too_long: the model's limit, from vLLM's message
    prompt_tokens: int | None = None  # prompt_too_long: the prompt's size as vLLM counted it

    def __post_init__(self) -> None:
        self.kind = ProbeErrorKind(self.kind)

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ProbeFailure(Exception):
    """Raised only by the helpers (model lookup, prompt building); the probe
    and burst functions turn it into a ProbeResult error."""

    def __init__(self, error: ProbeError) -> None:
        super().__init__(error.message)
        self.error = error


_LIMIT_PATTERNS = [
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"maximum model length (?:is |of )?(\d+)", re.I),
    re.compile(r"exceeds? (?:the )?limit of (\d+)", re.I),
    re.compile(r"max_model_len[^\d]{0,20}(\d+)", re.I),
]
_PROMPT_PATTERNS = [
    re.compile(r"prompt contains (?:at least )?(\d+) (?:input )?tokens", re.I),
    re.compile(r"\((\d+) in the messages", re.I),
    re.compile(r"prompt \(length (\d+)\)", re.I),
    re.compile(r"input prompt \((\d+) tokens\)", re.I),
    re.compile(r"parameter=input_tokens, value=(\d+)", re.I),
]


def parse_too_long(message: str) -> tuple[int | None, int | None]:
    """(max_model_len, prompt_tokens) from vLLM's 'too long' messages, across
    the wordings vLLM has used (None where a figure is not in the text)."""
    limit = next((int(m.group(1)) for p in _LIMIT_PATTERNS if (m := p.search(message))), None)
    prompt = next((int(m.group(1)) for p in _PROMPT_PATTERNS if (m := p.search(message))), None)
    return limit, prompt


def _looks_too_long(message: str) -> bool:
    m = message.lower()
    return ("context length" in m or "too long" in m or "maximum model length" in m
            or "max_model_len" in m or "reduce the length" in m)


def _error_message_from_body(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("msg")
            if msg:
                return str(msg)
        elif isinstance(err, str):
            return err
        if "detail" in data:
            return str(data["detail"])
    return body.strip()[:500]


def error_from_response(status: int, body: str, target: str = "") -> ProbeError:
    msg = _error_message_from_body(body)
    if status == 400 and _looks_too_long(msg):
        limit, prompt = parse_too_long(msg)
        return ProbeError(ProbeErrorKind.PROMPT_TOO_LONG, msg, status, max_model_len=limit, prompt_tokens=prompt)
    if status == 400 or status == 422:
        return ProbeError(ProbeErrorKind.BAD_REQUEST, f"HTTP {status}: {msg}", status)
    if status in (401, 403):
        return ProbeError(ProbeErrorKind.UNAUTHORIZED,
                          f"HTTP {status}: {msg} (set the API key's environment variable)", status)
    if status == 404:
        return ProbeError(ProbeErrorKind.NOT_FOUND, f"HTTP 404: {msg}", status)
    if status >= 500:
        return ProbeError(ProbeErrorKind.SERVER_ERROR, f"HTTP {status} from the server: {msg}", status)
    return ProbeError(ProbeErrorKind.HTTP_ERROR, f"HTTP {status}: {msg}", status)


def not_an_event_stream(status: int, content_type: str | None) -> ProbeError | None:
    """The error for a streamed answer whose Content-Type is not an event
    stream (a login page, a JSON answer of a server that ignored `stream`).
    None when it is one, or says nothing: such a body is parsed anyway."""
    if not content_type:
        return None
    if content_type.split(";")[0].strip().lower() == "text/event-stream":
        return None
    return ProbeError(ProbeErrorKind.BAD_RESPONSE,
                      f"the server answered {status} with {content_type}, not an event stream: "
                      "is this URL a vLLM server?", status)


# The bytes a parser quotes from an answer it could not read: b'SSH-2.0...'
_QUOTED_BYTES = re.compile(r"""b(['"])(.{0,80}?)\1""")


def not_http(text: str) -> ProbeError:
    """The error for an answer that is not HTTP at all (another protocol on the port)."""
    m = _QUOTED_BYTES.search(text)
    began = f" (it began {m.group(2)!r})" if m else f" ({text.splitlines()[0][:120]})" if text else ""
    return ProbeError(ProbeErrorKind.BAD_RESPONSE, f"the answer is not HTTP{began}: is this URL a vLLM server?")


def connection_refused(exc: BaseException) -> bool:
    """Whether a connect error was the port being closed (nothing listens)."""
    # The async transport words it "All connection attempts failed" and keeps
    # the ConnectionRefusedError (or an OSError group holding it) as the cause.
    seen = 0
    todo: list[BaseException | None] = [exc]
    while todo and seen < 20:
        e = todo.pop()
        if e is None:
            continue
        seen += 1
        if isinstance(e, ConnectionRefusedError) or "refused" in str(e).lower() or "errno 111" in str(e).lower():
            return True
        todo.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])
    return False


def is_transport_error(exc: BaseException) -> bool:
    """What the network, the server or a bad URL can raise through httpx or aiohttp."""
    return isinstance(exc, (OSError, httpx.HTTPError, httpx.InvalidURL)) or _is_aiohttp_error(exc)


def _is_aiohttp_error(exc: BaseException) -> bool:
    aiohttp = sys.modules.get("aiohttp")  # only loaded when a burst made a session
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _refused(target: str) -> ProbeError:
    return ProbeError(ProbeErrorKind.CONNECTION_REFUSED,
                      f"connection refused by {target} (is the server running on that port?)")


def _silent(read_timeout: float | None, tokens_so_far: int) -> ProbeError:
    waited = f" for {read_timeout:g} s" if read_timeout else ""
    first = "before the first token" if tokens_so_far == 0 else f"after {tokens_so_far} tokens"
    return ProbeError(ProbeErrorKind.TIMEOUT, f"the server sent nothing{waited} {first}")


def _dropped(tokens_so_far: int, text: str) -> ProbeError:
    where = "before answering" if tokens_so_far == 0 else f"mid-stream after {tokens_so_far} tokens"
    return ProbeError(ProbeErrorKind.DISCONNECTED, f"the server closed the connection {where} (did it die?): {text}")


def _classify_aiohttp(exc: BaseException, target: str, tokens_so_far: int,
                      read_timeout: float | None) -> ProbeError | None:
    """The same kinds as for httpx, from aiohttp's exception classes."""
    import aiohttp
    from aiohttp import http_exceptions

    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ProbeError(ProbeErrorKind.TIMEOUT, f"connecting to {target} timed out")
    if isinstance(exc, aiohttp.ClientConnectorError):
        if connection_refused(exc):
            return _refused(target)
        return ProbeError(ProbeErrorKind.CONNECT_ERROR, f"cannot connect to {target}: {text}")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return _silent(read_timeout, tokens_so_far)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return _dropped(tokens_so_far, text)
    if isinstance(exc, aiohttp.ClientResponseError) and isinstance(exc.__cause__, http_exceptions.HttpProcessingError):
        return not_http(exc.message)  # the parser could not read the status line or headers
    if isinstance(exc, aiohttp.ClientError):
        return ProbeError(ProbeErrorKind.CONNECT_ERROR, f"request to {target} failed: {text}")
    return None


def classify_exception(exc: BaseException, target: str, tokens_so_far: int = 0,
                       read_timeout: float | None = None) -> ProbeError:
    text = str(exc) or type(exc).__name__
    if _is_aiohttp_error(exc):
        err = _classify_aiohttp(exc, target, tokens_so_far, read_timeout)
        if err is not None:
            return err
    if isinstance(exc, ConnectionRefusedError):
        return _refused(target)
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return _dropped(tokens_so_far, text)
    if isinstance(exc, OSError):
        return ProbeError(ProbeErrorKind.CONNECT_ERROR, f"request to {target} failed: {text}")
    if isinstance(exc, httpx.ConnectTimeout):
        return ProbeError(ProbeErrorKind.TIMEOUT, f"connecting to {target} timed out")
    if isinstance(exc, httpx.ConnectError):
        if connection_refused(exc):
            return _refused(target)
        return ProbeError(ProbeErrorKind.CONNECT_ERROR, f"cannot connect to {target}: {text}")
    if isinstance(exc, httpx.TimeoutException):
        return _silent(read_timeout, tokens_so_far)
    if isinstance(exc, httpx.RemoteProtocolError) and "status line" in text.lower():
        return not_http(text)
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return _dropped(tokens_so_far, text)
    if isinstance(exc, httpx.HTTPError):
        return ProbeError(ProbeErrorKind.CONNECT_ERROR, f"request to {target} failed: {text}")
    return ProbeError(ProbeErrorKind.STREAM_ERROR, f"{type(exc).__name__}: {text}")
