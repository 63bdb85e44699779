"""A failing /metrics says what is wrong and since when (issue #10, 6).

The dashboard attaches to a real local HTTP stand-in whose /health answers
and whose /metrics answers HTTP 500, garbage, or nothing (hangs) on demand;
the charts must say so, with the time it began, and clear it once /metrics
answers again. (Connection refused is the client's own reason, tested in
test_metrics.py: an attached server whose port is closed is 'unreachable'.)
"""

from __future__ import annotations

import re
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ernie_tui.engine_ctl.load.metrics import MetricsClient
from ernie_tui.tui.app import make_app
from ernie_tui.tui.widgets.charts import KVChart, MemoryChart, ThroughputChart
from test_tui_pilot import wait_for

GOOD = """# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} %d.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} %d.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
"""


class StandIn:
    """/health always 200; /metrics as `mode` says: ok, 500, garbage, hang."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.release = threading.Event()
        self.count = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self.path != "/metrics":
                    self._send(200, b"")
                    return
                mode = stand_in.mode
                if mode == "500":
                    self._send(500, b"Internal Server Error")
                elif mode == "garbage":
                    self._send(200, b"<html><body>\x00\xff not prometheus {{{</body></html>\n")
                elif mode == "hang":
                    stand_in.release.wait(10)
                else:
                    stand_in.count += 1
                    self._send(200, (GOOD % (100 * stand_in.count, 800 * stand_in.count)).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    s = StandIn()
    yield s
    s.close()


SINCE = re.compile(r"/metrics: (.+) since (\d\d:\d\d:\d\d) \((\d+) s\)")


def alert(app) -> str:
    """The status bar's facts: a /metrics problem comes first, in full."""
    return str(app.main.query_one("#sb-facts").content)


async def test_failing_metrics_says_what_and_since_when(stand_in):
    app = make_app(mode="attach", attach_url=stand_in.url, sample_interval=0.2,
                   metrics_factory=partial(MetricsClient, timeout=0.5))
    async with app.run_test(size=(120, 40)) as pilot:
        tps = app.main.query_one(ThroughputChart)
        kv = app.main.query_one(KVChart)
        await wait_for(pilot, lambda: str(tps.border_subtitle).startswith("prompt "), timeout=60,
                       what="figures from /metrics")
        assert not SINCE.search(alert(app))

        stand_in.mode = "500"
        await wait_for(pilot, lambda: SINCE.search(alert(app)), timeout=60, what="the HTTP 500 in the status bar")
        m = SINCE.search(alert(app))
        assert m.group(1) == "HTTP 500", alert(app)
        began = m.group(2)
        # The charts still show the older figures, and say they are old.
        for chart in (tps, kv):
            assert "/metrics: HTTP 500 (" in str(chart.border_subtitle)
        assert "/metrics" not in str(app.main.query_one(MemoryChart).border_subtitle)
        # It keeps its start and counts up while the failure lasts.
        await wait_for(pilot, lambda: int(SINCE.search(alert(app)).group(3)) >= 2, timeout=60,
                       what="the duration to count up")
        assert SINCE.search(alert(app)).group(2) == began

        # Answers again: the error clears and figures come back.
        stand_in.mode = "ok"
        await wait_for(pilot, lambda: not SINCE.search(alert(app)), timeout=60, what="the error to clear")
        await wait_for(pilot, lambda: str(tps.border_subtitle).startswith("prompt ")
                       and str(kv.border_subtitle).startswith("KV 25"), timeout=15, what="the figures back")
        assert app._last_series.metrics_error is None

        stand_in.mode = "garbage"
        await wait_for(pilot, lambda: SINCE.search(alert(app)), timeout=60, what="the parse error")
        assert SINCE.search(alert(app)).group(1).startswith("parse error"), alert(app)
        assert "/metrics: parse error" in str(tps.border_subtitle)

        stand_in.mode = "hang"
        await wait_for(pilot, lambda: "no answer within 0.5 s since" in alert(app), timeout=60, what="the timeout")
        stand_in.release.set()
        stand_in.mode = "ok"
        await wait_for(pilot, lambda: not SINCE.search(alert(app)), timeout=60,
                       what="the error to clear after the hang")


async def test_metrics_error_shown_when_no_figures_yet(stand_in):
    """With nothing to plot yet, the charts' own message is the error, in
    place of 'waiting for /metrics'."""
    from plotext._utility import uncolorize

    stand_in.mode = "500"
    app = make_app(mode="attach", attach_url=stand_in.url, sample_interval=0.2,
                   metrics_factory=partial(MetricsClient, timeout=0.5))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: SINCE.search(alert(app)), timeout=60, what="the HTTP 500")
        await pilot.pause(0.3)
        began = SINCE.search(alert(app)).group(2)
        for cls in (ThroughputChart, KVChart):
            picture = uncolorize(app.main.query_one(cls).plt.build())
            assert "/metrics: HTTP 500" in picture and f"since {began} (" in picture, picture
            assert "waiting for /metrics" not in picture
