"""The dashboard's capacity modes against real vLLM (CPU build, tiny model).

test_tui_probe.py drives the same widgets against the paced stand-in, whose
timing is known; here the server is the shared real cpu-demo one
(tests/vllm_support.py) and the checks are that what the dashboard draws and
says is what the real run measured: the Burst tab's search (levels drawn as
they finish, the answer, figures that agree with vLLM's own /metrics), its
cancel (no request left running in vLLM), and the sweep screen's capacity
mode launching real servers.

The SLO is loose (TTFT p90 under 5 s, ITL p50 under 2 s) so that a 2-core
box shared with other work meets it at every level tried: the tests check
the plumbing and the figures' coherence, not how fast this box is.
"""

from __future__ import annotations

import time

import pytest
from textual.widgets import DataTable, Input

from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.tui.screens.probe import ProbeScreen
from ernie_tui.tui.widgets.charts import CapacityChart
from search_looks import assert_search_path
from test_tui_probe import Host, _open_probe, shown, wait_for
from vllm_support import EAGER_TOML

LOOSE_SLO = "ttft_p90=5s itl_p50=2s"
MAX_TOKENS = 8  # ignore_eos is on: every answer is exactly this long


async def _capacity_form(pilot, app, **fields: str):
    screen = await _open_probe(pilot, app)
    await pilot.press("ctrl+b")
    screen.query_one("#pf-b-capacity").value = True
    tab = screen.burst_tab
    # The box's message sets the mode: waited for, as a stalled box handles it late.
    await wait_for(pilot, lambda: tab.has_class("-capacity"), 30, "the capacity search's mode")
    for wid, value in fields.items():
        screen.query_one(f"#{wid}", Input).value = value
    return screen, tab


def _scrape(url: str) -> M.MetricsSnapshot:
    # A long timeout: a 2-core box busy decoding can take seconds to answer.
    with M.MetricsClient(url, timeout=30.0) as client:
        return client.fetch()


def _running_requests(url: str) -> float | None:
    return _scrape(url).running


@pytest.mark.vllm
@pytest.mark.timeout(600)
async def test_burst_tab_capacity_search_on_real_vllm(cpu_server):
    from ernie_tui.engine_ctl.load.runstore import load_run

    url = cpu_server.status.url
    app = Host(ProbeScreen(url))
    async with app.run_test(size=(120, 40)) as pilot:
        screen, tab = await _capacity_form(pilot, app, **{
            "pf-cap-slo": LOOSE_SLO, "pf-b-max": str(MAX_TOKENS), "pf-b-lmin": "10", "pf-b-lmax": "40",
            "pf-cap-maxc": "4", "pf-cap-minr": "10", "pf-cap-maxr": "40", "pf-cap-time": "20"})
        chart = screen.query_one(CapacityChart)
        # Every redraw of the chart, with whether the search was still going:
        # the levels must appear one by one while it runs, not all at the end.
        draws: list[tuple[int, bool]] = []
        show = chart.show

        def recording_show(curves, *args, **kwargs):
            show(curves, *args, **kwargs)
            draws.append((chart.points_drawn, tab.running))

        chart.show = recording_show  # type: ignore[method-assign]
        await pilot.press("ctrl+r")
        # The search started. On a loaded 2-core box it can also have ended by
        # now: pilot.press waits for the screen's queues, and a search at
        # these sizes takes ~3 s, so "still running" is not asserted here
        # (the draws below say what happened while it ran).
        assert tab.running_capacity and (tab.running or tab.last_capacity is not None), \
            shown(screen, "#pf-cap-result")
        await wait_for(pilot, lambda: not tab.running, 300, "the search to end")
        r = tab.last_capacity
        result = shown(screen, "#pf-cap-result")
        assert r is not None and r.levels, result
        print("\n" + result)
        n = len(r.levels)
        # The loose SLO holds at every level up to the cap: 1, 2, 4, then the cap stops it,
        # and 4 is measured once more, longer: the confirmation, whose figures are reported.
        # (a stalled box's search measures a level again: search_looks.py)
        assert_search_path(r.levels, [(1, True), (2, True), (4, True), (4, True)])
        assert r.stop_reason == "max_concurrency", result
        assert tab.level_starts == [lv.concurrency for lv in r.levels] and r.capacity["confirmed"]
        assert r.capacity is not None and r.capacity["concurrency"] == 4
        # 0 points (the reset), then one more as each level finished, all before the end.
        while_running = [pts for pts, running in draws if running]
        assert sorted(set(while_running)) == list(range(n + 1)) and while_running == sorted(while_running), draws
        assert draws[-1] == (n, False) and chart.points_drawn == n
        assert screen.query_one("#pf-cap-levels", DataTable).row_count == n
        # 4 is the form's ceiling and it passed: a lower bound
        assert f"capacity: concurrency ≥ {r.capacity['concurrency']}" in result
        assert "stopped: max_concurrency" in result and LOOSE_SLO in result
        # The figures agree with the run and with vLLM's own counters.
        for lv in r.levels:
            assert lv.requests > 0 and lv.ok == lv.requests and lv.failed == 0, lv
            assert lv.attainment is not None and 0.0 <= lv.attainment <= 1.0 and lv.passed
            # The windows' rate is their requests' tokens over their span; the level's
            # rates are the streams' (no request failed: see LevelResult.stream_output_tps).
            assert lv.window_output_tps is not None
            assert lv.window_output_tps * lv.seconds == pytest.approx(lv.ok * MAX_TOKENS)
            assert lv.output_tps == pytest.approx(lv.stream_output_tps)
            v = lv.vllm
            assert v is not None, "the level read no /metrics window"
            # vLLM counted every answer we counted, and (ignore_eos) 8 tokens each. Its
            # window is the whole level: it also holds the warm-up (not counted), the
            # requests of the window cut when the level stopped (dropped) and the
            # warm-up batch of one per slot; never fewer than ours, never more than all.
            sent = lv.ok + lv.warmup_requests + lv.dropped + lv.concurrency
            assert lv.ok <= v["requests_finished"] <= sent, (lv.concurrency, v)
            assert lv.ok * MAX_TOKENS <= v["generation_tokens"] <= sent * MAX_TOKENS, (lv.concurrency, v)
            # Sampled while the level ran: a sample lost to a slow answer is only a sample.
            assert lv.kv_cache_peak_pct is None or 0.0 <= lv.kv_cache_peak_pct <= 100.0
        assert any(lv.kv_cache_peak_pct is not None for lv in r.levels)
        assert r.capacity["goodput_output_tps"] == pytest.approx(r.levels[-1].goodput_output_tps)
        assert f"saved as run record {tab.last_record}" in result
        assert load_run(tab.last_record).results["capacity"]["concurrency"] == 4


