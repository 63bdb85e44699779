"""Output piped into a reader that stops early ends quietly (issue #44, 2).

`ernie-tui runs show ID --json | head -c 10` printed a BrokenPipeError
traceback with exit status 1; `presets list | head -1` did the same. Now,
as `ls` and `git`: no word on stderr, exit status 141 (128 + SIGPIPE, what
the shell reports for those). Real pipes and a real child process each time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNS = HERE / "fixtures" / "runs"
SWEEP = "20261201T110044-sweep-8cd620"
LOG = HERE / "fixtures" / "vllm-logs" / "cpu-vllm0.32.0" / "ok_block32_len2048.log"

COMMANDS = {
    "presets list": ["presets", "list"],
    "presets show --json": ["presets", "show", "cpu-demo", "--json"],
    "runs list": ["runs", "list", "--runs-dir", str(RUNS)],
    "runs show --json": ["runs", "show", SWEEP, "--json", "--runs-dir", str(RUNS)],
    "parse-log --json": ["parse-log", str(LOG), "--json", "--all-stats"],
    "parse-log": ["parse-log", str(LOG)],
}


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    return subprocess.Popen([sys.executable, "-m", "ernie_tui", *args], stderr=subprocess.PIPE, env=env, **kw)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_reader_that_has_left_ends_the_command_quietly(name):
    # The reader closes its end before the command writes a byte: every
    # write meets a pipe without a reader, with no race on how much fits.
    r, w = os.pipe()
    os.close(r)
    proc = _cli(COMMANDS[name], stdout=w)
    os.close(w)
    _, err = proc.communicate(timeout=120)
    assert err.decode() == "", err.decode()
    assert proc.returncode == 141


def _long_serving_log(tmp_path: Path) -> Path:
    """The real CPU log with a day of serving after it: a stats line every
    10 s, as vLLM writes them, so `--json --all-stats` is ~2 MB, far more
    than a pipe holds (64 KiB): the command is still writing when the
    reader leaves, every time."""
    lines = LOG.read_text().splitlines(keepends=True)
    stats = next(line for line in lines if "Avg prompt throughput" in line)
    path = tmp_path / "llm.log"
    path.write_text("".join(lines) + stats * 8640)
    return path


def test_head_c_10_reads_ten_bytes_and_the_command_ends_quietly(tmp_path):
    # `parse-log llm.log --json --all-stats | head -c 10`
    proc = _cli(["parse-log", str(_long_serving_log(tmp_path)), "--json", "--all-stats"], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert first.startswith(b"{") and len(first) == 10
    assert err == b"", err.decode()


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden(monkeypatch, capsys):
    # Only stdout's reader leaving is quiet; a broken pipe elsewhere (a
    # child's stdin, a socket) is a fault and is raised, not turned into 141.
    from ernie_tui import cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    real = cli.build_parser

    def parser_whose_runs_list_breaks():
        parser = real()
        runs = parser._subparsers._group_actions[0].choices["runs"]  # type: ignore[union-attr]
        runs._subparsers._group_actions[0].choices["list"].set_defaults(run=broken)
        return parser

    monkeypatch.setattr(cli, "build_parser", parser_whose_runs_list_breaks)
    with pytest.raises(BrokenPipeError):
        cli.main(["runs", "list"])
