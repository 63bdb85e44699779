"""Traffic profiles: the file, capture from real vLLM /metrics and request
logs (tests/fixtures/traffic, see its README) and from a trace, and the
seeded draws a replay makes. Pure: no server."""

from __future__ import annotations

import json
import random
import re
import stat
from collections import Counter
from pathlib import Path

import pytest

from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load.traffic import (
    LengthDist,
    TrafficError,
    TrafficProfile,
    save_profile,
)
from ernie_tui.engine_ctl.load.traffic_capture import (
    arrivals_from_times,
    build_profile,
    from_log_file,
    from_metrics,
    from_trace,
    parse_request_log,
    read_trace,
)
from ernie_tui.engine_ctl.load.traffic_replay import build_prompts, draw_lengths, prefix_flags, replay_settings
from ernie_tui.engine_ctl.load.traffic_shapes import BUILT_IN, built_in, load_profile

FIX = Path(__file__).parent / "fixtures" / "traffic" / "cpu-vllm0.32.0"
# The two scrapes' times on the box that took them (their files' mtimes).
WINDOW_S = 1796619424.231 - 1796619408.743
# Round 2's max_tokens, from its source's seed (README).
ROUND2_MAX_TOKENS = {16: 6, 64: 16, 128: 10, 256: 8}


def _scrapes() -> tuple[M.MetricsSnapshot, M.MetricsSnapshot]:
    before = M.MetricsSnapshot.parse((FIX / "window_before.metrics").read_text(), timestamp=0.0, mono=0.0)
    after = M.MetricsSnapshot.parse((FIX / "window_after.metrics").read_text(), timestamp=WINDOW_S, mono=WINDOW_S)
    return before, after


def _counter(name: str, labels: str = "") -> float:
    """A counter's window delta read straight off the text, not through the parser."""
    def value(f: str) -> float:
        pat = re.compile(rf"^{re.escape(name)}\{{[^}}]*{labels}[^}}]*\}} (\S+)$", re.M)
        return sum(float(v) for v in pat.findall((FIX / f).read_text()))
    return value("window_after.metrics") - value("window_before.metrics")


# -- the file --------------------------------------------------------------------

def test_a_profile_round_trips_through_its_file_and_keeps_text_private(tmp_path):
    p = built_in("chat")
    path = save_profile(p, tmp_path / "chat.json")
    back = load_profile(path)
    assert back.to_dict() == p.to_dict() and back.digest == p.digest
    d = json.loads(path.read_text())
    assert d["format"] == "ernie-tui-traffic" and d["version"] == 1 and "texts" not in d
    # With prompt text it is private.
    p.texts = ["a secret system prompt"]
    private = save_profile(p, tmp_path / "with-text.json")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert load_profile(private).texts == ["a secret system prompt"]
    # The digest follows the numbers, not the name.
    renamed = load_profile(path)
    renamed.name = "other"
    assert renamed.digest == p.digest
    renamed.arrivals.cv = 2.0
    assert renamed.digest != p.digest


def test_a_bad_profile_is_refused_in_plain_words(tmp_path):
    d = built_in("chat").to_dict()
    d["version"] = 99
    with pytest.raises(TrafficError, match="version 99"):
        TrafficProfile.from_dict(d)
    d = built_in("chat").to_dict()
    d["prompt_tokens"]["quantiles"]["p50"] = 5000  # above p90
    with pytest.raises(TrafficError, match="grow with p"):
        TrafficProfile.from_dict(d)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TrafficError, match="not JSON"):
        load_profile(tmp_path / "x.json")
    with pytest.raises(TrafficError, match="built-in ones: chat"):
        load_profile(tmp_path / "missing.json")


def test_every_built_in_shape_loads_by_name_and_says_where_its_numbers_come_from():
    for name in BUILT_IN:
        p = load_profile(name)
        assert p.name == name and p.source.kind == "built-in"
        assert any("assumption" in n for n in p.notes)
        TrafficProfile.from_dict(p.to_dict())  # valid as a file


# -- capture: /metrics ---------------------------------------------------------------

