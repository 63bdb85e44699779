"""Read a vLLM server's Prometheus `/metrics` and turn it into figures.

Parsing uses prometheus_client's own text parser. Everything here is looked
up by *sample* name (e.g. ``vllm:prompt_tokens_total``, ``..._bucket``)
rather than family name, because the parser names a family differently
depending on whether the scrape carried ``# TYPE`` lines (a counter family
``vllm:prompt_tokens`` vs an untyped ``vllm:prompt_tokens_total``) and
partial scrapes or proxies drop those lines.

vLLM renames metrics between versions, so every figure is looked up through
a list of candidate names, newest first; a figure whose metric is missing is
None, never an exception. When a server has several engines (data
parallel) or label sets, counters and histograms are summed over them.

Windowed figures (rates, latency percentiles) come from the difference of two
snapshots: counters and histogram buckets only ever grow, so the delta is
exactly what happened between the two scrapes. A delta that went negative
means the server restarted in between; that window gives None.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ernie_tui.engine_ctl.tls import tls_context

if TYPE_CHECKING:  # httpx itself is imported where a scrape needs it
    import httpx

from prometheus_client.parser import text_string_to_metric_families

from ernie_tui.engine_ctl.load import stats
from ernie_tui.engine_ctl.load.http_client import auth_headers
from ernie_tui.engine_ctl.load.http_errors import connection_refused

# Candidate metric names, newest vLLM first. Sample names, so counters end in
# _total and histograms are the base name (the _bucket/_sum/_count suffixes
# are added when read).
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
REQUEST_SUCCESS = ("vllm:request_success_total",)
PREEMPTIONS = ("vllm:num_preemptions_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
# kv_cache_usage_perc since vLLM ~0.10; gpu_cache_usage_perc before. Both
# hold a fraction 0..1 despite the name.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
TTFT = ("vllm:time_to_first_token_seconds",)
# Older vLLM called the inter-token histogram time_per_output_token_seconds;
# newer ones renamed it and reuse a similar name for a per-request figure.
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
E2E = ("vllm:e2e_request_latency_seconds",)
QUEUE = ("vllm:request_queue_time_seconds",)
# Prefill + decode: a request's time in the engine's running batch.
INFERENCE = ("vllm:request_inference_time_seconds",)
# Seconds between the /metrics samples a burst or a capacity level takes while
# its load runs. vLLM's API server renders each scrape in the process that
# streams the tokens being timed: at 4 a second, the client's ITL p99 read
# 1.1-1.2x the bench client's on an H200 while vLLM's own (engine-clock)
# histogram read them equal; on the paced stand-in, whose ITL is a flat 5 ms,
# p99 went 5.6 -> 6.3 ms, and on vLLM CPU a burst served 13 % fewer tok/s
# (docs/lab/load-generator.md, row 14).
LOAD_SAMPLE_INTERVAL_S = 1.0
CACHE_CONFIG = ("vllm:cache_config_info",)
# What a live chart needs: the fast path for pollers (see MetricsSnapshot.parse).
LIVE_METRICS = (*PROMPT_TOKENS, *GENERATION_TOKENS, *REQUEST_SUCCESS, *PREEMPTIONS, *RUNNING, *WAITING,
                *KV_USAGE)

# A snapshot of /metrics is ~50 KB and a few ms to parse; a short timeout keeps
# a wedged server from freezing whoever polls it.
DEFAULT_TIMEOUT_S = 2.0


class MetricsError(Exception):
    """/metrics could not be fetched or read; the message is for humans.

    `reason` is the same in a few words, for a status line: 'HTTP 500',
    'connection refused', 'no answer within 2 s', 'parse error: ...'."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


