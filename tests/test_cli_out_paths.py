"""An output file whose folder is not there is refused, as `cp` refuses it
(issue #44, 9): `report --out /no/such/dir/r.html` made the folders (0755,
at the root) and said "wrote". Every output option goes through one check
(paths.out_file): report --out/--csv, sweep --out/--report, probe --report,
and the engine's writers behind them (the sweep screen's export too)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ernie_tui import paths
from ernie_tui.cli import main
from ernie_tui.engine_ctl.control import export_sweep
from ernie_tui.engine_ctl.report import ReportError, load_report_data
from ernie_tui.engine_ctl.report.build import write_csv, write_report

RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
LONE = "20261201T110427-capacity-55ef31"


def _refused(argv: list[str], capsys) -> str:
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ernie-tui: error: ") and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("option, name", [("--out", "r.html"), ("--out", "r.png"), ("--csv", "r.csv")])
def test_report_refuses_a_missing_folder_and_makes_none(tmp_path, capsys, option, name):
    missing = tmp_path / "no" / "such"
    argv = ["report", LONE, "--runs-dir", str(RUNS), option, str(missing / name)]
    err = _refused(argv, capsys)
    assert f"{option} {missing / name}: no such directory {missing}" in err
    assert not (tmp_path / "no").exists(), "no folder is made"


def test_report_refuses_a_folder_that_is_a_file(tmp_path, capsys):
    (tmp_path / "plain").write_text("x")
    err = _refused(["report", LONE, "--runs-dir", str(RUNS), "--out", str(tmp_path / "plain" / "r.html")], capsys)
    assert "is not a directory" in err


def test_report_writes_into_a_folder_that_is_there(tmp_path, capsys):
    assert main(["report", LONE, "--runs-dir", str(RUNS), "--csv", str(tmp_path / "r.csv")]) == 0
    assert "wrote" in capsys.readouterr().err and (tmp_path / "r.csv").is_file()


def test_sweep_refuses_before_any_trial(tmp_path, capsys):
    missing = tmp_path / "nope"
    err = _refused(["sweep", "cpu-demo", "--out", str(missing / "s.csv")], capsys)
    assert f"--out {missing / 's.csv'}: no such directory" in err
    err = _refused(["sweep", "cpu-demo", "--out", str(tmp_path / "s.csv"), "--capacity", "--slo", "ttft_p99=1s",
                    "--report", str(missing / "s.html")], capsys)
    assert f"--report {missing / 's.html'}: no such directory" in err
    assert not missing.exists()


def test_probe_capacity_report_refuses_before_the_search(tmp_path, capsys):
    # The URL answers nothing: the refusal must come first, before any request.
    err = _refused(["probe", "--url", "http://127.0.0.1:9", "--capacity", "--slo", "ttft_p99=1s",
                    "--report", str(tmp_path / "nope" / "c.html")], capsys)
    assert "--report" in err and "no such directory" in err


def test_the_engines_writers_refuse_too(tmp_path):
    data = load_report_data([LONE], RUNS)
    for write in (write_report, write_csv):
        with pytest.raises(ReportError, match="no such directory"):
            write(data, tmp_path / "nope" / ("r.html" if write is write_report else "r.csv"))
    with pytest.raises(paths.OutPathError, match="no such directory"):
        export_sweep([], tmp_path / "nope" / "s.md")
    assert not (tmp_path / "nope").exists()


def test_out_file_says_why_in_plain_words(tmp_path):
    assert paths.out_file(tmp_path / "ok.html") == tmp_path / "ok.html"
    assert paths.out_file("relative.html") == Path("relative.html")  # the current folder is there
    with pytest.raises(paths.OutPathError, match="is a directory"):
        paths.out_file(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        import os

        if os.geteuid() != 0:  # root writes anywhere
            with pytest.raises(paths.OutPathError, match="permission denied"):
                paths.out_file(locked / "r.html")
    finally:
        locked.chmod(0o700)
