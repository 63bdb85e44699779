"""A traffic profile: the shape of what a server serves, small enough to read.

A profile holds no requests, only their shape, so that a load can be built
that looks like them (replay: traffic_replay.py):
- prompt and output lengths, and the max_tokens asked for, each as a
  quantile table (LengthDist): exact when the source saw every request (a
  request log, a trace), within one bucket when it came from vLLM's
  /metrics histograms (the table says which);
- how outputs end: the share that stopped early (EOS or a stop string)
  rather than running to max_tokens;
- the arrival process: the mean rate, its burstiness (the coefficient of
  variation of the gaps between arrivals: 1 for Poisson, above 1 bursty)
  and the rate per window over the capture, which a replay follows
  (traffic_replay.curve_of);
- the shared prefix: the share of requests that start with a common prefix
  and its length in tokens (and vLLM's prefix-cache hit rate, when seen);
- where it came from: metrics, request-log, trace or built-in, the server,
  the window, and notes saying what was assumed rather than seen.

The file is JSON (one object, sorted keys, indented), versioned by
"format" and "version". Prompt text is kept only when asked for
(`texts`); a file holding text is written 0600, as logs and run records
are (paths.write_private_text).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ernie_tui import paths

FORMAT = "ernie-tui-traffic"
VERSION = 1
SOURCES = ("metrics", "request-log", "trace", "built-in", "merged")
# The quantiles a length table keeps: enough for p10/p50/p90 to read off
# directly and for a replay's inverse-CDF draw to keep the tails.
QUANTILES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
# A captured table is finer: a replay draws between its points on straight
# lines, and real lengths jump (a system prompt: 40 tokens at p10, 220 at
# p20), so every 2.5 % (and the lines that trace the curve inside a histogram
# bucket, from_histogram).
FINE_QUANTILES = tuple(sorted({*QUANTILES, *(i / 40 for i in range(41))}))


class TrafficError(ValueError):
    """A profile that cannot be read or built (message for people)."""


@dataclass
class LengthDist:
    """A length distribution as a quantile table: (q, tokens) pairs, q from
    0 to 1, tokens non-decreasing. `exact`: the quantiles of the lengths
    themselves; else interpolated inside histogram buckets (`buckets`, the
    window's non-cumulative counts per upper bound, kept for showing)."""

    points: list[tuple[float, float]]
    count: float = 0.0
    mean: float | None = None
    exact: bool = True
    buckets: list[tuple[float, float]] | None = None

    def quantile(self, q: float) -> float:
        """The q-quantile, linear between the table's points."""
        pts = self.points
        if q <= pts[0][0]:
            return pts[0][1]
        for (q0, v0), (q1, v1) in zip(pts, pts[1:], strict=False):
            if q <= q1:
                return v0 if q1 == q0 else v0 + (v1 - v0) * (q - q0) / (q1 - q0)
        return pts[-1][1]

    def cdf(self, x: float) -> float:
        """The share of lengths at or below x (the table inverted, linear)."""
        pts = self.points
        if x < pts[0][1]:
            return 0.0
        for (q0, v0), (q1, v1) in zip(pts, pts[1:], strict=False):
            if x < v1:
                return q0 + (q1 - q0) * (x - v0) / (v1 - v0) if v1 > v0 else q1
        return 1.0

    @property
    def low(self) -> int:
        return max(1, int(round(self.points[0][1])))

    @property
    def high(self) -> int:
        return max(1, int(round(self.points[-1][1])))

    def draw(self, u: float) -> int:
        """A length for a uniform u in [0, 1): the inverse CDF, at least 1."""
        return max(1, int(round(self.quantile(u))))

    @classmethod
    def from_values(cls, values: list[int] | list[float]) -> LengthDist:
        if not values:
            raise TrafficError("no lengths to make a distribution of")
        xs = sorted(float(v) for v in values)
        return cls(points=[(q, _exact_quantile(xs, q)) for q in FINE_QUANTILES], count=float(len(xs)),
                   mean=math.fsum(xs) / len(xs), exact=True)

    @property
    def table_mean(self) -> float:
        """The mean of the lengths the table gives (its points joined by
        straight lines, as draw() reads them)."""
        pts = self.points
        return math.fsum((q1 - q0) * (v0 + v1) / 2 for (q0, v0), (q1, v1) in zip(pts, pts[1:], strict=False))

    @classmethod
    def from_histogram(cls, hist: Any) -> LengthDist | None:
        """From a metrics.Histogram of the window (a delta); None when empty.

        Inside a bucket only the count is known. vLLM's buckets are wide
        (200-500, 500-1000 ...), and spreading each bucket's lengths evenly
        over it (Prometheus' histogram_quantile) puts their mean far from
        the true one, which the histogram's sum gives exactly. So the lengths
        are spread over each bucket as frac^k, one k for all, chosen so the
        table's mean is the histogram's (k 1: evenly; above 1: nearer the
        lower edges). A quantile stays inside its bucket either way. A rank
        in the +Inf bucket reads as the highest finite bound: all vLLM says
        is "more than that"."""
        total = hist.buckets[-1][1] if hist.buckets else 0.0
        if total <= 0:
            return None
        target = hist.mean

        def table(k: float) -> list[tuple[float, float]]:
            return [(q, _skewed_quantile(hist.buckets, q, k)) for q in FINE_QUANTILES]

        k = 1.0
        if target:
            lo, hi = 0.1, 10.0
            for _ in range(40):  # the table's mean falls as k grows
                k = math.sqrt(lo * hi)
                if cls(points=table(k)).table_mean > target:
                    lo = k
                else:
                    hi = k
        pts = table(k)
        buckets, prev = [], 0.0
        for bound, cum in hist.buckets:
            if cum - prev > 0:
                buckets.append((bound, cum - prev))
            prev = cum
        return cls(points=pts, count=float(hist.count), mean=hist.mean, exact=False, buckets=buckets)

    def to_dict(self) -> dict[str, Any]:
        # Floats throughout: 160 and 160.0 must write alike (the digest reads the text).
        d: dict[str, Any] = {"quantiles": {_qname(q): round(float(v), 2) for q, v in self.points},
                             "count": float(self.count),
                             "mean": None if self.mean is None else round(float(self.mean), 2),
                             "exact": self.exact}
        if self.buckets is not None:
            d["buckets"] = [[_bound(float(b)), float(c)] for b, c in self.buckets]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], what: str) -> LengthDist:
        try:
            q = d["quantiles"]
            pts = sorted((_qvalue(k), float(v)) for k, v in q.items())
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TrafficError(f"{what}: needs a 'quantiles' table like {{\"p0\": 10, \"p50\": 80, \"p100\": "
                               f"400}}") from exc
        if len(pts) < 2 or pts[0][0] != 0.0 or pts[-1][0] != 1.0:
            raise TrafficError(f"{what}: the quantiles must include p0 and p100")
        if any(b[1] < a[1] for a, b in zip(pts, pts[1:], strict=False)) or pts[0][1] < 1:
            raise TrafficError(f"{what}: the quantiles must be >= 1 and grow with p")
        buckets = d.get("buckets")
        return cls(points=pts, count=float(d.get("count") or 0.0), mean=d.get("mean"),
                   exact=bool(d.get("exact", True)),
                   buckets=[(float(b), float(c)) for b, c in buckets] if buckets else None)