def test_capture_from_two_real_metrics_scrapes():
    before, after = _scrapes()
    cap = from_metrics(before, after)
    assert cap.requests == 40
    assert cap.arrivals is not None and cap.arrivals.rate_per_s == pytest.approx(40 / WINDOW_S)
    assert not cap.arrivals.cv_measured  # two scrapes cannot see the gaps
    # max_tokens: the source's known draws, bucketed by vLLM's 1-2-5 bounds.
    assert cap.max_tokens is not None and not cap.max_tokens.exact
    assert cap.max_tokens.buckets == [(20.0, 6.0), (100.0, 16.0), (200.0, 10.0), (500.0, 8.0)]
    # Each quantile inside its bucket (the median in 20-100, as the true 64;
    # p90 in 200-500, as the true 256), and the lengths spread inside the
    # buckets so that their mean is the true one (vLLM's exact sum).
    assert 20 < cap.max_tokens.quantile(0.5) <= 100 and 200 < cap.max_tokens.quantile(0.9) <= 500
    truth = [m for m, k in ROUND2_MAX_TOKENS.items() for _ in range(k)]
    assert cap.max_tokens.table_mean == pytest.approx(sum(truth) / len(truth), rel=1e-6)
    assert cap.prompt_tokens.table_mean == pytest.approx(cap.prompt_tokens.mean, rel=1e-6)
    for d in (cap.prompt_tokens, cap.output_tokens):
        assert d is not None and sum(c for _, c in d.buckets or []) == 40
    # Outputs never exceed the max_tokens asked for.
    assert cap.output_tokens.quantile(1.0) <= cap.max_tokens.quantile(1.0)
    stop, length = _counter("vllm:request_success_total", 'finished_reason="stop"'), \
        _counter("vllm:request_success_total", 'finished_reason="length"')
    assert cap.eos_share == pytest.approx(stop / (stop + length))
    hit = _counter("vllm:prefix_cache_hits_total") / _counter("vllm:prefix_cache_queries_total")
    assert 0.3 < hit < 0.9  # 27 of 40 prompts opened with a 200-word system prompt
    assert cap.prefix is not None and cap.prefix.hit_rate == pytest.approx(hit, abs=1e-4)
    # Only share x length can be read off: the hit tokens a request, in whole
    # blocks of 32 (cache_config_info), carried by prompts longer than it.
    assert cap.prefix.assumed and cap.prefix.tokens % 32 == 0
    assert cap.prefix.share * cap.prefix.tokens == pytest.approx(hit * cap.prompt_tokens.mean, abs=1)
    assert cap.prefix.share <= 1 - cap.prompt_tokens.cdf(cap.prefix.tokens + 1) + 1e-9


def test_metrics_scrapes_inside_the_window_give_the_rate_per_interval():
    before, after = _scrapes()
    # The same scrape twice in the middle: no request finished between them.
    mid = M.MetricsSnapshot.parse((FIX / "window_after.metrics").read_text(), timestamp=10.0, mono=10.0)
    mid2 = M.MetricsSnapshot.parse((FIX / "window_after.metrics").read_text(), timestamp=12.0, mono=12.0)
    mid3 = M.MetricsSnapshot.parse((FIX / "window_after.metrics").read_text(), timestamp=14.0, mono=14.0)
    cap = from_metrics(before, after, [mid, mid2, mid3])
    assert cap.arrivals.cv_measured
    assert cap.arrivals.rate_series[0] == pytest.approx(4.0) and cap.arrivals.rate_series[1:] == [0, 0, 0]


def test_the_arrival_process_is_read_from_times():
    rng = random.Random(1)
    t, ts = 0.0, []
    for _ in range(5000):
        t += rng.gammavariate(0.25, 1 / (4 * 0.25))  # 4 req/s, gap CV 2
        ts.append(t)
    a = arrivals_from_times(ts)
    assert a.rate_per_s == pytest.approx(4.0, rel=0.08) and a.cv == pytest.approx(2.0, rel=0.1)
    poisson = []
    t = 0.0
    for _ in range(5000):
        t += rng.expovariate(4.0)
        poisson.append(t)
    assert arrivals_from_times(poisson).cv == pytest.approx(1.0, rel=0.1)
    # Stamped to the second: read from the counts per second, still ~1 for Poisson.
    whole = arrivals_from_times([float(int(x)) for x in poisson], resolution_s=1.0)
    assert whole.cv == pytest.approx(1.0, rel=0.15)
    assert arrivals_from_times([float(int(x)) for x in ts], resolution_s=1.0).cv > 1.3


# -- capture: vLLM's request log ------------------------------------------------------

def test_request_log_lines_at_info_level():
    reqs = parse_request_log((FIX / "requests_info.log").read_text().splitlines(), year=2026)
    assert len(reqs) == 40
    assert Counter(r.max_tokens for r in reqs) == ROUND2_MAX_TOKENS
    assert {r.ignore_eos for r in reqs} == {True, False}
    assert all(r.prompt_tokens is None for r in reqs)
    assert reqs[-1].at - reqs[0].at <= WINDOW_S
    cap = from_log_file(FIX / "requests_info.log")
    assert cap.prompt_tokens is None and cap.max_tokens is not None and cap.max_tokens.exact
    assert cap.max_tokens.quantile(0.5) == 64 and cap.max_tokens.quantile(0.9) == 256
    assert cap.arrivals is not None and cap.arrivals.cv_measured


