"""The traffic view (`T`, tui/screens/traffic.py) at 80x24 and 120x40.

The dashboard attaches to a local stand-in whose /metrics answers with real
vLLM scrapes (tests/fixtures/traffic: a window of 40 requests, see its
README), so what is shown went through the real sampler, the real parser and
the real capture code; then once against the paced stand-in
(tests/paced_server.py), live, with requests sent to it."""

from __future__ import annotations

import json
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from ernie_tui import paths
from ernie_tui.engine_ctl.load import MetricsSnapshot, TrafficProfile, build_profile, from_metrics, from_trace
from ernie_tui.engine_ctl.load.traffic_capture import TraceRequest
from ernie_tui.tui.app import make_app
from ernie_tui.tui.messages import TrafficUpdate
from ernie_tui.tui.screens.traffic import TrafficScreen
from ernie_tui.tui.traffic_watch import TrafficState
from ernie_tui.tui.widgets.traffic_charts import ArrivalChart, LengthHistogram
from test_tui_pilot import wait_for

FIX = Path(__file__).parent / "fixtures" / "traffic" / "cpu-vllm0.32.0"
SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


class RealScrapes:
    """/health 200; /metrics: the window's first real scrape `before` times,
    then its last one for good (40 requests finished between them)."""

    def __init__(self, before: int = 3) -> None:
        self.texts = [(FIX / "window_before.metrics").read_text()] * before
        self.after = (FIX / "window_after.metrics").read_text()
        scrapes = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                body = b""
                if self.path == "/metrics":
                    body = (scrapes.texts.pop(0) if scrapes.texts else scrapes.after).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scrapes():
    s = RealScrapes()
    yield s
    s.close()


def reference() -> TrafficProfile:
    """The profile `traffic capture` makes of the same two scrapes."""
    before = MetricsSnapshot.parse((FIX / "window_before.metrics").read_text(), timestamp=0.0, mono=0.0)
    after = MetricsSnapshot.parse((FIX / "window_after.metrics").read_text(), timestamp=15.0, mono=15.0)
    return build_profile("captured", [from_metrics(before, after)])


def shape(p: TrafficProfile) -> dict:
    """A profile's lengths, early stops and prefix: what does not hang on the window's timing."""
    d = p.to_dict()
    return {k: d[k] for k in ("prompt_tokens", "output_tokens", "max_tokens", "eos_share", "prefix")}


def attached(url: str):
    return make_app(mode="attach", attach_url=url, include_user_presets=False, sample_interval=0.1,
                    traffic_interval=0.1)


def table_text(screen: TrafficScreen) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(screen._table())
    return console.export_text()


def inside(region, size) -> bool:
    return region.width > 0 and region.height > 0 and region.right <= size[0] and region.bottom <= size[1] - 1


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
async def test_the_view_shows_a_real_window_read_by_the_capture(scrapes, size):
    ref = reference()
    app = attached(scrapes.url)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.last_traffic is not None and app.last_traffic.requests == 40,
                       timeout=30, what="the window's 40 requests")
        await pilot.press("T")
        screen = app.screen
        assert isinstance(screen, TrafficScreen)
        await pilot.pause(0.2)
        state = screen.state
        assert state.profile is not None and shape(state.profile) == shape(ref)
        head = str(screen.query_one("#tr-head").render())
        assert f"Traffic {scrapes.url}" in head and "40 requests" in head and "prefix-cache hits 66.9 %" in head
        # One chart a histogram: the window's requests in vLLM's buckets, the default's bucket marked.
        for wid, hist in (("#tr-prompt", state.prompt), ("#tr-output", state.output), ("#tr-max", state.max_tokens)):
            chart = screen.query_one(wid, LengthHistogram)
            assert hist is not None and sum(chart.counts) == hist.count == 40, wid
            assert chart.labels[0].startswith("≤") and "default" in str(chart.border_subtitle)
        prompt = screen.query_one("#tr-prompt", LengthHistogram)
        assert "≤200" in prompt.labels  # the default's median, 165, is in (100, 200]
        assert screen.query_one("#tr-rate", ArrivalChart).rates == state.rates and len(state.rates) >= 3
        # The profile beside the default load, each cell as the capture reads it.
        text = table_text(screen)
        p10, p50, p90 = (ref.prompt_tokens.quantile(q) for q in (0.1, 0.5, 0.9))
        assert f"{p10:,.0f}/{p50:,.0f}/{p90:,.0f}" in text and "57/165/273" in text
        assert "128/128/128" in text and "the default load against captured: prompt p50" in text
        # Every region on screen, none under another.
        regions = [screen.query_one(w).region for w in ("#tr-head", "#tr-prompt", "#tr-output", "#tr-max",
                                                         "#tr-rate", "#tr-table")]
        assert all(inside(r, size) for r in regions), regions
        assert not any(a.overlaps(b) for i, a in enumerate(regions) for b in regions[i + 1:]), regions
        footer = screen._compositor.render_strips()[-1].text
        assert "^s Save profile" in footer and "o Compare" in footer and "esc Close" in footer, footer

        # ctrl+s: the profile to a file, the notice naming it and the command that replays it.
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        saved = sorted((paths.data_dir() / "traffic").glob("traffic-*.json"))
        assert len(saved) == 1
        back = TrafficProfile.from_json(saved[0].read_text())
        assert back.digest == state.profile.digest and shape(back) == shape(ref)
        assert back.name == saved[0].stem and back.texts is None
        notes = [n.message for n in app._notifications]
        assert any(f"saved {saved[0]}" in m and f"--traffic {saved[0]}" in m and f"--url {scrapes.url}" in m
                   for m in notes), notes

        # o: a ready-made shape beside the capture; at 80 columns the table takes the rate chart's room.
        await pilot.press("o", *"chat", "enter")
        await pilot.pause(0.2)
        text = table_text(screen)
        assert "chat" in text and "180/260/520" in text and "the default load against chat" in text
        table = screen.query_one("#tr-table").region
        assert inside(table, size), table
        assert screen.query_one("#tr-rate").display == (size[0] >= 100)
        await pilot.press("o", "ctrl+u", "enter")  # empty: none beside it again
        await pilot.pause(0.1)
        assert screen.loaded is None and "chat" not in table_text(screen)

        # a: all the server served since it started (its counters run from then), and back.
        assert "a: all 80 since it started" in str(screen.query_one("#tr-head").render())
        await pilot.press("a")
        await pilot.pause(0.1)
        assert screen.state.scope == "start" and screen.state.requests == 80
        assert "since it started" in str(screen.query_one("#tr-head").render())
        assert sum(screen.query_one("#tr-prompt", LengthHistogram).counts) == 80
        assert "a Window" in screen._compositor.render_strips()[-1].text
        await pilot.press("a")
        await pilot.pause(0.1)
        assert screen.state.scope == "window" and screen.state.requests == 40

        # n: a new window, where nothing has finished yet.
        await pilot.press("n")
        await wait_for(pilot, lambda: screen.state.scrapes >= 2 and screen.state.requests == 0, timeout=30,
                       what="a new window")
        assert screen.state.profile is None and "no request finished" in (screen.state.problem or "")
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert app.screen is app.main