@pytest.mark.vllm
@pytest.mark.timeout(660)
async def test_the_demos_default_search_finds_a_capacity_on_real_vllm(cpu_server):
    """Issue #18 item 3: the Burst tab's search with every default (the
    demo's server, the form's SLO and prompt shape) answered "capacity:
    none": our TTFT p50 at concurrency 1 was ~400 ms where vLLM's own was
    ~37 ms, vLLM's API server streaming each answer in one piece at the end.
    It ran in its own session, so its own CPU autogroup, where its engine's
    busy core left it a sliver of the other (engine_ctl/control/server.py).
    In the dashboard's session the two agree and the search finds a level
    that meets the SLO. While a level runs, its progress is on screen.

    Every default but two, neither of them what #18 was about. The level
    cap is 20 s, not 60: under the default SLO this box's levels near the
    knee run to the cap undecided, and with 60 s caps the search took 302 s
    alone and over 420 s in a full CI run (2 cores shared with vLLM's
    engine). The highest concurrency is 4: on a quiet box the default
    search climbed to 16 and bisected down to 10 (18 levels, 238 s, of the
    serial real-vLLM group that is CI's critical path); in a CI run it
    answered 5. At 4 it answers "≥ 4", or a lower capacity where a busy box
    misses the SLO there."""
    url = cpu_server.status.url
    app = Host(ProbeScreen(url))
    async with app.run_test(size=(140, 44)) as pilot:
        # the SLO and the prompt shape: the form's defaults
        screen, tab = await _capacity_form(pilot, app, **{"pf-cap-time": "20", "pf-cap-maxc": "4"})
        progress = screen.query_one("#pf-cap-progress")
        seen: list[str] = []

        def watch() -> bool:
            if progress.display:
                seen.append(shown(screen, "#pf-cap-progress"))
            return not tab.running

        await pilot.press("ctrl+r")
        await wait_for(pilot, watch, 540, "the default search to end")
        r = tab.last_capacity
        result = shown(screen, "#pf-cap-result")
        print("\n" + result)
        for lv in r.levels:
            v = lv.vllm or {}
            print(f"  c{lv.concurrency}: TTFT p50/p99 ours {lv.ttft_p50_ms:.0f}/{lv.ttft_p99_ms:.0f} ms, "
                  f"vLLM's {v.get('ttft_p50_ms') or float('nan'):.0f}/{v.get('ttft_p99_ms') or float('nan'):.0f} ms, "
                  f"{lv.seconds:.0f} s, {lv.requests} counted, our loop stood still up to "
                  f"{lv.client_lag_max_ms or 0:.0f} ms, {'confirmation, ' if lv.confirmation else ''}"
                  f"{'decided' if lv.decided else 'undecided'}, {'pass' if lv.passed else 'fail'}")
        assert r is not None, result
        first = r.levels[0]
        # Issue #18's fault: the first level failed on our own slowness (TTFT p50
        # ~400 ms against vLLM's ~37 ms). Now no look at concurrency 1 fails its
        # TTFT objective, the last one passes, and our TTFT agrees with vLLM's
        # histogram. (On a box whose other workers keep both cores busy the first
        # level can end at its 20 s cap with 9 answers, too few to judge, as in
        # one CI run; the search then measures concurrency 1 again.)
        assert first.concurrency == 1, result
        at_one = [lv for lv in r.levels if lv.concurrency == 1]
        ttft_verdicts = [o["verdict"] for lv in at_one for o in lv.objectives if o["metric"] == "ttft"]
        assert ttft_verdicts and S.FAIL not in ttft_verdicts, (ttft_verdicts, result)
        # On a CI box with one core held busy by another job the last look at
        # concurrency 1 once counted 8 answers in its 20 s, under the 10 a
        # verdict needs: the search must then say it could not judge, not
        # that the server misses its SLO there.
        too_few = at_one[-1].verdict == S.TOO_FEW
        assert at_one[-1].passed or too_few or "those token gaps were ours" in result, result
        theirs = (first.vllm or {}).get("ttft_p50_ms")
        assert theirs is not None and first.ttft_p50_ms <= 2 * theirs + 50, (first.ttft_p50_ms, theirs)
        if too_few:
            assert r.stop_reason == "first_level_too_few" and "capacity: not judged" in result, result
        elif r.capacity is None:
            # On a CI box whose other workers keep both cores busy, a later look at
            # concurrency 1 or 2 can miss itl_p99=50ms by a few ms of this client's
            # own event-loop lag (one run read 50-54 ms where vLLM's histogram read
            # at most 49). The answer must then say the gaps were ours, not the server's.
            assert "those token gaps were ours" in result, result
        else:
            assert "capacity: concurrency " in result
        # Progress inside a level was drawn: measuring, with counts and provisional figures.
        assert any(" · measuring · " in s and "counted of" in s and "TTFT p99" in s for s in seen), seen[-3:]


