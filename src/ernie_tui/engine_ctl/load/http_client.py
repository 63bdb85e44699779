"""HTTP to a vLLM server: URLs, clients, the model list, warming a connection.

new_async_client makes the client that probes and bursts stream on (aiohttp
by default, httpx as an option); warm_client opens its connection before a
timed request; list_models / resolve_model read /v1/models.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from ernie_tui.engine_ctl.load.http_errors import (
    ProbeError,
    ProbeErrorKind,
    ProbeFailure,
    classify_exception,
    error_from_response,
    is_transport_error,
)
from ernie_tui.engine_ctl.tls import tls_context

DEFAULT_CONNECT_TIMEOUT_S = 5.0
# vLLM sends nothing while a request waits in its queue or is prefilled, so
# the read timeout must cover the longest expected wait for the first token.
DEFAULT_READ_TIMEOUT_S = 60.0
DEFAULT_TOTAL_TIMEOUT_S = 600.0


# ---------------------------------------------------------------------------
# URLs and the model list

def base_url(url: str) -> str:
    """'http://h:8000/v1/' -> 'http://h:8000' (we add the paths ourselves)."""
    u = url.strip().rstrip("/")
    for suffix in ("/v1/completions", "/v1/chat/completions", "/metrics", "/v1"):
        if u.endswith(suffix):
            u = u[: -len(suffix)]
    if "://" not in u:
        u = "http://" + u
    return u


# A host name or IPv4 address (letters, digits, dots, dashes, underscores);
# an IPv6 address comes bracketed and urlsplit checks it.
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def url_problem(url: str) -> str | None:
    """Why `url` is no server URL, or None when it is one.

    What base_url takes: http(s)://HOST[:PORT][/path], or HOST:PORT with no
    scheme (http is meant). A bare word has no port and is refused, though
    it could name a host: typed where a URL belongs it is a slip far more
    often, and the port is what an operator must give anyway. Checked before
    a command starts anything, since a client handed `htp:/x` otherwise
    fails far off, on a host it made up ("Cannot connect to host htp:80")."""
    u = url.strip()
    if not u:
        return "it is empty"
    if any(c.isspace() for c in u):
        return "it holds a space"
    scheme = u.split("://", 1)[0].lower() if "://" in u else None
    if scheme is not None and scheme not in ("http", "https"):
        return f"the scheme is {scheme!r}, not http or https"
    try:
        parts = urlsplit(u if scheme else f"http://{u}")
        port = parts.port
    except ValueError as exc:  # a port out of range or not a number, a bad IPv6 address
        return "its port is not a number from 1 to 65535" if "port" in str(exc).lower() else "it cannot be read"
    host = parts.hostname or ""
    if not host:
        return "it names no host"
    if ":" not in host and not _HOST.fullmatch(host):
        return f"{host!r} is not a host name"
    if port == 0:
        return "its port is not a number from 1 to 65535"
    if scheme is None and port is None:
        return "it has neither http:// nor a :PORT"
    if parts.username is not None:
        return "it holds a user name (the API key comes from --api-key-env)"
    if parts.query or parts.fragment:
        return "it holds a query or fragment (give the server's base URL)"
    return None


def check_server_url(url: str, what: str = "URL") -> str:
    """The URL, or ValueError with one line naming what was given and the form
    expected (the CLI and the fleet file turn it into their own error)."""
    problem = url_problem(url)
    if problem:
        raise ValueError(f"{what} {url!r} is not a server URL: {problem} "
                         "(give http://HOST:PORT, e.g. http://127.0.0.1:8000)")
    return url.strip()


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class ServedModel:
    id: str
    root: str | None = None  # vLLM: the --model argument (a local dir or a hub id)
    max_model_len: int | None = None


def list_models(url: str, api_key: str | None = None, timeout: float = 5.0) -> list[ServedModel]:
    """The server's /v1/models. Raises ProbeFailure with a plain message."""
    target = base_url(url) + "/v1/models"
    try:
        r = httpx.get(target, headers=auth_headers(api_key), timeout=timeout)
    except httpx.HTTPError as exc:
        raise ProbeFailure(classify_exception(exc, target)) from exc
    return _models_from_response(r.status_code, r.text, target)


def server_answers(url: str, api_key: str | None = None, timeout: float = 5.0) -> bool:
    """Whether the server answers GET /v1/models with its list now (a run of
    failed requests is then the requests' trouble, not a server that is gone)."""
    try:
        list_models(url, api_key, timeout)
    except ProbeFailure:
        return False
    return True


def _models_from_response(status: int, body: str, target: str) -> list[ServedModel]:
    if status != 200:
        raise ProbeFailure(error_from_response(status, body, target))
    try:
        data = json.loads(body).get("data") or []
    except (ValueError, AttributeError) as exc:
        raise ProbeFailure(ProbeError(ProbeErrorKind.BAD_RESPONSE, f"{target} did not return JSON")) from exc
    out = []
    for m in data:
        if isinstance(m, dict) and m.get("id"):
            mml = m.get("max_model_len")
            out.append(ServedModel(str(m["id"]), m.get("root"), int(mml) if isinstance(mml, int) else None))
    return out


