"""The fleet poller (engine_ctl/control/fleet.py): rows from real /metrics captures,
data-parallel engines, stale figures of a server that stopped answering, the
fleet file, and per-server timeouts against real local HTTP servers."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from ernie_tui.engine_ctl.control.fleet import (
    FleetError,
    FleetPoller,
    FleetServer,
    LocalMemory,
    ServerPoller,
    load_fleet,
    servers_from_urls,
)
from ernie_tui.engine_ctl.control.resources import ResourceSampler
from ernie_tui.engine_ctl.launch.ports import free_port, port_is_free
from ernie_tui.engine_ctl.load import metrics as m

CPU = "cpu-vllm0.32.0/ok_block32_len2048.metrics"
GPU = "gpu-h200-vllm0.26.0/ok_block16_len4096.metrics"
_SAMPLE = re.compile(r"^(?P<name>[^{\s]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def fixture_text(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / name).read_text()


def transform(text: str, fn) -> str:
    """Rewrite each sample's value: fn(name, labels, value) -> new value."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            out.append(line)
            continue
        value = fn(match["name"], match["labels"] or "", float(match["value"]))
        out.append(f"{match['name']}{{{match['labels']}}} {value!r}" if match["labels"] else
                   f"{match['name']} {value!r}")
    return "\n".join(out) + "\n"


def scaled(text: str, factor: float) -> str:
    """The same server later: every counter and histogram `factor` times as
    far along (what a window sees is exactly the capture's own history)."""
    grows = ("_total", "_bucket", "_count", "_sum")
    return transform(text, lambda name, labels, v: v * factor if name.endswith(grows) else v)


def with_second_engine(text: str, change) -> str:
    """A data-parallel scrape: each engine="0" sample gets an engine="1" copy,
    its value passed through change(name, value)."""
    out = []
    for line in text.splitlines():
        out.append(line)
        match = _SAMPLE.match(line)
        if match is not None and not line.startswith("#") and 'engine="0"' in (match["labels"] or ""):
            labels = match["labels"].replace('engine="0"', 'engine="1"')
            out.append(f"{match['name']}{{{labels}}} {change(match['name'], float(match['value']))!r}")
    return "\n".join(out) + "\n"


def poller(name: str = "a", url: str = "http://10.9.9.9:8000", **kw) -> ServerPoller:
    return ServerPoller(FleetServer(name, url, preset=kw.pop("preset", None)), **kw)


# -- rows from real captures ---------------------------------------------------------

def test_first_scrape_of_the_cpu_capture(fixtures_dir):
    rows = poller(preset="cpu-demo").ingest(fixture_text(fixtures_dir, CPU), mono=0.0, now=1000.0)
    assert len(rows) == 1
    row = rows[0]
    assert (row.state, row.model, row.preset, row.engines) == ("up", "tiny-ernie", "cpu-demo", 1)
    assert (row.kv_pct, row.running, row.waiting) == (0.0, 0.0, 0.0)
    # one scrape is no window: no rate, no percentiles yet
    assert row.gen_tps is None and row.ttft_p99_s is None and row.itl_p99_s is None
    assert row.last_ok == 1000.0 and row.down_since is None


def test_partial_h200_capture_gives_what_it_holds(fixtures_dir):
    # The H200 capture (vLLM 0.26.0) kept five lines: no running/waiting, no histograms.
    text = fixture_text(fixtures_dir, GPU)
    p = poller()
    p.ingest(text, mono=0.0, now=0.0)
    row = p.ingest(scaled(text, 2.0), mono=4.0, now=4.0)[0]
    assert (row.model, row.kv_pct, row.running, row.waiting) == ("ernie-4.5-0.3b", 0.0, None, None)
    assert row.gen_tps == pytest.approx(38672.0 / 4)
    assert row.ttft_p99_s is None and row.itl_p99_s is None


def test_window_rate_and_p99_from_vllms_histograms(fixtures_dir):
    text = fixture_text(fixtures_dir, CPU)
    later = scaled(text, 2.0)  # in the window: exactly the capture's own requests
    whole = m.MetricsSnapshot.parse(text)
    p = poller()
    p.ingest(text, mono=10.0, now=1000.0)
    row = p.ingest(later, mono=12.0, now=1002.0)[0]
    assert row.gen_tps == pytest.approx(whole.generation_tokens / 2.0)
    assert row.gen_tps > 0
    assert row.ttft_p99_s == pytest.approx(whole.histogram(m.TTFT).quantile(0.99))
    assert row.itl_p99_s == pytest.approx(whole.histogram(m.ITL).quantile(0.99))
    # the estimate lies inside the bucket that holds the 99th percentile request
    ttft = whole.histogram(m.TTFT)
    rank = 0.99 * ttft.buckets[-1][1]
    upper = next(bound for bound, cum in ttft.buckets if cum >= rank)
    assert 0 < row.ttft_p99_s <= upper


