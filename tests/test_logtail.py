"""LogTailer: follow llm.log through everything a live vLLM log does to it."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from ernie_tui.engine_ctl.logs.logparse import LogParser, parse_file
from ernie_tui.engine_ctl.logs.logtail import CUT_MARKER, LogTailer, strip_ansi


def append(path, data: bytes | str) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


@pytest.fixture
def log(tmp_path):
    return tmp_path / "llm.log"


def test_missing_file_then_created(log):
    t = LogTailer(log)
    assert t.read_new() == []
    assert t.read_new() == []
    append(log, "one\ntwo\n")
    assert t.read_new() == ["one", "two"]
    assert t.read_new() == []
    t.close()


def test_from_start_reads_existing_content(log):
    append(log, "a\nb\n")
    with LogTailer(log, from_start=True) as t:
        assert t.read_new() == ["a", "b"]
        append(log, "c\n")
        assert t.read_new() == ["c"]


def test_from_end_skips_existing_content(log):
    append(log, "old 1\nold 2\n")
    t = LogTailer(log, from_start=False)
    assert t.read_new() == []
    append(log, "new\n")
    assert t.read_new() == ["new"]


def test_from_end_mid_line_drops_the_fragment(log):
    append(log, "old\nhalf a li")
    t = LogTailer(log, from_start=False)
    append(log, "ne\nwhole\n")
    assert t.read_new() == ["whole"]


def test_from_end_on_missing_file_reads_all_of_it_later(log):
    t = LogTailer(log, from_start=False)
    assert t.read_new() == []
    append(log, "first\n")
    assert t.read_new() == ["first"]


def test_partial_line_is_held_until_newline(log):
    t = LogTailer(log)
    append(log, "(APIServer pid=1) INFO Start")
    assert t.read_new() == []
    assert t.partial == "(APIServer pid=1) INFO Start"
    append(log, "ing vLLM server")
    assert t.read_new() == []
    append(log, " on http://x\nnext")
    assert t.read_new() == ["(APIServer pid=1) INFO Starting vLLM server on http://x"]
    assert t.partial == "next"


def test_carriage_return_progress_bars(log):
    """A redrawn line is one line, showing what a terminal shows at its end;
    while it is drawn, `partial` is the live bar."""
    t = LogTailer(log)
    append(log, "before\n(EngineCore pid=2) \rCapturing:  10%|#|\rCapturing:  50%|##|\r")
    assert t.read_new() == ["before"]
    assert t.partial == "Capturing:  50%|##|"  # the bar as drawn right now
    append(log, "Captur")
    assert t.read_new() == [] and t.partial == "Captur"
    append(log, "ing: 100%|###|\n")
    assert t.read_new() == ["Capturing: 100%|###|"]
    append(log, "bar  99%\rbar 100%\r\nafter\n")  # tqdm's close: the last redraw, then \r\n
    assert t.read_new() == ["bar 100%", "after"]


def test_crlf_counts_once_even_split_across_reads(log):
    t = LogTailer(log)
    append(log, "a\r\nb\r")
    assert t.read_new() == ["a"]  # "b" may still be redrawn
    append(log, "\nc\r\n\r\n")
    assert t.read_new() == ["b", "c", ""]  # the second CRLF is a real empty line


def test_blank_line_after_split_crlf_is_kept(log):
    t = LogTailer(log)
    append(log, "bar\r")
    assert t.read_new() == []
    append(log, "\n\nnext\n")
    assert t.read_new() == ["bar", "", "next"]


def test_lone_cr_segments_that_draw_nothing_are_dropped(log):
    t = LogTailer(log)
    append(log, "\r\rx\r\r\ny\n\n")
    assert t.read_new() == ["x", "y", ""]


def test_line_numbers_are_the_files(fixtures_dir, log):
    """One tailed line per line of the file, for every captured log (the GPU
    ones redraw CUDA-graph bars with \\r): the dashboard's line numbers, the
    parser's and `less -N`'s agree, and a tailed parse puts the error on the
    same line as parse_file."""
    for src in sorted(fixtures_dir.glob("*/*.log")):
        data = src.read_bytes()
        log.write_bytes(b"")
        t = LogTailer(log)
        parser = LogParser()
        got: list[str] = []
        for i in range(0, len(data), 4093):  # written in odd-sized pieces
            append(log, data[i:i + 4093])
            got += t.read_new()
        for line in got:
            parser.feed(line)
        assert len(got) == data.count(b"\n"), src.name
        whole = parse_file(src)
        if whole.error is not None:
            assert parser.report.error.line_no == whole.error.line_no, src.name
        t.close()


def test_ansi_codes_are_stripped(log):
    t = LogTailer(log)
    append(log, "\x1b[32mINFO\x1b[0m 11-30 \x1b[1mvLLM\x1b[0m ok\x1b]0;title\x07 done\x1b[2K\n")
    assert t.read_new() == ["INFO 11-30 vLLM ok done"]
    assert strip_ansi("plain") == "plain"


def test_invalid_utf8_is_replaced(log):
    t = LogTailer(log)
    append(log, b"bad \xff\xfe bytes \xe2\x96\x88 ok\n\xc3")
    assert t.read_new() == ["bad \ufffd\ufffd bytes \u2588 ok"]
    append(log, b"\xa9 fine\n")  # a multi-byte char split across two reads
    assert t.read_new() == ["\u00e9 fine"]


def test_truncation_restarts_from_the_beginning(log):
    t = LogTailer(log)
    append(log, "line 1\nline 2\nline 3\n")
    assert len(t.read_new()) == 3
    with open(log, "wb") as f:  # `> llm.log`, or copytruncate
        f.write(b"fresh\n")
    assert t.read_new() == ["fresh"]
    assert t.truncations == 1
    append(log, "more\n")
    assert t.read_new() == ["more"]


def test_rotation_drains_old_file_then_follows_new_one(log):
    t = LogTailer(log)
    append(log, "run1 a\n")
    assert t.read_new() == ["run1 a"]
    append(log, "run1 b\nrun1 last, no newline")  # written but not read before the rotation
    os.rename(log, log.with_name("llm.log.1"))
    append(log, "run2 a\n")
    assert t.read_new() == ["run1 b", "run1 last, no newline", "run2 a"]
    assert t.rotations == 1
    append(log, "run2 b\n")
    assert t.read_new() == ["run2 b"]


def test_renamed_but_not_recreated_keeps_reading_old_file(log):
    t = LogTailer(log)
    append(log, "a\n")
    assert t.read_new() == ["a"]
    old = log.with_name("llm.log.1")
    os.rename(log, old)
    append(old, "still writing to the old fd\n")
    assert t.read_new() == ["still writing to the old fd"]
    append(log, "new file\n")
    assert t.read_new() == ["new file"]


def test_deleted_and_recreated(log):
    t = LogTailer(log)
    append(log, "a\n")
    assert t.read_new() == ["a"]
    log.unlink()
    assert t.read_new() == []
    append(log, "b\n")
    assert t.read_new() == ["b"]


def test_huge_line_is_capped_with_bounded_memory(log):
    big = b"{" + b"'k': 1, " * (10 * 1024 * 1024 // 8) + b"}"  # ~10 MB, one line
    with open(log, "wb") as f:
        f.write(b"before\n" + big + b"\nafter\n")
    t = LogTailer(log, max_line=65536)
    tracemalloc.start()
    try:
        lines = []
        for _ in range(10):
            lines += t.read_new()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines[0] == "before" and lines[-1] == "after" and len(lines) == 3
    assert lines[1].endswith(CUT_MARKER)
    assert len(lines[1]) == 65536 + len(CUT_MARKER)
    assert t.lines_cut == 1
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes while tailing a 10 MB line"


def test_huge_line_written_in_pieces(log):
    t = LogTailer(log, max_line=1000)
    for _ in range(50):
        append(log, "x" * 500)
        assert t.read_new() == []
    append(log, "tail\nok\n")
    lines = t.read_new()
    assert lines == ["x" * 1000 + CUT_MARKER, "ok"]


def test_max_read_delivers_a_backlog_in_slices(log):
    append(log, "".join(f"line {i:06d}\n" for i in range(100_000)))  # 1.2 MB
    t = LogTailer(log, max_read=1 << 16)
    first = t.read_new()
    assert 0 < len(first) < 100_000
    got = list(first)
    for _ in range(100):
        more = t.read_new()
        if not more:
            break
        got += more
    assert got == [f"line {i:06d}" for i in range(100_000)]


def test_close_stops_reading(log):
    t = LogTailer(log)
    append(log, "a\n")
    t.close()
    assert t.read_new() == []


def test_tailed_fixture_parses_like_the_file(fixtures_dir, log):
    """Lines produced by the tailer (\\r redraws resolved) give the same report values."""
    src = fixtures_dir / "gpu-h200-vllm0.26.0" / "ok_block16_len4096.log"
    data = src.read_bytes()
    t = LogTailer(log)
    parser = LogParser()
    for i in range(0, len(data), 4093):  # the server writes in odd-sized pieces
        append(log, data[i:i + 4093])
        for line in t.read_new():
            parser.feed(line)
    live, whole = parser.report, parse_file(src)
    for field in ("vllm_version", "platform", "kv_cache_tokens", "kv_cache_gib", "max_concurrency",
                  "cuda_graph_seconds", "cuda_graph_gib", "compile_seconds", "init_engine_seconds",
                  "server_url", "ready", "phase", "phases", "pids", "attention_backend", "block_size"):
        assert getattr(live, field) == getattr(whole, field), field
    assert live.stats[-1].prompt_tps == whole.stats[-1].prompt_tps
    assert parser.internal_errors == 0