# A warm-up GET that takes longer than this is given up (the timed request
# then opens its own connection, as before).
WARM_TIMEOUT_S = 2.0


async def warm_client(client: Any, url: str, model: str | None = None, *,
                      timeout: float = WARM_TIMEOUT_S) -> ServedModel | None:
    """Open a connection on `client` (from new_async_client) and pay its
    first-use costs with a cheap GET /v1/models, so that a timed request
    that follows goes out on an open, warm connection: a cold client reads
    TTFT 20-30 ms late on localhost (connect, the HTTP stack's first-request
    set-up). Returns the model to use: `model` as the server lists it (or
    as given), else the first one listed. Raises ProbeFailure only when no
    model was named and the list cannot be had."""
    target = base_url(url) + "/v1/models"

    async def get() -> tuple[int, str]:
        if isinstance(client, httpx.AsyncClient):
            r = await client.get(target)
            return r.status_code, r.text
        async with client.get(target) as r:
            return r.status, await r.text(errors="replace")

    try:
        status, body = await asyncio.wait_for(get(), timeout)
        models = _models_from_response(status, body, target)
    except ProbeFailure:
        if model:
            return ServedModel(model)
        raise
    except asyncio.TimeoutError as exc:
        if model:
            return ServedModel(model)
        raise ProbeFailure(ProbeError(ProbeErrorKind.TIMEOUT, f"{target} did not answer within {timeout:g} s")) from exc
    except Exception as exc:
        if not is_transport_error(exc):
            raise  # a bug, not the network
        if model:
            return ServedModel(model)
        raise ProbeFailure(classify_exception(exc, target)) from exc
    if model:
        return next((m for m in models if m.id == model), ServedModel(model))
    if not models:
        raise ProbeFailure(ProbeError(ProbeErrorKind.BAD_RESPONSE, f"{target} lists no model"))
    return models[0]


def resolve_model(url: str, model: str | None = None, api_key: str | None = None,
                  timeout: float = 5.0) -> ServedModel:
    """The model to talk to: `model` if given (looked up for its root), else
    the first one the server serves."""
    try:
        models = list_models(url, api_key, timeout)
    except ProbeFailure:
        if model:
            return ServedModel(model)  # the request itself will report the problem
        raise
    if model:
        for m in models:
            if m.id == model:
                return m
        return ServedModel(model)
    if not models:
        raise ProbeFailure(ProbeError(ProbeErrorKind.BAD_RESPONSE, f"{base_url(url)}/v1/models lists no model"))
    return models[0]


def make_timeout(read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> httpx.Timeout:
    # pool=None: a send that waits for a free connection (an open loop held to
    # the open-file room) waits on this client, not on the server; its wait
    # shows in its TTFT, and only the request's own deadline ends it.
    return httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=None)



_JSON_HEADERS = {"Content-Type": "application/json"}

TRANSPORTS = ("httpx", "aiohttp")


def new_async_client(api_key: str | None = None, read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                     connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                     max_connections: int = 16, *, transport: str = "aiohttp") -> Any:
    """A client for stream_request and warm_client, used as
    `async with new_async_client(...) as c` inside a running event loop.

    transport "aiohttp" (the default; an aiohttp.ClientSession): its C HTTP
    parser costs about a third of httpx's CPU per streamed token
    (bench/client_cpu.py, docs/lab/benchmarks/client-cpu.md), and one read of it hands over
    everything that arrived, so the events of one read share one timestamp
    and their gap is spread over their tokens. "httpx" (an
    httpx.AsyncClient, the client before) hands over one HTTP chunk at a
    time: chunks that arrived together get timestamps microseconds apart,
    which reads as near-zero ITLs after any stall of the client.
    """
    # No proxies from the environment: a probe measures this server, and an
    # HTTP(S)_PROXY meant for the internet would distort or break it.
    if transport == "aiohttp":
        import aiohttp

        return aiohttp.ClientSession(
            headers=auth_headers(api_key), trust_env=False,
            # total=None: stream_request applies its own deadline per request.
            # sock_connect, not connect: aiohttp's connect also times the wait
            # for a free connection of the pool, and a send queued behind the
            # open-file room would fail as "connecting ... timed out", this
            # client's limit read as the server's. The wait shows in its TTFT.
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout,
                                          sock_read=read_timeout),
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=60))
    if transport != "httpx":
        raise ValueError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    return httpx.AsyncClient(timeout=make_timeout(read_timeout, connect_timeout),
                             headers=auth_headers(api_key), trust_env=False, verify=tls_context(),
                             limits=httpx.Limits(max_connections=max_connections,
                                                 max_keepalive_connections=max_connections))


def fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop if installed (about a quarter less client CPU per
    streamed token than asyncio's, bench/client_cpu.py), else None: asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