def test_percentiles_cover_the_last_minute_only(fixtures_dir):
    text = fixture_text(fixtures_dir, CPU)
    p = poller()
    p.ingest(text, mono=0.0, now=0.0)
    p.ingest(scaled(text, 2.0), mono=1.0, now=1.0)  # requests at t=1
    quiet = scaled(text, 2.0)
    for t in range(2, 65):  # then a quiet minute and more
        row = p.ingest(quiet, mono=float(t), now=float(t))[0]
    assert row.ttft_p99_s is None and row.itl_p99_s is None  # nothing in the last minute
    assert row.gen_tps == 0.0


def test_a_restarted_server_gives_no_rate_across_the_restart(fixtures_dir):
    text = fixture_text(fixtures_dir, CPU)
    p = poller()
    p.ingest(scaled(text, 3.0), mono=0.0, now=0.0)
    row = p.ingest(text, mono=1.0, now=1.0)[0]  # counters went back: a new server process
    assert row.gen_tps is None and row.ttft_p99_s is None
    row = p.ingest(scaled(text, 2.0), mono=2.0, now=2.0)[0]
    assert row.gen_tps == pytest.approx(m.MetricsSnapshot.parse(text).generation_tokens)


# -- data parallel: the engine label ---------------------------------------------------

def test_data_parallel_server_gets_a_row_per_engine(fixtures_dir):
    base = fixture_text(fixtures_dir, CPU)
    gauges = {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 5.0, "vllm:kv_cache_usage_perc": 0.5}

    def engine1(name: str, value: float) -> float:
        return gauges.get(name, value * 3 if name.endswith(("_total", "_bucket", "_count", "_sum")) else value)

    text = with_second_engine(base, engine1)
    p = poller("dp")
    p.ingest(text, mono=0.0, now=0.0)
    rows = p.ingest(scaled(text, 2.0), mono=1.0, now=1.0)
    assert [r.key for r in rows] == ["dp", "dp/engine 0", "dp/engine 1"]
    server, e0, e1 = rows
    assert {r.engines for r in rows} == {2}
    assert (e0.engine, e1.engine, server.engine) == ("0", "1", None)
    assert (e0.running, e0.waiting, e0.kv_pct) == (0.0, 0.0, 0.0)
    assert (e1.running, e1.waiting, e1.kv_pct) == (3.0, 5.0, 50.0)
    # the server: requests summed, KV the fullest engine, tokens summed
    assert (server.running, server.waiting, server.kv_pct) == (3.0, 5.0, 50.0)
    one = m.MetricsSnapshot.parse(base).generation_tokens
    assert e0.gen_tps == pytest.approx(one)
    assert e1.gen_tps == pytest.approx(3 * one)
    assert server.gen_tps == pytest.approx(4 * one)
    # engine 1 saw every request three times over: the same distribution
    assert e1.ttft_p99_s == pytest.approx(e0.ttft_p99_s)
    assert all(r.model == "tiny-ernie" for r in rows)


def test_label_values_and_where_split_a_scrape_by_engine(fixtures_dir):
    text = with_second_engine(fixture_text(fixtures_dir, CPU), lambda name, v: v + 1)
    snap = m.MetricsSnapshot.parse(text)
    assert snap.label_values("engine") == ["0", "1"]
    e1 = snap.where("engine", "1")
    assert e1.label_values("engine") == ["1"]
    assert e1.running == 1.0 and snap.running == 1.0
    assert e1.cache_config() is not None  # cache_config_info carries the engine label too
    # samples without the label (process_*) belong to every engine's view
    assert e1.has("process_resident_memory_bytes")


# -- a server that stops answering -------------------------------------------------------

def test_stopped_server_keeps_last_good_figures_and_since_when(fixtures_dir):
    text = fixture_text(fixtures_dir, CPU)
    p = poller()
    p.ingest(text, mono=0.0, now=100.0)
    good = p.ingest(scaled(text, 2.0), mono=1.0, now=101.0)[0]
    down = p.failed("cannot connect", now=102.0)[0]
    again = p.failed("cannot connect", now=105.0)[0]
    for row in (down, again):
        assert row.state == "down" and row.error == "cannot connect"
        assert row.down_since == 102.0  # the first failure, not the latest
        assert row.last_ok == 101.0
        assert (row.kv_pct, row.gen_tps, row.ttft_p99_s) == (good.kv_pct, good.gen_tps, good.ttft_p99_s)
    assert again.polled_at == 105.0
    back = p.ingest(scaled(text, 3.0), mono=6.0, now=106.0)[0]
    assert back.state == "up" and back.down_since is None
    assert back.gen_tps is None  # no rate across the gap: it may have restarted