Labels = Mapping[str, str]


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram, summed over label sets.

    ``buckets`` are (upper bound, cumulative count) sorted by bound, the last
    one +Inf. A delta of two of these is again a Histogram (of the window).
    """

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def delta(self, earlier: "Histogram | None") -> "Histogram | None":
        """What was observed after `earlier`; None after a server restart or
        when the bucket layout changed (different vLLM between the scrapes)."""
        if earlier is None:
            return self
        if [b for b, _ in self.buckets] != [b for b, _ in earlier.buckets]:
            return None
        buckets = tuple((b, c - c0) for (b, c), (_, c0) in zip(self.buckets, earlier.buckets, strict=True))
        count = self.count - earlier.count
        if count < 0 or any(c < 0 for _, c in buckets):
            return None
        return Histogram(buckets, self.sum - earlier.sum, count)

    def quantile(self, q: float) -> float | None:
        """Estimated q-quantile (0..1), as Prometheus' histogram_quantile does:
        find the bucket holding rank q*count and interpolate linearly inside
        it, taking the lower edge of the first bucket as 0. A rank that falls
        in the +Inf bucket returns the highest finite bound (all we know is
        "more than that"). None when the histogram is empty.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within 0..1, got {q}")
        total = self.buckets[-1][1] if self.buckets else 0.0
        if total <= 0:
            return None
        rank = q * total
        prev_bound, prev_count = 0.0, 0.0
        for bound, cum in self.buckets:
            if cum >= rank and cum > prev_count:
                if math.isinf(bound):
                    return prev_bound
                in_bucket = cum - prev_count
                return prev_bound + (bound - prev_bound) * (rank - prev_count) / in_bucket
            prev_bound, prev_count = bound, cum
        return prev_bound

    def summary(self) -> dict[str, float | None]:
        """{'count', 'mean', 'p50', 'p90', 'p99'} in the histogram's unit."""
        return {
            "count": self.count,
            "mean": self.mean,
            "p50": self.quantile(0.50),
            "p90": self.quantile(0.90),
            "p99": self.quantile(0.99),
        }


@dataclass(frozen=True)
class CacheConfig:
    """The labels of vLLM's ``cache_config_info`` info-gauge, typed.

    ``kv_cache_size_tokens`` appears in newer vLLM; for older ones it is
    derived as num_gpu_blocks * block_size (the same figure vLLM logs as
    "GPU KV cache size").
    """

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    raw: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _none(value: str | None) -> str | None:
    return None if value is None or value in ("None", "none", "") else value


def _as_int(value: str | None) -> int | None:
    value = _none(value)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _as_float(value: str | None) -> float | None:
    value = _none(value)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _as_bool(value: str | None) -> bool | None:
    value = _none(value)
    if value is None:
        return None
    return value.lower() in ("true", "1", "yes")


def _only(text: str, prefixes: tuple[str, ...]) -> str:
    # Cheap pre-filter: keep the sample lines (and their HELP/TYPE lines) of
    # the named metrics. A full vLLM scrape is ~1,000 lines and parsing all of
    # it holds the GIL for ~10 ms; a burst sampler needs three gauges.
    keep = []
    for line in text.splitlines():
        body = line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line
        if body.startswith(prefixes):
            keep.append(line)
    return "\n".join(keep) + "\n"


def only_metrics(text: str, names: Iterable[str]) -> str:
    """The lines of a scrape that belong to the named metrics (prefixes),
    HELP/TYPE lines included: what MetricsSnapshot.parse(only=...) parses.
    A poller can compare two of these to skip parsing an unchanged scrape."""
    return _only(text, tuple(names))


def _parse_families(text: str) -> list:
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:  # what prometheus_client's parser raises on a malformed line
        pass
    # One bad line (a truncated scrape, a proxy's banner) makes the parser give
    # up on the whole text. Keep every line that parses on its own instead.
    good: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            good.append(line)
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            continue
        good.append(line)
    try:
        return list(text_string_to_metric_families("\n".join(good) + "\n"))
    except ValueError:
        # HELP/TYPE lines in a bad order can still upset it; drop them too.
        samples_only = "\n".join(line for line in good if not line.lstrip().startswith("#"))
        try:
            return list(text_string_to_metric_families(samples_only + "\n"))
        except ValueError:
            return []


