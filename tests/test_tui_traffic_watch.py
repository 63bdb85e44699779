"""The traffic view's data (tui/traffic_watch.py), pure: real vLLM /metrics
scrapes (tests/fixtures/traffic, see its README) fed through the capture's
own code, and the rows that lay a profile beside the default load."""

from __future__ import annotations

import re
from pathlib import Path

from ernie_tui.engine_ctl.load import BurstConfig, MetricsSnapshot, build_profile, from_metrics
from ernie_tui.engine_ctl.load.traffic_shapes import built_in
from ernie_tui.tui.traffic_watch import ROWS, DefaultLoad, TrafficWatch, comparison, how_far

FIX = Path(__file__).parent / "fixtures" / "traffic" / "cpu-vllm0.32.0"
URL = "http://127.0.0.1:8000"


def scrape(name: str, t: float) -> MetricsSnapshot:
    return MetricsSnapshot.parse((FIX / name).read_text(), timestamp=1000.0 + t, mono=t)


def delta(family: str) -> float:
    """A counter's (or a histogram's _count) window delta read straight off the text."""
    def value(f: str) -> float:
        pat = re.compile(rf"^{re.escape(family)}\{{[^}}]*\}} (\S+)$", re.M)
        return sum(float(v) for v in pat.findall((FIX / f).read_text()))
    return value("window_after.metrics") - value("window_before.metrics")


def fed(*scrapes: tuple[str, float]) -> TrafficWatch:
    w = TrafficWatch()
    for name, t in scrapes:
        w.add(URL, scrape(name, t))
    return w


def test_a_window_of_real_scrapes_reads_as_the_capture_reads_it():
    w = fed(("window_before.metrics", 0.0), ("window_before.metrics", 5.0), ("window_after.metrics", 10.0),
            ("window_after.metrics", 15.0))
    s = w.state()
    n = delta("vllm:request_success_total")
    assert n == 40 and s.problem is None and s.scrapes == 4 and s.window_s == 15.0
    assert s.requests == n
    # The histograms of the window, whole: their counts are the text's deltas.
    assert s.prompt is not None and s.prompt.count == delta("vllm:request_prompt_tokens_count")
    assert s.output is not None and s.output.count == delta("vllm:request_generation_tokens_count")
    assert s.max_tokens is not None and s.max_tokens.count == n
    # Requests finished per interval, placed before the newest scrape.
    assert s.rates == ((-10.0, 0.0), (-5.0, n / 5.0), (0.0, 0.0))
    hits, queries = delta("vllm:prefix_cache_hits_total"), delta("vllm:prefix_cache_queries_total")
    assert s.hit_rate == round(hits / queries, 4) and 0 < s.hit_rate < 1
    # The profile is the one `traffic capture` builds from the same scrapes.
    before, mid1, mid2, after = (scrape(f, t) for f, t in (("window_before.metrics", 0.0),
                                                           ("window_before.metrics", 5.0),
                                                           ("window_after.metrics", 10.0),
                                                           ("window_after.metrics", 15.0)))
    ref = build_profile("captured", [from_metrics(before, after, [mid1, mid2])], url=URL)
    assert s.profile is not None and s.profile.digest == ref.digest


def test_no_profile_until_requests_finish_and_the_reason_is_said():
    assert TrafficWatch().state().problem == "no /metrics read yet"
    assert fed(("window_before.metrics", 0.0)).state().problem == "waiting for a second /metrics scrape"
    s = fed(("window_before.metrics", 0.0), ("window_before.metrics", 5.0)).state()
    assert s.profile is None and "no request finished" in (s.problem or "")
    assert s.prompt is not None and s.prompt.count == 0  # the histograms are there, empty