def test_server_that_never_answered_has_no_figures():
    row = poller(preset="seed-A").failed("cannot connect", now=50.0)[0]
    assert (row.state, row.down_since, row.last_ok, row.preset) == ("down", 50.0, None, "seed-A")
    assert row.kv_pct is None and row.model is None


# -- the fleet file --------------------------------------------------------------------

def test_fleet_file(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text('[servers.head]\nurl = "http://10.0.0.1:8000"\nlog = "~/vllm/llm.log"\npreset = "seed-A"\n'
                    '[servers.b]\nurl = "http://10.0.0.2:8000"\napi_key_env = "B_KEY"\n')
    head, b = load_fleet(path)
    assert (head.name, head.url, head.preset) == ("head", "http://10.0.0.1:8000", "seed-A")
    assert head.log == str(Path("~/vllm/llm.log").expanduser())
    assert (b.log, b.preset, b.api_key_env) == (None, None, "B_KEY")
    os.environ["B_KEY"] = "k"
    try:
        assert b.api_key == "k"
    finally:
        del os.environ["B_KEY"]


@pytest.mark.parametrize("text,message", [
    ('[servers.a]\nurl = "http://x:1"\nport = 3\n', "unknown key port"),
    ('[servers.a]\nlog = "x"\n', "needs url"),
    ("[other]\n", "no [servers.NAME]"),
    ("[servers\n", "fleet.toml"),
    ('[servers.a]\nurl = "http://x:1"\npreset = 3\n', "must be a string"),
])
def test_bad_fleet_files_say_why(tmp_path, text, message):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(FleetError, match=re.escape(message)):
        load_fleet(path)


def test_names_for_bare_urls():
    servers = servers_from_urls(["http://10.0.0.1:8000", "http://10.0.0.1:8000/v1", "127.0.0.1:9000"],
                                taken=["x"])
    assert [s.name for s in servers] == ["10.0.0.1:8000", "10.0.0.1:8000#2", "127.0.0.1:9000"]


# -- real local HTTP servers: timeouts stay per server -------------------------------------

class _MetricsServer:
    """A real HTTP server serving a capture, counting its scrapes."""

    def __init__(self, text: str):
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                owner.scrapes += 1
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hanging_url():
    """A port that accepts connections and never answers (a wedged server)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_hanging_server_never_delays_the_others(fixtures_dir, hanging_url):
    good = _MetricsServer(fixture_text(fixtures_dir, CPU))
    fleet = FleetPoller([FleetServer("wedged", hanging_url), FleetServer("good", good.url)],
                        interval=0.1, timeout=1.5, memory=False)
    try:
        rows = {r.server: r for r in fleet.poll_once()}
        assert rows["good"].state == "up" and rows["good"].model == "tiny-ernie"
        assert rows["wedged"].state == "down" and "did not answer" in rows["wedged"].error

        seen: dict[str, list[float]] = {"wedged": [], "good": []}
        good_at_first_hang: list[int] = []
        hung_once = threading.Event()
        stop = threading.Event()

        def polled(name: str, rows) -> None:
            seen[name].append(time.monotonic())
            if name == "wedged" and not hung_once.is_set():
                good_at_first_hang.append(len(seen["good"]))
                hung_once.set()

        runner = threading.Thread(target=fleet.run, args=(polled, stop.is_set))
        runner.start()
        assert hung_once.wait(60)  # the wedged server's first poll gave up after its 1.5 s timeout
        stop.set()
        runner.join(15)
        assert not runner.is_alive()
        # The good server was polled on its own 0.1 s period while that one
        # poll hung (counted against the hang, not against a sleep of ours).
        assert good_at_first_hang[0] >= 3, seen
    finally:
        good.close()


def test_local_server_memory_is_its_process_rss(tmp_path):
    # A server in a process of its own, as a real one is: a server inside the test
    # process would count the test's children too (the session's shared vLLM).
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while port_is_free("127.0.0.1", port)[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        mem = LocalMemory(f"http://127.0.0.1:{port}",
                          sampler_factory=lambda pids: ResourceSampler(pids=pids, use_nvml=False))
        assert mem.local
        used, source = mem.sample()
        assert source == "rss"
        assert used == pytest.approx(psutil.Process(proc.pid).memory_info().rss, rel=0.2)
        assert LocalMemory("http://192.0.2.1:8000").sample() == (None, None)  # elsewhere: no figure
        assert not LocalMemory("http://192.0.2.1:8000").local
    finally:
        proc.kill()
        proc.wait()