@dataclass
class MetricsSnapshot:
    """One scrape of /metrics: when it was taken and what it held.

    ``timestamp`` is wall-clock (for charts); ``mono`` is time.monotonic() at
    the scrape and is what rates are computed from.
    """

    timestamp: float
    families: list = field(default_factory=list, repr=False)
    mono: float | None = None
    model_name: str | None = None  # only samples with this model_name label (None: all)
    _index: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.mono is None:
            self.mono = self.timestamp
        if not self._index:
            self._index = self._build_index()

    @classmethod
    def parse(cls, text: str, timestamp: float | None = None, mono: float | None = None,
              model_name: str | None = None, only: Iterable[str] | None = None) -> "MetricsSnapshot":
        """Parse a scrape. `only`: metric names (prefixes) to keep, skipping the
        rest before parsing, for pollers that need a few figures fast."""
        if only is not None:
            text = _only(text, tuple(only))
        if timestamp is None:
            timestamp = time.time()
            mono = time.monotonic() if mono is None else mono
        return cls(timestamp=timestamp, families=_parse_families(text), mono=mono, model_name=model_name)

    def _build_index(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        index: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in self.families:
            for s in fam.samples:
                labels = dict(s.labels)
                if self.model_name is not None and labels.get("model_name") not in (None, self.model_name):
                    continue
                index.setdefault(s.name, []).append((labels, float(s.value)))
        return index

    # -- raw access ------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._index)

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        return list(self._index.get(name, ()))

    def has(self, name: str) -> bool:
        return name in self._index

    def label_values(self, label: str) -> list[str]:
        """Every value `label` takes over all samples, sorted: e.g. the
        ``engine`` ids of a data-parallel server ("0", "1", ...)."""
        values = {labels[label] for samples in self._index.values() for labels, _ in samples if label in labels}
        return sorted(values, key=lambda v: (len(v), v))  # "2" before "10"

    def where(self, label: str, value: str) -> "MetricsSnapshot":
        """The samples whose `label` is `value`, plus those without that label
        (server-wide ones): one engine's view of a data-parallel server.
        Shares nothing mutable with this snapshot; every figure works on it."""
        index = {name: kept for name, samples in self._index.items()
                 if (kept := [(labels, v) for labels, v in samples if labels.get(label, value) == value])}
        return MetricsSnapshot(timestamp=self.timestamp, mono=self.mono, model_name=self.model_name,
                               _index=index)

    def zeroed(self, timestamp: float, mono: float) -> "MetricsSnapshot":
        """The same series with every value 0, taken at `timestamp` (wall)
        and `mono`: how a server's counters and histograms stood when it
        started, so that a window from it to this scrape holds all it served."""
        index = {name: [(labels, 0.0) for labels, _ in samples] for name, samples in self._index.items()}
        return MetricsSnapshot(timestamp=timestamp, mono=mono, model_name=self.model_name, _index=index)

    def _pick(self, names: Iterable[str] | str, suffix: str = "") -> str | None:
        if isinstance(names, str):
            names = (names,)
        for n in names:
            if n + suffix in self._index:
                return n
        return None

    # -- typed access ----------------------------------------------------
    def total(self, names: Iterable[str] | str) -> float | None:
        """Sum of a counter/gauge over all its label sets; None if absent."""
        name = self._pick(names)
        if name is None:
            return None
        values = [v for _, v in self._index[name] if not math.isnan(v)]
        return math.fsum(values) if values else None

    def maximum(self, names: Iterable[str] | str) -> float | None:
        name = self._pick(names)
        if name is None:
            return None
        values = [v for _, v in self._index[name] if not math.isnan(v)]
        return max(values) if values else None

    def histogram(self, names: Iterable[str] | str) -> Histogram | None:
        name = self._pick(names, "_bucket")
        if name is None:
            return None
        by_bound: dict[float, float] = {}
        for labels, v in self._index.get(name + "_bucket", ()):
            le = labels.get("le")
            if le is None:
                continue
            try:
                bound = float(le)
            except ValueError:
                continue
            by_bound[bound] = by_bound.get(bound, 0.0) + v
        if not by_bound:
            return None
        buckets = tuple(sorted(by_bound.items()))
        total_sum = math.fsum(v for _, v in self._index.get(name + "_sum", ()))
        counts = self._index.get(name + "_count")
        count = math.fsum(v for _, v in counts) if counts else buckets[-1][1]
        return Histogram(buckets, total_sum, count)

    # -- the figures the dashboard shows --------------------------------
    @property
    def running(self) -> float | None:
        return self.total(RUNNING)

    @property
    def waiting(self) -> float | None:
        return self.total(WAITING)

    @property
    def kv_cache_usage_pct(self) -> float | None:
        """KV-cache usage in percent (0..100). With several engines, the fullest
        one: that is the one that starts preempting first."""
        frac = self.maximum(KV_USAGE)
        return None if frac is None else frac * 100.0

    @property
    def prompt_tokens(self) -> float | None:
        return self.total(PROMPT_TOKENS)

    @property
    def generation_tokens(self) -> float | None:
        return self.total(GENERATION_TOKENS)

    @property
    def requests_finished(self) -> float | None:
        return self.total(REQUEST_SUCCESS)

    @property
    def process_rss_bytes(self) -> float | None:
        """RSS of the API-server process itself (not the engine core)."""
        return self.total("process_resident_memory_bytes")

    def cache_config(self) -> CacheConfig | None:
        name = self._pick(CACHE_CONFIG)
        if name is None:
            return None
        labels = dict(self._index[name][0][0])
        block = _as_int(labels.get("block_size"))
        gpu_blocks = _as_int(labels.get("num_gpu_blocks"))
        tokens = _as_int(labels.get("kv_cache_size_tokens"))
        if tokens is None and block is not None and gpu_blocks is not None:
            tokens = block * gpu_blocks
        return CacheConfig(
            block_size=block,
            num_gpu_blocks=gpu_blocks,
            num_cpu_blocks=_as_int(labels.get("num_cpu_blocks")),
            kv_cache_size_tokens=tokens,
            kv_cache_max_concurrency=_as_float(labels.get("kv_cache_max_concurrency")),
            kv_cache_memory_bytes=_as_int(labels.get("kv_cache_memory_bytes")),
            gpu_memory_utilization=_as_float(labels.get("gpu_memory_utilization")),
            cache_dtype=_none(labels.get("cache_dtype")),
            enable_prefix_caching=_as_bool(labels.get("enable_prefix_caching")),
            raw=labels,
        )


# -- windows between two snapshots ---------------------------------------

def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, names: Iterable[str] | str) -> float | None:
    """How much a counter grew between two scrapes; None if missing or reset."""
    a, b = before.total(names), after.total(names)
    if a is None or b is None or b < a:
        return None
    return b - a