def test_a_restart_a_new_url_or_a_new_window_starts_afresh():
    w = fed(("window_before.metrics", 0.0), ("window_after.metrics", 5.0))
    assert w.state().requests == 40
    w.add(URL, scrape("window_before.metrics", 10.0))  # the counters fell: the server restarted
    assert w.state().scrapes == 1
    w.add(URL, scrape("window_after.metrics", 15.0))
    assert w.state().requests == 40
    w.add("http://127.0.0.1:8001", scrape("window_after.metrics", 20.0))
    assert w.state().scrapes == 1 and w.state().url == "http://127.0.0.1:8001"
    w.add("http://127.0.0.1:8001", scrape("window_after.metrics", 25.0))
    w.restart()
    assert w.state().scrapes == 0
    w.add("http://127.0.0.1:8001", scrape("window_after.metrics", 30.0))
    assert w.state().scrapes == 1


def test_since_the_server_started_reads_all_it_served():
    """vLLM's counters and histograms run from its start, and it says when
    that was: the whole of what it served, read from one scrape."""
    text = (FIX / "window_after.metrics").read_text()
    created = min(float(v) for v in re.findall(r"^vllm:request_success_created\{[^}]*\} (\S+)$", text, re.M))
    w = TrafficWatch()
    w.add(URL, MetricsSnapshot.parse(text, timestamp=created + 90.0, mono=500.0))
    window = w.state()
    assert window.profile is None and window.served == 80  # rounds 1 and 2 (README); one scrape: no window yet
    w.set_scope("start")
    s = w.state()
    served = float(re.search(r"^vllm:request_prompt_tokens_count\{[^}]*\} (\S+)$", text, re.M).group(1))
    assert s.scope == "start" and s.problem is None and s.requests == served == 80
    assert abs(s.window_s - 90.0) < 1e-6 and s.prompt is not None and s.prompt.count == 80
    assert s.watched_s == 0.0  # the rate chart spans what was watched: one scrape, nothing yet
    assert s.profile is not None and abs(s.profile.arrivals.rate_per_s - 80 / 90.0) < 1e-9
    # Without `_created` samples the API process' start stands for it; with neither, the view says so.
    bare = "\n".join(line for line in text.splitlines() if "_created" not in line)
    w.add(URL, MetricsSnapshot.parse(bare, timestamp=created + 95.0, mono=505.0))
    start = float(re.search(r"^process_start_time_seconds (\S+)$", text, re.M).group(1))
    assert abs(w.state().window_s - (created + 95.0 - start)) < 1e-6
    w.add(URL, MetricsSnapshot.parse("\n".join(line for line in bare.splitlines() if "process_start" not in line),
                                     timestamp=created + 99.0, mono=509.0))
    assert w.state().problem == "this server's /metrics does not say when it started"
    w.restart()  # a new window is watched, not counted from the start
    assert w.state().scope == "window"


def test_a_long_window_is_thinned_and_keeps_its_start():
    w = TrafficWatch(max_scrapes=8)
    for i in range(30):
        w.add(URL, scrape("window_before.metrics" if i < 29 else "window_after.metrics", float(i)))
    s = w.state()
    assert 4 <= s.scrapes <= 8 and s.window_s == 29.0 and s.requests == 40


def test_a_profile_beside_the_default_load():
    d = DefaultLoad.from_config(BurstConfig())
    assert (d.min_tokens, d.max_tokens_in, d.max_tokens) == (30, 300, 128)
    header, rows = comparison([("chat", built_in("chat"))], d)
    assert header == ["", "chat", "default load"]
    assert [r[0] for r in rows] == list(ROWS)
    table = {r[0]: r[1:] for r in rows}
    assert table["prompt p10/50/90"] == ["180/260/520", "57/165/273"]
    assert table["output p10/50/90"] == ["40/170/420", "128/128/128"]
    assert table["stop early"] == ["90 %", "0 %"]
    assert table["shared prefix"] == ["100 % × 150", "none"]
    assert table["arrivals"] == ["1/s CV 1.5?", "closed, 4 at once"]  # ? : the CV is assumed, not measured
    far = how_far(built_in("chat"), d)
    assert "prompt p50 ×0.63" in far and "output p50 ×0.75" in far and "stops early 0 % vs 90 %" in far
    assert "no shared prefix vs 100 %" in far
    # No profile yet: its column is dashes.
    _, rows = comparison([("captured", None)], d)
    assert all(r[1] == "–" for r in rows)