def test_request_log_lines_at_debug_level_give_exact_prompt_lengths():
    text = (FIX / "requests_debug.log").read_text()
    reqs = parse_request_log(text.splitlines(), year=2026)
    assert len(reqs) == 12 and all(r.prompt_tokens for r in reqs)
    # Each length is its line's token-id list, counted here without the parser.
    counted = {}
    for line in text.splitlines():
        m = re.search(r"Request (\S+) details: .*prompt_token_ids: \[([\d, ]*)\]", line)
        if m:
            counted[m[1]] = len(m[2].split(","))
    assert {r.request_id: r.prompt_tokens for r in reqs} == counted
    # The token ids show the shared prefix: the source's 200-word system
    # prompt (one token a word), in 6 of these 12 (README: round 3's plan).
    cap = from_log_file(FIX / "requests_debug.log")
    assert cap.prefix is not None and not cap.prefix.assumed
    assert cap.prefix.share == 0.5 and 200 <= cap.prefix.tokens <= 201


def test_each_part_comes_from_the_richest_source_that_saw_it():
    before, after = _scrapes()
    metrics = from_metrics(before, after)
    log = from_log_file(FIX / "requests_info.log")
    p = build_profile("night", [metrics, log], url="http://127.0.0.1:8000")
    assert p.source.kind == "merged"
    assert p.source.fields["max_tokens"] == "request-log" and p.max_tokens.exact
    assert p.source.fields["prompt_tokens"] == "metrics"  # the INFO log has no prompt lengths
    assert p.source.fields["arrivals"] == "request-log"  # measured beats assumed
    assert p.source.fields["prefix"] == "metrics"
    # /metrics alone makes a whole profile; the INFO log alone cannot.
    assert build_profile("m", [metrics]).source.kind == "metrics"
    with pytest.raises(TrafficError, match="prompt lengths"):
        build_profile("l", [log])


# -- capture: a trace --------------------------------------------------------------------

def test_trace_capture(tmp_path):
    system = "You are a helpful assistant for the river city library. " * 4
    lines = [
        {"timestamp": 100.0, "body": {"model": "m", "messages": [{"role": "system", "content": system},
                                                                 {"role": "user", "content": "hours?"}],
                                      "max_tokens": 512},
         "usage": {"prompt_tokens": 60, "completion_tokens": 40}, "finish_reason": "stop"},
        {"timestamp": "1970-01-01T00:01:41Z", "messages": [{"role": "system", "content": system},
                                                           {"role": "user", "content": "where?"}],
         "max_tokens": 512, "usage": {"prompt_tokens": 61, "completion_tokens": 512}, "finish_reason": "length"},
        {"timestamp": 104.0, "body": {"prompt": "Summarise this: " + "words " * 50, "max_tokens": 128},
         "usage": {"prompt_tokens": 70, "completion_tokens": 100}, "finish_reason": "stop"},
    ]
    f = tmp_path / "trace.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n# a comment\n")
    cap = from_trace(read_trace(f))
    assert cap.prompt_tokens.exact and cap.prompt_tokens.quantile(0.5) == 61
    assert cap.output_tokens.quantile(1.0) == 512 and cap.eos_share == pytest.approx(2 / 3)
    assert cap.arrivals.rate_per_s == pytest.approx(2 / 4.0)
    assert cap.prefix.share == pytest.approx(2 / 3, abs=1e-3) and cap.prefix.tokens > 0
    p = build_profile("t", [cap], keep_text=False)
    assert p.texts is None
    assert build_profile("t", [from_trace(read_trace(f), keep_text=True)], keep_text=True).texts[0].startswith(system)
    f.write_text('{"body": {"prompt": "no time"}}\n')
    with pytest.raises(TrafficError, match=":1: not a trace line"):
        read_trace(f)