async def _nothing_left_running(pilot, url: str) -> None:
    """vLLM runs no request any more, and its token counter stands still."""
    deadline = time.monotonic() + 60
    while (running := _running_requests(url)) and time.monotonic() < deadline:
        await pilot.pause(0.1)
    assert running == 0, f"vLLM still runs {running} request(s) 60 s after the cancel"
    tokens = _scrape(url).total(M.GENERATION_TOKENS)
    await pilot.pause(1.0)
    assert _scrape(url).total(M.GENERATION_TOKENS) == tokens, "vLLM still generates after the cancel"


LONG_ANSWER = 1900  # tokens: a few seconds each on this box, so a request left running would show


@pytest.mark.vllm
@pytest.mark.timeout(600)
async def test_burst_tab_capacity_search_cancels_on_real_vllm(cpu_server):
    url = cpu_server.status.url
    app = Host(ProbeScreen(url))
    async with app.run_test(size=(120, 40)) as pilot:
        # Long answers at 2 in flight and a level that wants 200 requests:
        # the level is still running when the cancel comes.
        screen, tab = await _capacity_form(pilot, app, **{
            "pf-cap-slo": LOOSE_SLO, "pf-b-max": str(LONG_ANSWER), "pf-b-lmin": "10", "pf-b-lmax": "40",
            "pf-cap-start": "2", "pf-cap-maxc": "4", "pf-cap-minr": "200", "pf-cap-maxr": "400",
            "pf-cap-time": "120"})
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: "requests in" in shown(screen, "#pf-note"), 120, "a level under way")
        t0 = time.monotonic()
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not tab.running, 30, "the cancel")
        cancel_s = time.monotonic() - t0
        r = tab.last_capacity
        assert r is not None and r.stop_reason == "cancelled", shown(screen, "#pf-cap-result")
        assert len(r.levels) == 1 and r.levels[0].stop == "cancelled" and r.capacity is None
        assert "stopped: cancelled" in shown(screen, "#pf-cap-result")
        assert not screen.query_one("#pf-b-run").disabled and screen.query_one("#pf-b-cancel").disabled
        # The requests the cancel dropped are aborted in vLLM, not left decoding.
        await _nothing_left_running(pilot, url)
        print(f"\ncancel took {cancel_s:.2f} s; {r.levels[0].ok} answers before it")