def counter_rate(before: MetricsSnapshot, after: MetricsSnapshot, names: Iterable[str] | str) -> float | None:
    """Per-second rate of a counter over the window between two scrapes."""
    return stats.rate(counter_delta(before, after, names), elapsed(before, after))


def elapsed(before: MetricsSnapshot, after: MetricsSnapshot) -> float:
    return float(after.mono) - float(before.mono)  # type: ignore[arg-type]


def histogram_delta(before: MetricsSnapshot | None, after: MetricsSnapshot,
                    names: Iterable[str] | str) -> Histogram | None:
    """The histogram of what was observed between two scrapes (or since the
    server started, when `before` is None)."""
    h1 = after.histogram(names)
    if h1 is None:
        return None
    if before is None:
        return h1
    return h1.delta(before.histogram(names))


# -- fetching --------------------------------------------------------------

# A load's source of /metrics snapshots taken by someone else (LatestScrape.feed):
# the newest one and when it was taken (time.monotonic()), or None when there
# is none fresh enough to stand for a scrape of our own.
MetricsFeed = Callable[[], "tuple[MetricsSnapshot, float] | None"]


class LatestScrape:
    """The newest /metrics snapshot a poller took of one server (the
    dashboard's chart sampler, once a second), for a burst or a capacity level
    on the same server to read instead of scraping it a second time: vLLM
    renders every scrape in the process that streams the tokens being timed
    (LOAD_SAMPLE_INTERVAL_S says what that costs). Thread-safe: the poller puts
    from its thread, a load's sampler reads from its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._url: str | None = None
        self._snap: MetricsSnapshot | None = None
        self._at = 0.0  # time.monotonic() when it was put

    def put(self, url: str, snap: MetricsSnapshot) -> None:
        with self._lock:
            self._url, self._snap, self._at = metrics_url(url), snap, time.monotonic()

    def newest(self, url: str, max_age_s: float) -> tuple[MetricsSnapshot, float] | None:
        """The newest snapshot of `url`'s server and when it was put, if it is
        younger than max_age_s; else None."""
        key = metrics_url(url)
        with self._lock:
            if self._snap is None or self._url != key or time.monotonic() - self._at > max_age_s:
                return None
            return self._snap, self._at

    def feed(self, url: str, max_age_s: float) -> MetricsFeed:
        """A load's MetricsFeed for `url`. Where it answers None (the poller
        watches another server, or has fallen behind by more than max_age_s)
        the load scrapes for itself, so no peak goes unseen."""
        return lambda: self.newest(url, max_age_s)


def metrics_url(url: str) -> str:
    """Accept the server's base URL, its /v1 URL, or the /metrics URL itself."""
    u = url.rstrip("/")
    if u.endswith("/metrics"):
        return u
    if u.endswith("/v1"):
        u = u[: -len("/v1")]
    return u + "/metrics"