def test_trace_prefix_length_from_the_usages_characters_a_token(tmp_path):
    """Without a tokenizer, the shared prefix is counted at the characters a
    token the trace's usage shows (here 10: one 9-letter word a token), not
    at a fixed 4 (which read this 100-token prefix as 250)."""
    system = " ".join(f"sys{i:05d}x" for i in range(100))
    lines = []
    for i in range(6):
        user = " ".join(f"usr{i:02d}{k:03d}x" for k in range(20 + i))
        prompt = (system + " " + user) if i % 3 else user
        lines.append({"timestamp": float(i), "body": {"prompt": prompt, "max_tokens": 8},
                      "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 8}})
    f = tmp_path / "trace.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    cap = from_trace(read_trace(f))
    assert cap.prefix.share == pytest.approx(4 / 6, abs=1e-3)
    assert 99 <= cap.prefix.tokens <= 101
    assert any("characters a token, the usage's" in n for n in cap.notes)


# -- replay draws -------------------------------------------------------------------------

def test_replay_draws_are_seeded_and_keep_the_profiles_quantiles():
    p = built_in("chat")
    ins, outs = draw_lengths(p, 20000, seed=3)
    assert (ins, outs) == draw_lengths(p, 20000, seed=3)
    assert draw_lengths(p, 50, seed=4) != draw_lengths(p, 50, seed=3)
    for drawn, dist in ((ins, p.prompt_tokens), (outs, p.output_tokens)):
        got = LengthDist.from_values(drawn)
        for q in (0.1, 0.5, 0.9):
            assert got.quantile(q) == pytest.approx(dist.quantile(q), rel=0.03), q
    # A small batch holds them too (one draw in each n-th of the table).
    small = LengthDist.from_values(draw_lengths(p, 100, seed=7)[0])
    for q in (0.1, 0.5, 0.9):
        assert small.quantile(q) == pytest.approx(p.prompt_tokens.quantile(q), rel=0.04), q
    # "eos": max_tokens from its own table (chat: all 512).
    assert set(draw_lengths(p, 100, seed=3, outputs="eos")[1]) == {512}
    qa = built_in("long-doc-qa")
    flags = prefix_flags(qa, draw_lengths(qa, 20000, seed=1)[0], seed=1)
    assert sum(flags) / len(flags) == pytest.approx(0.6, abs=0.02)
    # The prefix goes to prompts longer than it while they are enough.
    chat = built_in("chat")
    chat.prefix.share, chat.prefix.tokens = 0.5, 200  # shorter than 3 in 4 of its prompts
    lengths = draw_lengths(chat, 20000, seed=2)[0]
    flags = prefix_flags(chat, lengths, seed=2)
    assert sum(flags) / len(flags) == pytest.approx(0.5, abs=0.02)
    assert all(n > 201 for n, f in zip(lengths, flags, strict=True) if f)
    s = replay_settings(p)
    assert s["ignore_eos"] is True and s["max_tokens"] == 512 and s["burstiness"] == pytest.approx(1 / 1.5 ** 2)
    assert replay_settings(p, "eos")["ignore_eos"] is False


def test_replayed_prompts_share_the_profiles_prefix(tiny_model):
    from ernie_tui.engine_ctl.load.prompts import LocalTokenizer

    tok = LocalTokenizer(tiny_model)
    p = built_in("long-doc-qa")
    p.prefix.tokens = 40
    lengths = [60, 80, 30, 100, 70, 90, 120, 50]
    built = build_prompts(p, lengths, seed=1, word_seed=5, tokenizer=tok)
    flags = prefix_flags(p, lengths, seed=1)
    assert [b.tokens for b in built] == lengths  # exact, prefix or not
    first = next(b.text for b, f in zip(built, flags, strict=True) if f and len(tok.encode(b.text)) > 41)
    head = tok.encode(first)[:40]
    for b, f, n in zip(built, flags, lengths, strict=True):
        ids = tok.encode(b.text)
        if f and n > 41:
            assert ids[:40] == head
        elif not f:
            assert ids[:40] != head
    assert 0 < sum(flags) < len(flags)
    assert [b.text for b in build_prompts(p, lengths, seed=1, word_seed=5, tokenizer=tok)] == [b.text for b in built]


def test_the_fidelity_bench_tables_each_replica_against_its_source():
    from bench_scripts import load_bench

    bench = load_bench("traffic_fidelity")
    src = {"prompt": {"p10": 20, "p50": 200, "p90": 400}, "output": {"p10": 10, "p50": 40, "p90": 100},
           "rate": 2.0, "prefix_hit_rate": 0.6, "output_tps": 100.0, "ttft_p50_s": 0.020}
    rep = {"prompt": {"p10": 22, "p50": 200, "p90": 300}, "output": {"p10": 10, "p50": 40, "p90": 100},
           "rate": 1.9, "prefix_hit_rate": 0.55, "output_tps": 110.0, "ttft_p50_s": 0.020}
    table = bench.summarise([{"round": 1, "source": src}, {"round": 1, "replica": "metrics", **rep}])
    row = table.splitlines()[-1]
    assert "| 1 | metrics | 22 (+10 %) / 200 (+0 %) / 300 (-25 %) |" in row
    assert "1.900 (-5 %)" in row and "55 % (-5 pts)" in row and "110.0 (+10 %)" in row