def _skewed_quantile(buckets: Any, q: float, k: float) -> float:
    """The q-quantile of cumulative buckets, spread inside its bucket as
    frac^k (k 1: Prometheus' linear interpolation); at least 1."""
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank and cum > prev_count:
            if math.isinf(bound):
                return max(1.0, prev_bound)
            frac = (rank - prev_count) / (cum - prev_count)
            return max(1.0, prev_bound + (bound - prev_bound) * frac ** k)
        prev_bound, prev_count = bound, cum
    return max(1.0, prev_bound)


def _exact_quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _qname(q: float) -> str:
    return f"p{q * 100:g}"


def _qvalue(name: str) -> float:
    if not name.startswith("p"):
        raise ValueError(name)
    q = float(name[1:]) / 100.0
    if not 0.0 <= q <= 1.0:
        raise ValueError(name)
    return q


def _bound(b: float) -> float | str:
    return "+Inf" if math.isinf(b) else b


@dataclass
class Arrivals:
    """The arrival process: mean rate (requests/s), burstiness as the gaps'
    coefficient of variation (1: Poisson), and the rate per window."""

    rate_per_s: float
    cv: float = 1.0
    cv_measured: bool = False  # False: assumed (a source that cannot see the gaps)
    window_s: float | None = None
    rate_series: list[float] = field(default_factory=list)

    @property
    def gamma_shape(self) -> float:
        """The gamma shape that gives this CV (arrivals.arrival_stream's
        `burstiness`): CV = 1 / sqrt(shape)."""
        return 1.0 / max(self.cv, 0.05) ** 2


