"""A bug in one of the log parser's handlers is never only counted.

The handler that reads "Resolved architecture" is made to raise (a fault
put in for the test: real logs no longer make any handler raise). The
parser must go on, and say what happened: a log record with the line number
and text, the report's parser_errors / parser_error_count, `parse-log`'s
output (text and JSON), and the dashboard's report panel.
"""

from __future__ import annotations

import json
import logging

import pytest
from textual.app import App
from textual.widgets import Static

from ernie_tui.cli import main as cli_main
from ernie_tui.engine_ctl.logs.logparse import LogParser, parse_file
from ernie_tui.engine_ctl.logs.report import PARSER_ERRORS_KEPT
from ernie_tui.tui.widgets.report_panel import ReportPanel

LOG = "gpu-h200-vllm0.26.0/ok_block16_len4096.log"
ARCH_LINE = 4  # "(APIServer pid=1938) INFO ... Resolved architecture: Ernie4_5ForCausalLM"


@pytest.fixture
def broken_arch(monkeypatch):
    def boom(self, *args):
        raise RuntimeError("boom in the architecture handler")

    monkeypatch.setattr(LogParser, "_k_arch", boom)


def _log_path(fixtures_dir):
    return fixtures_dir / LOG


@pytest.mark.parametrize("how", ["feed", "feed_many", "parse_file"])
def test_a_handler_bug_is_logged_and_reported(broken_arch, fixtures_dir, caplog, how):
    path = _log_path(fixtures_dir)
    parser = LogParser()
    with caplog.at_level(logging.WARNING, logger="ernie_tui.engine_ctl.logs.logparse"):
        if how == "feed":
            for line in path.read_text(errors="replace").split("\n"):
                parser.feed(line)
            report = parser.report
        elif how == "feed_many":
            parser.feed_many(path.read_text(errors="replace").split("\n"))
            report = parser.report
        else:
            report = parse_file(path, parser=parser)
    assert parser.internal_errors == 1
    assert report.parser_error_count == 1
    assert report.parser_errors[0].startswith(f"line {ARCH_LINE}: RuntimeError: boom in the architecture handler | ")
    assert "Resolved architecture: Ernie4_5ForCausalLM" in report.parser_errors[0]
    # the rest of the log is read as before
    assert report.architecture is None and report.ready and report.kv_cache_tokens == 7_421_344
    records = [r for r in caplog.records if "log parser bug" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    assert f"line {ARCH_LINE}:" in message and "Resolved architecture" in message
    assert records[0].exc_info is not None


def test_the_report_keeps_the_first_errors_and_counts_all(monkeypatch):
    monkeypatch.setattr(LogParser, "_k_arch", lambda self, *a: 1 / 0)
    parser = LogParser()
    line = "(APIServer pid=1) INFO 11-30 03:19:48 [model.py:623] Resolved architecture: X\n"
    parser.feed_many([line] * (PARSER_ERRORS_KEPT + 5))
    assert parser.report.parser_error_count == PARSER_ERRORS_KEPT + 5
    assert len(parser.report.parser_errors) == PARSER_ERRORS_KEPT
    assert parser.report.parser_errors[-1].startswith(f"line {PARSER_ERRORS_KEPT}: ZeroDivisionError")


def test_no_parser_error_on_the_fixture_log(fixtures_dir):
    report = parse_file(_log_path(fixtures_dir))
    assert report.parser_error_count == 0 and report.parser_errors == []


def test_parse_log_says_it(broken_arch, fixtures_dir, capsys):
    assert cli_main(["parse-log", str(_log_path(fixtures_dir))]) == 0
    out = capsys.readouterr().out
    assert "PARSER ERROR" in out and "the log parser failed on 1 line" in out
    assert f"line {ARCH_LINE}: RuntimeError" in out
    assert cli_main(["parse-log", "--json", str(_log_path(fixtures_dir))]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["parser_error_count"] == 1 and d["parser_errors"][0].startswith(f"line {ARCH_LINE}:")


def test_parse_log_says_nothing_without_one(fixtures_dir, capsys):
    assert cli_main(["parse-log", str(_log_path(fixtures_dir))]) == 0
    assert "PARSER ERROR" not in capsys.readouterr().out


async def test_the_report_panel_shows_it(broken_arch, fixtures_dir):
    class One(App):
        def compose(self):
            yield ReportPanel(id="report")

    broken = parse_file(_log_path(fixtures_dir))
    app = One()
    async with app.run_test(size=(140, 30)) as pilot:
        panel = app.query_one(ReportPanel)
        panel.set_report(broken)
        await pilot.pause()
        text = str(app.query_one("#report-body", Static).content)
        assert "parser" in text and "the log parser failed on 1 line" in text