async def test_a_profile_with_prompt_text_is_saved_private(tmp_path):
    """The view saves what it is handed; a profile holding text goes 0600."""
    cap = from_trace([TraceRequest(at=float(i), text=f"hello there number {i}", prompt_tokens=5 + i, max_tokens=16,
                                   output_tokens=4, finish_reason="stop") for i in range(4)], keep_text=True)
    profile = build_profile("t", [cap], keep_text=True)
    assert profile.texts
    app = make_app(mode="attach", attach_url="http://127.0.0.1:9", live=False, include_user_presets=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("T")
        screen = app.screen
        assert isinstance(screen, TrafficScreen) and screen.state.profile is None
        await pilot.press("ctrl+s")  # nothing captured yet: says so, writes nothing
        await pilot.pause(0.1)
        assert any("nothing captured yet" in n.message for n in app._notifications)
        assert not (paths.data_dir() / "traffic").exists() or not list((paths.data_dir() / "traffic").iterdir())
        app.post_message(TrafficUpdate(TrafficState(url="http://127.0.0.1:9", scrapes=2, window_s=3.0, requests=4,
                                                    profile=profile)))
        await pilot.pause(0.1)
        path = screen.action_save()
        assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text())["texts"] == profile.texts


async def test_a_replayed_log_has_no_traffic_key(fixtures_dir):
    app = make_app(mode="replay", replay_path=str(fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.log"),
                   include_user_presets=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.2)
        assert app.main.check_action("traffic", ()) is False
        assert "T Traffic" not in app.screen._compositor.render_strips()[-1].text


async def test_live_against_the_paced_stand_in(stand_in):
    """Requests of known lengths sent to the paced stand-in show up in the
    view's histograms, counted by its own vLLM-style /metrics."""
    url = stand_in("--slots", "4", "--ttft-ms", "5", "--itl-ms", "1")
    app = attached(url)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.last_traffic is not None and app.last_traffic.scrapes >= 2, timeout=30,
                       what="the window's first scrapes")
        await pilot.press("T")
        words = {3: 2, 30: 3, 300: 1}  # prompt words (one token each): requests
        with httpx.Client(timeout=30) as client:
            for n, k in words.items():
                for _ in range(k):
                    r = client.post(f"{url}/v1/completions", json={"model": "paced", "prompt": " ".join(["hi"] * n),
                                                                    "max_tokens": 8})
                    assert r.status_code == 200, r.text
        screen = app.screen
        await wait_for(pilot, lambda: screen.state.requests == 6, timeout=30, what="the six requests")
        await pilot.pause(0.2)
        chart = screen.query_one("#tr-prompt", LengthHistogram)
        assert sum(chart.counts) == 6
        got = dict(zip(chart.labels, chart.counts, strict=True))
        assert got["≤5"] == 2 and got["≤50"] == 3 and got["≤500"] == 1, got
        assert dict(zip(screen.query_one("#tr-max", LengthHistogram).labels,
                        screen.query_one("#tr-max", LengthHistogram).counts, strict=True))["≤10"] == 6
        assert "6 requests" in str(screen.query_one("#tr-head").render())


async def test_a_bug_in_reading_the_traffic_is_shown_once_and_the_charts_go_on(scrapes):
    """The traffic view is extra: a bug in it must not stop the sampler that draws the charts."""
    from ernie_tui.tui.traffic_watch import TrafficWatch

    class Broken(TrafficWatch):
        def state(self) -> TrafficState:
            raise RuntimeError("a bug in the traffic window")

    app = attached(scrapes.url)
    app.traffic = Broken()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: any("a bug in the traffic window" in n.message for n in app._notifications),
                       timeout=30, what="the failure shown")
        seen = app._last_series.points[-1].t if app._last_series and app._last_series.points else None
        await wait_for(pilot, lambda: app._last_series.points[-1].t != seen, timeout=30, what="the charts going on")
        assert sum("a bug in the traffic window" in n.message for n in app._notifications) == 1
        assert app.last_traffic is None