@dataclass
class Prefix:
    """A shared prefix: `share` of the requests start with the same `tokens` tokens."""

    share: float = 0.0
    tokens: int = 0
    hit_rate: float | None = None  # vLLM's prefix-cache hits / queries, when seen
    assumed: bool = False  # share and length inferred from the hit rate alone


@dataclass
class Source:
    kind: str
    url: str | None = None
    window_s: float | None = None
    captured_at: str | None = None  # ISO 8601, UTC
    requests: float | None = None
    fields: dict[str, str] = field(default_factory=dict)  # which source each part came from (merged)


@dataclass
class TrafficProfile:
    name: str
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    arrivals: Arrivals
    source: Source
    max_tokens: LengthDist | None = None
    eos_share: float | None = None  # share of finished requests that stopped early (not at max_tokens)
    prefix: Prefix = field(default_factory=Prefix)
    description: str = ""
    notes: list[str] = field(default_factory=list)
    texts: list[str] | None = None  # prompt text, only when asked for (the file is then private)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "name": self.name, "description": self.description,
            "source": asdict(self.source),
            "prompt_tokens": self.prompt_tokens.to_dict(), "output_tokens": self.output_tokens.to_dict(),
            "max_tokens": self.max_tokens.to_dict() if self.max_tokens else None,
            "eos_share": None if self.eos_share is None else round(self.eos_share, 4),
            "arrivals": {"rate_per_s": round(float(self.arrivals.rate_per_s), 6),
                         "cv": round(float(self.arrivals.cv), 4), "cv_measured": self.arrivals.cv_measured,
                         "window_s": None if self.arrivals.window_s is None else float(self.arrivals.window_s),
                         "rate_series": [round(x, 4) for x in self.arrivals.rate_series]},
            "prefix": {"share": float(self.prefix.share), "tokens": int(self.prefix.tokens),
                       "hit_rate": None if self.prefix.hit_rate is None else float(self.prefix.hit_rate),
                       "assumed": self.prefix.assumed},
            "notes": list(self.notes),
        }
        if self.texts is not None:
            d["texts"] = list(self.texts)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @property
    def digest(self) -> str:
        """12 hex digits of the profile's shape (name, notes, source and text left out):
        what a run record names besides the name, so two files of one name
        but other numbers are told apart."""
        d = self.to_dict()
        for k in ("name", "description", "notes", "source", "texts"):
            d.pop(k, None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def label(self) -> str:
        return f"{self.name} ({self.digest})"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrafficProfile:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TrafficError(f"not a traffic profile (no \"format\": \"{FORMAT}\")")
        if d.get("version") != VERSION:
            raise TrafficError(f"traffic profile version {d.get('version')!r}; this ernie-tui reads {VERSION}")
        try:
            a = d["arrivals"]
            arrivals = Arrivals(rate_per_s=float(a["rate_per_s"]), cv=float(a.get("cv", 1.0)),
                                cv_measured=bool(a.get("cv_measured", False)), window_s=a.get("window_s"),
                                rate_series=[float(x) for x in a.get("rate_series") or []])
            src = d.get("source") or {}
            source = Source(kind=str(src.get("kind", "built-in")), url=src.get("url"),
                            window_s=src.get("window_s"), captured_at=src.get("captured_at"),
                            requests=src.get("requests"), fields=dict(src.get("fields") or {}))
            p = d.get("prefix") or {}
            prefix = Prefix(share=float(p.get("share", 0.0)), tokens=int(p.get("tokens", 0)),
                            hit_rate=p.get("hit_rate"), assumed=bool(p.get("assumed", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise TrafficError(f"traffic profile: bad arrivals, source or prefix ({exc})") from exc
        if not arrivals.rate_per_s > 0 or not arrivals.cv > 0:
            raise TrafficError("traffic profile: the arrival rate and cv must be above 0")
        if not 0.0 <= prefix.share <= 1.0 or prefix.tokens < 0:
            raise TrafficError("traffic profile: the prefix share must be within 0..1 and its tokens >= 0")
        eos = d.get("eos_share")
        if eos is not None and not 0.0 <= float(eos) <= 1.0:
            raise TrafficError("traffic profile: eos_share must be within 0..1")
        texts = d.get("texts")
        return cls(name=str(d.get("name") or "unnamed"), description=str(d.get("description") or ""),
                   prompt_tokens=LengthDist.from_dict(d.get("prompt_tokens") or {}, "prompt_tokens"),
                   output_tokens=LengthDist.from_dict(d.get("output_tokens") or {}, "output_tokens"),
                   max_tokens=LengthDist.from_dict(d["max_tokens"], "max_tokens") if d.get("max_tokens") else None,
                   eos_share=None if eos is None else float(eos), arrivals=arrivals, source=source, prefix=prefix,
                   notes=[str(n) for n in d.get("notes") or []],
                   texts=[str(t) for t in texts] if isinstance(texts, list) else None)

    @classmethod
    def from_json(cls, text: str) -> TrafficProfile:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise TrafficError(f"not JSON: {exc.msg} (line {exc.lineno})") from exc


def save_profile(profile: TrafficProfile, path: str | Path) -> Path:
    """Write the profile; private (0600) when it holds prompt text."""
    target = Path(path).expanduser()
    if profile.texts is not None:
        return paths.write_private_text(target, profile.to_json())
    target.write_text(profile.to_json(), encoding="utf-8")
    return target


def format_profile(p: TrafficProfile) -> str:
    """The profile for a terminal: lengths at p10/p50/p90/p99, rate, burstiness, prefix."""
    def row(label: str, d: LengthDist | None) -> str:
        if d is None:
            return f"{label:<14} -"
        qs = "  ".join(f"p{int(q * 100)} {d.quantile(q):.0f}" for q in (0.1, 0.5, 0.9, 0.99))
        how = "exact" if d.exact else "from histogram buckets"
        mean = "-" if d.mean is None else f"{d.mean:.0f}"
        return f"{label:<14} {qs}  max {d.quantile(1.0):.0f}  mean {mean}  ({how})"

    a, src = p.arrivals, p.source
    lines = [f"traffic {p.name} [{p.digest}]" + (f": {p.description}" if p.description else ""),
             f"source: {src.kind}" + (f" {src.url}" if src.url else "")
             + (f", window {src.window_s:.0f} s" if src.window_s else "")
             + (f", {src.requests:.0f} requests" if src.requests else "")
             + (f", captured {src.captured_at}" if src.captured_at else ""),
             row("prompt tokens", p.prompt_tokens), row("output tokens", p.output_tokens),
             row("max_tokens", p.max_tokens),
             "outputs: " + ("-" if p.eos_share is None else f"{p.eos_share * 100:.0f} % stop early (EOS), "
                            f"{(1 - p.eos_share) * 100:.0f} % run to max_tokens"),
             f"arrivals: {a.rate_per_s:.3g} req/s mean, gap CV {a.cv:.2f}"
             + (" (measured)" if a.cv_measured else " (assumed)")
             + (f", per {a.window_s:g} s: " + " ".join(f"{x:.2g}" for x in a.rate_series[:24])
                if a.rate_series and a.window_s else ""),
             f"shared prefix: {p.prefix.share * 100:.0f} % of requests, {p.prefix.tokens} tokens"
             + (" (inferred from the hit rate)" if p.prefix.assumed else "")
             + ("" if p.prefix.hit_rate is None else f"; prefix-cache hit rate {p.prefix.hit_rate * 100:.1f} %")]
    if p.texts is not None:
        lines.append(f"holds {len(p.texts)} prompt texts (private file)")
    for s, f in sorted(src.fields.items()):
        lines.append(f"  {s}: from {f}")
    lines.extend(f"note: {n}" for n in p.notes)
    return "\n".join(lines)
