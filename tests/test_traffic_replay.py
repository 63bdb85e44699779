"""A burst with --traffic against the paced stand-in (tests/paced_server.py):
it sends the lengths the profile's seeded draws give, asks for each output
length with ignore_eos, goes out at the profile's rate, and its run record
names the traffic. The CLI's traffic capture/show too."""

from __future__ import annotations

import json
import urllib.request

import pytest

from ernie_tui.engine_ctl.load.traffic import Arrivals, LengthDist, Prefix, Source, TrafficProfile, save_profile
from ernie_tui.engine_ctl.load.traffic_replay import draw_lengths


def _profile() -> TrafficProfile:
    return TrafficProfile(
        name="tiny-shape",
        prompt_tokens=LengthDist(points=[(0.0, 10), (0.5, 20), (0.9, 35), (1.0, 40)]),
        output_tokens=LengthDist(points=[(0.0, 2), (0.5, 4), (0.9, 10), (1.0, 12)]),
        arrivals=Arrivals(rate_per_s=40.0, cv=2.0),
        prefix=Prefix(share=0.5, tokens=6),
        source=Source(kind="built-in"))


def _requests(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/requests", timeout=10) as r:
        log = json.loads(r.read())
    return [e for e in log if (e["max_tokens"] or 0) > 1]  # not the warm-up's one token


def test_a_burst_with_traffic_sends_the_lengths_drawn(stand_in, tmp_path, capsys):
    from ernie_tui.cli import main

    url = stand_in("--slots", "8", "--ttft-ms", "2", "--itl-ms", "1")
    prof = _profile()
    path = save_profile(prof, tmp_path / "tiny.json")
    rc = main(["probe", "--url", url, "--burst", "16", "--traffic", str(path), "--seed", "5", "--no-save",
               "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    ins, outs = draw_lengths(prof, 16, seed=5)
    sent = _requests(url)[-16:]
    assert sorted(e["prompt_tokens"] for e in sent) == sorted(ins)
    assert sorted(e["max_tokens"] for e in sent) == sorted(outs)
    assert all(e["ignore_eos"] is True for e in sent)
    assert [r["prompt_tokens_target"] for r in d["requests"]] == ins
    assert [r["max_tokens"] for r in d["requests"]] == outs
    # The profile's arrivals: an open loop at its rate, gamma gaps of its CV.
    cfg = d["config"]
    assert cfg["rate"] == 40.0 and cfg["concurrency"] == 0 and cfg["burstiness"] == 0.25
    # The record names the traffic, whole.
    assert TrafficProfile.from_dict(cfg["traffic"]).digest == prof.digest
    # Another seed, other lengths: the ones its draws give.
    main(["probe", "--url", url, "--burst", "16", "--traffic", str(path), "--seed", "6", "--no-save", "--json"])
    capsys.readouterr()
    ins6 = draw_lengths(prof, 16, seed=6)[0]
    assert ins6 != ins
    assert sorted(e["prompt_tokens"] for e in _requests(url)[-16:]) == sorted(ins6)


def test_traffic_show_and_capture_from_a_log_on_the_command_line(tmp_path, capsys):
    from pathlib import Path

    from ernie_tui.cli import main

    assert main(["traffic", "show", "batch-summarise"]) == 0
    out = capsys.readouterr().out
    assert "traffic batch-summarise" in out and "assumption" in out
    log = Path(__file__).parent / "fixtures" / "traffic" / "cpu-vllm0.32.0" / "requests_debug.log"
    target = tmp_path / "night.json"
    assert main(["traffic", "capture", "--log", str(log), "--out", str(target)]) == 0
    p = TrafficProfile.from_json(target.read_text())
    assert p.name == "night" and p.source.kind == "request-log" and p.prompt_tokens.exact
    # An INFO log alone has no prompt lengths: refused in plain words.
    info = log.with_name("requests_info.log")
    assert main(["traffic", "capture", "--log", str(info), "--out", str(tmp_path / "x.json")]) != 0
    assert "prompt lengths" in capsys.readouterr().err


def test_sweep_passes_traffic_through_to_every_presets_load(tmp_path, tiny_model):
    import argparse

    from ernie_tui.cli import cmd_sweep

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cmd_sweep.register(sub)
    args = parser.parse_args(["sweep", "cpu-demo", "--out", str(tmp_path / "s.json"), "--traffic", "chat",
                              "--traffic-outputs", "eos", "--capacity"])
    args.presets, args.model = [], str(tiny_model)
    setup = cmd_sweep._setup(args)
    assert TrafficProfile.from_dict(setup.config.traffic).name == "chat"
    assert setup.config.ignore_eos is False and setup.config.max_tokens == 512
    assert setup.capacity.settings.ignore_eos is False  # the search's requests stop at EOS too


def test_a_capacity_workload_built_from_traffic_names_it_and_draws_from_it(tiny_model):
    from dataclasses import replace

    from ernie_tui.engine_ctl.load.burst import BurstConfig
    from ernie_tui.engine_ctl.load.prompts import LocalTokenizer
    from ernie_tui.engine_ctl.load.traffic_replay import replay_settings
    from ernie_tui.engine_ctl.load.workload import burst_workload

    prof = _profile()
    cfg = replace(BurstConfig(seed=2, word_seed=9), **replay_settings(prof))
    wl = burst_workload(cfg, LocalTokenizer(tiny_model), size=10)
    assert prof.digest in wl.describe()["source"]
    ins, outs = draw_lengths(prof, 10, seed=2)
    assert [i.prompt_tokens for i in wl.items] == ins and [i.max_tokens for i in wl.items] == outs
    wl.ensure(20)  # the next batch: the next seed's draws
    assert [i.max_tokens for i in wl.items[10:]] == draw_lengths(prof, 10, seed=3)[1]


def test_the_sweep_table_names_the_traffic_it_was_measured_on():
    from dataclasses import replace

    from ernie_tui.engine_ctl.control.sweep import sweep_meta
    from ernie_tui.engine_ctl.load.burst import BurstConfig
    from ernie_tui.engine_ctl.load.traffic_replay import replay_settings

    prof = _profile()
    meta = sweep_meta(["a", "b"], 1, replace(BurstConfig(), **replay_settings(prof)), [])
    assert meta["traffic"] == f"tiny-shape ({prof.digest}), outputs lengths"
    assert "traffic" not in sweep_meta(["a"], 1, BurstConfig(), [])


def test_traffic_capture_watches_a_live_server_while_a_load_runs(stand_in, tmp_path, capsys):
    import threading

    from ernie_tui.cli import main
    from ernie_tui.engine_ctl.load.burst import BurstConfig, run_burst

    url = stand_in("--slots", "8", "--ttft-ms", "2", "--itl-ms", "1")
    cfg = BurstConfig(n=30, concurrency=0, rate=20.0, min_tokens=30, max_tokens_in=40, max_tokens=8, warmup=False)
    load = threading.Thread(target=lambda: (time_sleep(1.0), run_burst(url, cfg, use_metrics=False)))
    load.start()
    target = tmp_path / "live.json"
    assert main(["traffic", "capture", "--url", url, "--window", "5s", "--interval", "1", "--out",
                 str(target)]) == 0
    load.join()
    p = TrafficProfile.from_json(target.read_text())
    assert p.source.kind == "metrics" and p.source.requests == 30
    # Prompts of 30-40 tokens fall in the 20-50 bucket; every output is 8 (5-10).
    assert p.prompt_tokens.buckets == [(50.0, 30.0)] and p.output_tokens.buckets == [(10.0, 30.0)]
    assert 20 <= p.prompt_tokens.quantile(0.5) <= 50 and 5 <= p.output_tokens.quantile(0.5) <= 10
    assert p.arrivals.rate_per_s == pytest.approx(30 / p.source.window_s, rel=1e-5) and p.arrivals.cv_measured
    assert p.eos_share is None  # the stand-in counts finished requests without vLLM's finished_reason


def time_sleep(s: float) -> None:
    import time

    time.sleep(s)


def test_traffic_options_are_refused_where_they_do_not_belong(tmp_path, capsys):
    from ernie_tui.cli import main

    assert main(["probe", "--url", "http://127.0.0.1:9", "--traffic", "chat"]) != 0
    assert "--traffic belongs to --burst or --capacity" in capsys.readouterr().err
    assert main(["probe", "--url", "http://127.0.0.1:9", "--burst", "4", "--traffic", str(tmp_path / "no.json")]) != 0
    assert "built-in ones: chat" in capsys.readouterr().err
    assert main(["traffic", "capture", "--out", str(tmp_path / "p.json")]) != 0
    assert "give a source" in capsys.readouterr().err


def test_a_report_names_the_traffic_a_burst_record_was_measured_on():
    from dataclasses import replace

    from ernie_tui.engine_ctl.load import RunRecord
    from ernie_tui.engine_ctl.load.burst import BurstConfig
    from ernie_tui.engine_ctl.load.traffic_replay import replay_settings
    from ernie_tui.engine_ctl.report.inputs import curve_of

    prof = _profile()
    cfg = replace(BurstConfig(), **replay_settings(prof)).to_dict()
    rec = RunRecord.from_dict({"id": "r1", "kind": "burst", "timestamp": "2026-12-07T05:00:00",
                               "results": {"config": cfg, "requests": []}})
    assert curve_of(rec).info["traffic"] == prof.label()


def test_traffic_capture_since_the_server_started_reads_all_it_served(stand_in, tmp_path, capsys):
    """--since-start: one scrape, everything the server served since its start
    (its counters' _created samples say when), no window watched."""
    import httpx

    from ernie_tui.cli import main

    url = stand_in("--slots", "4", "--ttft-ms", "2", "--itl-ms", "1")
    with httpx.Client(timeout=30) as client:
        for n in (3, 30, 30, 300):
            r = client.post(f"{url}/v1/completions", json={"model": "paced", "prompt": " ".join(["hi"] * n),
                                                            "max_tokens": 8})
            assert r.status_code == 200, r.text
    target = tmp_path / "all.json"
    assert main(["traffic", "capture", "--url", url, "--since-start", "--out", str(target)]) == 0, \
        capsys.readouterr().err
    p = TrafficProfile.from_json(target.read_text())
    assert p.source.requests == 4 and p.prompt_tokens.buckets == [(5.0, 1.0), (50.0, 2.0), (500.0, 1.0)]
    assert any("since it started" in n for n in p.notes) and p.source.window_s > 0
    assert main(["traffic", "capture", "--since-start", "--out", str(target)]) != 0
    assert "--since-start reads a server's /metrics: give --url" in capsys.readouterr().err