def _deadline_transport(total: float) -> httpx.BaseTransport:
    """An httpx transport whose responses must arrive whole within `total`
    seconds. httpx's timeouts bound each read, not the request: a server
    that drips a few bytes every 0.2 s never trips them, and the poller
    waited for ever (bench/reliability.py metrics, case "drip"). Past the
    deadline the body read raises httpx.ReadTimeout, which fetch_text
    reports as "did not answer within". (Given a transport, httpx no longer
    routes through an HTTP(S)_PROXY from the environment: right for a scrape
    of a server on this machine, as the probe's client does on purpose.)"""
    import httpx

    class DeadlineStream(httpx.SyncByteStream):
        def __init__(self, inner: httpx.SyncByteStream, deadline: float):
            self._inner, self._deadline = inner, deadline

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self._inner:
                if time.monotonic() > self._deadline:
                    raise httpx.ReadTimeout(f"the response took longer than {total:g} s")
                yield chunk

        def close(self) -> None:
            self._inner.close()

    class DeadlineTransport(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            deadline = time.monotonic() + total
            response = super().handle_request(request)
            response.stream = DeadlineStream(cast(httpx.SyncByteStream, response.stream), deadline)  # a sync transport
            return response

    return DeadlineTransport(verify=tls_context())


class MetricsClient:
    """Fetches and parses /metrics with a short timeout (sync httpx).

    Thread-safe for one poller; keep one per server and close() it (or use it
    as a context manager). The API key, when the server wants one, goes in the
    Authorization header, as vLLM's --api-key expects.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 model_name: str | None = None) -> None:
        import httpx  # deferred: importing this module for parsing alone stays cheap

        self.url = metrics_url(url)
        self.model_name = model_name
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=auth_headers(api_key),
                                    transport=_deadline_transport(timeout))
        self._httpx = httpx

    def fetch_text(self) -> str:
        httpx = self._httpx
        try:
            r = self._client.get(self.url)
        except httpx.ConnectError as exc:
            raise MetricsError(f"cannot connect to {self.url}: {exc}",
                               "connection refused" if connection_refused(exc) else f"cannot connect ({exc})") from exc
        except httpx.TimeoutException as exc:
            wait = self._client.timeout.read
            raise MetricsError(f"{self.url} did not answer within {wait} s",
                               f"no answer within {wait:g} s" if wait else "timed out") from exc
        except httpx.HTTPError as exc:
            raise MetricsError(f"reading {self.url} failed: {exc}",
                               f"read failed ({exc.__class__.__name__})") from exc
        if r.status_code != 200:
            raise MetricsError(f"{self.url} answered HTTP {r.status_code}: {r.text[:200]}", f"HTTP {r.status_code}")
        return r.text

    def fetch(self, only: Iterable[str] | None = None) -> MetricsSnapshot:
        """Scrape and parse; `only` limits parsing to the named metrics."""
        mono_before = time.monotonic()
        text = self.fetch_text()
        # Stamp the snapshot at the midpoint of the request: the server took its
        # values somewhere inside it, and the midpoint halves the error.
        mono = (mono_before + time.monotonic()) / 2
        return MetricsSnapshot.parse(text, timestamp=time.time(), mono=mono, model_name=self.model_name,
                                     only=only)

    def try_fetch(self, only: Iterable[str] | None = None) -> MetricsSnapshot | None:
        try:
            return self.fetch(only)
        except MetricsError:
            return None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "MetricsClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LoadScrapes:
    """A load sampler's looks at running/waiting/KV use while its load runs
    (the burst's and the capacity level's samplers alike). While the feed is
    live (someone scrapes this server within its age) it stands for our
    scrapes: its snapshot when a new one was taken since the load began, else
    None (the last level's queue is not this one's, and a look counted once is
    not counted again). Without a live feed, a scrape with our own client,
    which is ours to close."""

    def __init__(self, client: MetricsClient, feed: MetricsFeed | None = None) -> None:
        self.client = client
        self.feed = feed
        self.since = time.monotonic()
        self.own = 0  # scrapes of our own
        self.shared = 0  # snapshots the feed gave (someone else's scrapes)
        self._last_shared: MetricsSnapshot | None = None

    def next(self) -> MetricsSnapshot | None:
        if self.feed is not None:
            newest = self.feed()
            if newest is not None:
                snap, taken = newest
                if taken < self.since or snap is self._last_shared:
                    return None
                self._last_shared = snap
                self.shared += 1
                return snap
        own = self.client.try_fetch(only=(*RUNNING, *WAITING, *KV_USAGE))
        if own is not None:
            self.own += 1
        return own


# -- history for charts ----------------------------------------------------

@dataclass(frozen=True)
class MetricsSample:
    """One derived point for the charts. Rates are over the interval since the
    previous scrape; None when they cannot be known (first scrape, restart)."""

    timestamp: float  # wall clock, seconds
    prompt_tps: float | None
    generation_tps: float | None
    kv_cache_usage_pct: float | None
    running: float | None
    waiting: float | None
    requests_per_s: float | None = None
    preemptions: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def derive_sample(prev: MetricsSnapshot | None, snap: MetricsSnapshot) -> MetricsSample:
    if prev is not None and elapsed(prev, snap) > 0:
        prompt_tps = counter_rate(prev, snap, PROMPT_TOKENS)
        gen_tps = counter_rate(prev, snap, GENERATION_TOKENS)
        req_s = counter_rate(prev, snap, REQUEST_SUCCESS)
        preempt = counter_delta(prev, snap, PREEMPTIONS)
    else:
        prompt_tps = gen_tps = req_s = preempt = None
    return MetricsSample(
        timestamp=snap.timestamp,
        prompt_tps=prompt_tps,
        generation_tps=gen_tps,
        kv_cache_usage_pct=snap.kv_cache_usage_pct,
        running=snap.running,
        waiting=snap.waiting,
        requests_per_s=req_s,
        preemptions=preempt,
    )


def settled_snapshot(client: MetricsClient, before: MetricsSnapshot, finished: int,
                     timeout: float) -> MetricsSnapshot | None:
    """The closing scrape of a burst or a capacity level, once vLLM has counted
    its `finished` requests: vLLM records a request's stats just after it hands
    the last chunk to the HTTP layer, so a scrape taken the instant the last
    stream ends can miss the tail. None when /metrics does not answer."""
    deadline = time.monotonic() + timeout
    snap = client.try_fetch()
    while snap is not None and time.monotonic() < deadline:
        done = counter_delta(before, snap, REQUEST_SUCCESS)
        if done is None or done >= finished:
            break
        time.sleep(0.05)
        snap = client.try_fetch() or snap
    return snap