@pytest.mark.vllm
@pytest.mark.timeout(600)
async def test_sweep_screen_capacity_mode_on_real_vllm(tmp_path, tiny_model):
    # The sweep launches its own servers: the two CPU demo presets (block 32
    # and 64), each on a free port so no other server on this box is in the
    # way. It cannot share the session's server.
    import json
    import textwrap

    from ernie_tui.engine_ctl.launch.ports import free_port
    from ernie_tui.engine_ctl.load.pareto import front_of_rows
    from ernie_tui.engine_ctl.load.runstore import list_runs
    from ernie_tui.presets import load_presets
    from ernie_tui.tui.screens.sweep import CAPACITY_TABLE_COLUMNS, SweepScreen

    body = ""
    for name, base in (("cpu-b32", "cpu-demo"), ("cpu-b64", "cpu-demo-b64")):
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "{base}"
            model = "{tiny_model}"
            port = {free_port()}
            {EAGER_TOML}
        """)
    path = tmp_path / "presets.toml"
    path.write_text(body)
    book = load_presets([path], include_user=False)
    app = Host(SweepScreen(book, model=str(tiny_model), is_serving=lambda: False))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        screen.query_one("#sw-presets").select("cpu-b32")
        screen.query_one("#sw-presets").select("cpu-b64")
        screen.query_one("#sw-capacity").value = True
        await pilot.pause()
        for wid, value in (("#sw-cap-slo", LOOSE_SLO), ("#sw-max", str(MAX_TOKENS)), ("#sw-lmin", "10"),
                           ("#sw-lmax", "40"), ("#sw-cap-maxc", "2"), ("#sw-cap-minr", "10"),
                           ("#sw-cap-maxr", "40"), ("#sw-cap-time", "20")):
            screen.query_one(wid, Input).value = value
        await pilot.press("ctrl+r")
        assert screen.running, screen.last_error
        chart = screen.query_one("#sw-chart", CapacityChart)
        await wait_for(pilot, lambda: not screen.running, 420, "the sweep to finish")
        notes = shown(screen, "#sw-notes")
        print("\n" + notes)
        assert [r.status for r in screen.runs] == ["ok", "ok"], notes
        # The loose SLO holds up to the cap on both: 1 and 2 measured and 2 confirmed, capacity 2.
        # (A cap of 2, not more: each level is a few seconds of the serial real-vLLM group.)
        assert {r.preset: (r.levels, r.capacity_concurrency) for r in screen.runs} == {
            "cpu-b32": (3, 2.0), "cpu-b64": (3, 2.0)}
        # The curves are the searches' own levels, as their run records hold them,
        # and those are real vLLM's (its /metrics counted every answer).
        records = {r.preset_name: r for r in list_runs(kind="capacity")}
        assert set(records) == {"cpu-b32", "cpu-b64"}, records
        assert {c.name for c in chart.curves} == {"cpu-b32", "cpu-b64"} and chart.points_drawn == 6
        for curve in chart.curves:
            saved = records[curve.name].results["levels"]
            assert [(lv.concurrency, lv.output_tps, lv.ttft_p99_ms) for lv in curve.levels] == [
                (s["concurrency"], s["output_tps"], s["ttft_p99_ms"]) for s in saved]
            for s in saved:
                assert s["ok"] == s["requests"] > 0 and s["output_tps"] > 0 and 0 <= s["attainment"] <= 1
                sent = s["ok"] + s["warmup_requests"] + s["dropped"] + s["concurrency"]  # as above
                assert s["ok"] <= s["vllm"]["requests_finished"] <= sent
                assert s["ok"] * MAX_TOKENS <= s["vllm"]["generation_tokens"] <= sent * MAX_TOKENS
        # The front: the pure function's answer over the measured rows, on the chart and in the table.
        assert screen.front and screen.front == front_of_rows(screen.rows)
        assert {c.name for c in chart.curves if c.front} == screen.front
        assert "Pareto front" in chart.border_subtitle
        table = screen.query_one("#sw-table", DataTable)
        keys = [k for k, _ in CAPACITY_TABLE_COLUMNS]
        for run in screen.runs:
            row = table.get_row(run.preset)
            assert (str(row[keys.index("front")]) == "◆") == (run.preset in screen.front)
            # 2 is the search's ceiling (max C) and it passed: a lower bound, so "≥ 2"
            assert run.capacity_stop == "max_concurrency" and str(row[keys.index("capacity_concurrency")]) == "≥ 2"
        out = tmp_path / "sweep.json"
        screen.query_one("#sw-path", Input).value = str(out)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: out.is_file() and out.stat().st_size > 0, 60, "the saved sweep")
        data = json.loads(out.read_text())
        ranks = {r["preset"]: r["rank"] for r in data["rows"]}
        if screen.paired is None:  # measured one after another: ranked by the searches' goodput
            best = max(screen.runs, key=lambda r: r.goodput_output_tps or 0)
            assert ranks[best.preset] == 1
        else:  # paired: ranked only by a pair beyond noise, which two presets this alike may not give
            better = screen.paired.pairs[0].better
            assert ranks == ({p: None for p in ranks} if better is None
                             else {p: 1 if p == better else 2 for p in ranks}), (ranks, screen.paired.pairs[0].text())
