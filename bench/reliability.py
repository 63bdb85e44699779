"""Fault and fuzz runs: what was once run by hand, rerunnable, one subcommand per row.

    .venv/bin/python bench/reliability.py cycles --server stand-in --n 50
    .venv/bin/python bench/reliability.py cycles --server vllm --n 5
    .venv/bin/python bench/reliability.py parser-fuzz
    .venv/bin/python bench/reliability.py tailer
    .venv/bin/python bench/reliability.py presets
    .venv/bin/python bench/reliability.py metrics
    .venv/bin/python bench/reliability.py probe
    .venv/bin/python bench/reliability.py hangup
    .venv/bin/python bench/reliability.py all          (every row but `cycles --server vllm`)

Each row prints one line: PASS or FAIL, its figures (counts, seconds, peak
RSS growth), then the problems it found, one per line; it exits 1 on a
failure. Seeds are fixed (--seed), so a failure reruns the same way.
tests/test_reliability.py runs every row at a small size; the full sizes
and their figures are in docs/lab/reliability.md.

What each row checks:

  cycles       random start / stop / restart / kill -9 cycles of EngineServer on
               the stand-in server (tests/tui_fake_vllm.py) or real vLLM CPU: no
               process left in any server's process group or carrying this run's
               marker variable, no start while the old server still listens on
               the port (checked before each start and as each launch begins),
               no descriptor of ours left open (/proc/self/fd).
  parser-fuzz  parse_file and the live path (LogTailer -> LogParser.feed) on junk:
               1 M junk lines made from mangled real log lines, one 10 MB line,
               50 MB of random bytes, invalid UTF-8, absurd numbers in real lines.
               0 exceptions (raised or swallowed: LogParser.internal_errors), peak
               RSS growth under 50 MB, every line counted, strict JSON.
  tailer       a writer that truncates, rotates and deletes its log, pausing at
               each event: every line comes out of LogTailer exactly once, in order
               (a deterministic interleaving, then a writer process in real time).
  presets      hand-written malformed preset files and random mutations of the
               built-in file through the CLI: exit 1, one line naming FILE:LINE,
               no traceback (in-process and as `ernie-tui` processes).
  metrics      MetricsClient against /metrics that is down, sends garbage, hangs
               or drips: a MetricsError (never another exception) in bounded time.
  probe        run_probe against servers that hang, drop mid-stream or send
               malformed SSE: a clear error, no exception, bounded time.
  hangup       the real app in tmux on the stand-in server, the tmux server killed
               (the pane gets SIGHUP) with each --on-exit: ask and stop leave no
               engine process; leave keeps the server running with server.json
               written (the bench stops it afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

import psutil  # noqa: E402

FAKE_VLLM = ROOT / "tests" / "tui_fake_vllm.py"
CPU_FIXTURES = ROOT / "tests" / "fixtures" / "vllm-logs" / "cpu-vllm0.32.0"
LOG_FIXTURES = ROOT / "tests" / "fixtures" / "vllm-logs"
# Every process a row starts carries this variable (value: one id per run), so
# a leftover is found by its environment even after it left its process group.
MARKER = "ERNIE_RELIABILITY_RUN"
MB = 1 << 20


# ---------------------------------------------------------------------------
# Verdicts and measuring helpers

@dataclass
class Verdict:
    row: str
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, text: str) -> None:
        self.problems.append(text)

    def line(self) -> str:
        figs = "  ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        return f"{'PASS' if self.ok else 'FAIL'} {self.row}: {figs}"

    def report(self) -> str:
        return "\n".join([self.line(), *(f"  - {p}" for p in self.problems[:20]),
                          *([f"  - ... {len(self.problems) - 20} more"] if len(self.problems) > 20 else [])])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms by a
    thread (ru_maxrss is a whole-process high-water mark that never comes
    down, so it cannot tell one case from the next)."""

    def __init__(self) -> None:
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRSS:
        self.base = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / MB


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def free_port() -> int:
    from ernie_tui.engine_ctl.launch import free_port as _free

    return _free()


def port_listening(port: int, host: str = "127.0.0.1") -> bool:
    from ernie_tui.engine_ctl.launch import port_is_free

    return not port_is_free(host, port)[0]


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes whose environment carries this run's marker."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER) == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def end_processes(procs: list[psutil.Process]) -> None:
    """Kill what a row left behind (only processes it started)."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def stand_in_preset(port: int, marker: str, model_dir: str, delay: float = 0.05, name: str = "stand-in"):
    from ernie_tui.presets.model import Preset

    return Preset(name=name, launcher=[sys.executable, str(FAKE_VLLM)], model=model_dir, port=port,
                  engine_args={"block_size": 32},
                  env={"ERNIE_FAKE_FIXTURES": str(CPU_FIXTURES), "ERNIE_FAKE_DELAY": str(delay), MARKER: marker})


# ---------------------------------------------------------------------------
# cycles

def row_cycles(server_kind: str = "stand-in", n: int = 50, seed: int = 1, workdir: Path | None = None,
               model_dir: str | None = None) -> Verdict:
    """n cycles of start, a random wait (mid-startup or once ready), then one of
    stop / restart (then stop) / kill -9 of the launcher (then, half the time,
    stop; else the next start follows the crash directly)."""
    from ernie_tui.engine_ctl.control import EngineServer, ServerState, StatusChanged, group_members

    rng = random.Random(seed)
    v = Verdict(f"cycles[{server_kind}]")
    marker = f"cycles-{uuid.uuid4().hex[:12]}"
    own_workdir = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="ernie-rel-cycles-"))
    port = free_port()
    if server_kind == "stand-in":
        spec = stand_in_preset(port, marker, str(workdir)).launch_spec()
        ready_timeout, settle = 30.0, (0.0, 1.0)
    elif server_kind == "vllm":
        from ernie_tui.presets import load_presets

        model_dir = model_dir or _tiny_model()
        preset = load_presets(include_user=False).get("cpu-demo")
        preset = _with_env(preset, {MARKER: marker})
        spec = preset.launch_spec(model_dir, port_override=port)
        ready_timeout, settle = 600.0, (0.0, 20.0)
    else:
        raise SystemExit(f"unknown server kind {server_kind!r}")

    fd_before = open_fds()
    server = EngineServer(spec, preset_name=server_kind, log_path=workdir / "logs" / "llm.log")
    launches: list[int] = []  # pids (= process group ids) of every launch
    held_at_launch = 0  # launches that began while the port still answered
    old_alive_at_launch = 0  # launches that began while an earlier server's group still lived

    def on_event(ev: object) -> None:
        nonlocal held_at_launch, old_alive_at_launch
        if isinstance(ev, StatusChanged) and ev.status.state == ServerState.STARTING \
                and ev.status.phase == "launching" and ev.status.pid not in launches:
            # Called from start() right after the launch: the new process is
            # still importing Python, so whatever listens is the old server.
            if port_listening(port):
                held_at_launch += 1
            if any(group_members(pg) for pg in launches):
                old_alive_at_launch += 1
            launches.append(ev.status.pid)

    server.add_listener(on_event)
    ops = {"stop": 0, "restart": 0, "kill9": 0, "kill9-then-start": 0}
    held_before_start = 0
    orphans = 0
    bad_states = 0
    fd_peak = fd_before
    t0 = time.monotonic()
    try:
        for cycle in range(n):
            if port_listening(port):
                held_before_start += 1
                v.fail(f"cycle {cycle}: port {port} still answers before start")
            server.start()
            _settle(server, rng, ready_timeout, settle)
            op = rng.choice(["stop", "restart", "kill9"])
            if op == "stop":
                server.stop()
            elif op == "restart":
                server.restart()
                _settle(server, rng, ready_timeout, settle)
                server.stop()
            elif op == "kill9":
                pid = server.status.pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + 15
                while server.status.state != ServerState.CRASHED and time.monotonic() < deadline:
                    time.sleep(0.02)
                if server.status.state != ServerState.CRASHED:
                    v.fail(f"cycle {cycle}: kill -9 not seen as a crash ({server.status.state.value})")
                if rng.random() < 0.5:
                    server.stop()
                else:
                    op = "kill9-then-start"
                    _wait_reaped(server, 10)
            ops[op] += 1
            state = server.status.state
            if state not in (ServerState.STOPPED, ServerState.CRASHED):
                bad_states += 1
                v.fail(f"cycle {cycle}: after {op} the server is {state.value}")
            left = {p.pid for pg in launches for p in group_members(pg)} | {p.pid for p in marked_processes(marker)}
            if left:
                orphans += len(left)
                v.fail(f"cycle {cycle}: after {op}, processes left: {sorted(left)}")
                end_processes([psutil.Process(p) for p in left if psutil.pid_exists(p)])
            fd_peak = max(fd_peak, open_fds())
    finally:
        try:
            server.stop()
        finally:
            server.close()
    leftovers = marked_processes(marker)
    if leftovers:
        orphans += len(leftovers)
        v.fail(f"at the end, processes left: {[p.pid for p in leftovers]}")
        end_processes(leftovers)
    fd_leak = open_fds() - fd_before
    if own_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    if fd_leak > 0:
        v.fail(f"{fd_leak} descriptors more than before the first start: {_fd_targets()}")
    if held_at_launch:
        v.fail(f"{held_at_launch} launches began while the port still answered")
    if old_alive_at_launch:
        v.fail(f"{old_alive_at_launch} launches began while an earlier server's process group lived")
    v.figures.update(cycles=n, launches=len(launches), **{k.replace("-", "_"): c for k, c in ops.items()},
                     orphans=orphans, port_held_starts=held_before_start + held_at_launch,
                     old_group_alive_at_launch=old_alive_at_launch, leaked_fds=max(0, fd_leak),
                     fd_peak_growth=fd_peak - fd_before, bad_states=bad_states,
                     seconds=time.monotonic() - t0)
    return v


def _settle(server, rng: random.Random, ready_timeout: float, settle: tuple[float, float]) -> None:
    """Half the time act mid-startup, half the time once ready."""
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0.0, 0.5))
    else:
        server.wait_ready(ready_timeout)
        time.sleep(rng.uniform(*settle))


def _wait_reaped(server, timeout: float) -> None:
    """After a crash the monitor ends the leftovers; let it finish before the
    next start (start() refuses nothing after a crash, and must not need to)."""
    from ernie_tui.engine_ctl.control import group_members

    pid = server.status.pid
    deadline = time.monotonic() + timeout
    while pid and group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
    return out


def _tiny_model() -> str:
    from ernie_tui.demo_model import shared_tiny_model

    return str(shared_tiny_model())


def _with_env(preset, env: dict[str, str]):
    from dataclasses import replace

    return replace(preset, env={**preset.env, **env})


# ---------------------------------------------------------------------------
# parser-fuzz

ABSURD = ["1e309", "-1e309", "1" + "0" * 26, "9" * 400, "-1", "0", "-0", "nan", "inf", "-inf", "1e-400",
          "0x7fffffffffffffff", "18446744073709551617", "1_000", "3.4.5", "１２３", "∞", "NaN", "1e",
          "00000000000000000007", "-99999999999999999999.5"]


def _fixture_lines() -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(LOG_FIXTURES.rglob("*.log")):
        lines.extend(path.read_bytes().split(b"\n"))
    return [ln for ln in lines if ln.strip()]


def _mangle(rng: random.Random, line: bytes) -> bytes:
    """A real log line, damaged one of several ways."""
    k = rng.randrange(8)
    if k == 0:  # cut anywhere
        return line[: rng.randrange(len(line) + 1)]
    if k == 1:  # a window of random bytes spliced in (no newlines: one line stays one line)
        i = rng.randrange(len(line) + 1)
        junk = bytes(b for b in rng.randbytes(rng.randrange(1, 40)) if b != 0x0A)
        return line[:i] + junk + line[i:]
    if k == 2:  # words shuffled
        words = line.split(b" ")
        rng.shuffle(words)
        return b" ".join(words)
    if k == 3:  # every number absurd
        import re

        return re.sub(rb"\d+(?:\.\d+)?", lambda m: rng.choice(ABSURD).encode(), line)
    if k == 4:  # two lines glued
        return line + b" " + line[::-1]
    if k == 5:  # brackets and quotes unbalanced (args dicts, tracebacks)
        return line.replace(b"}", b"").replace(b"'", b"\"", 1) + rng.choice([b"{", b"[", b"('", b"\\"])
    if k == 6:  # invalid UTF-8 and control characters
        i = rng.randrange(len(line) + 1)
        return line[:i] + rng.choice([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\x00\x1b[31m", b"\r"]) + line[i:]
    return bytes(rng.randrange(32, 127) for _ in range(rng.randrange(0, 200)))  # printable noise


def _write_lines(path: Path, lines) -> None:
    with open(path, "wb") as f:
        buf: list[bytes] = []
        for ln in lines:
            buf.append(ln)
            if len(buf) >= 10000:
                f.write(b"\n".join(buf) + b"\n")
                buf = []
        if buf:
            f.write(b"\n".join(buf) + b"\n")


def make_fuzz_inputs(folder: Path, seed: int, junk_lines: int, long_line: int, random_bytes: int) -> dict[str, Path]:
    """The fuzz corpus, written in slices so making it does not inflate memory."""
    rng = random.Random(seed)
    real = _fixture_lines()
    out: dict[str, Path] = {}

    out["junk-lines"] = folder / "junk.log"
    _write_lines(out["junk-lines"], (_mangle(rng, rng.choice(real)) for _ in range(junk_lines)))

    # One enormous line: a non-default args dump (the parser's dict reader) that never ends.
    out["long-line"] = folder / "long.log"
    with open(out["long-line"], "wb") as f:
        f.write(real[0] + b"\n")
        f.write(b"(APIServer pid=1) INFO 11-30 03:35:20 [utils.py:233] non-default args: {'model': '")
        written, piece = 0, b"x" * 9 + b"{'[(" * 4 + b"1e309, "
        while written < long_line:
            f.write(piece * 4096)
            written += len(piece) * 4096
        f.write(b"'}\n" + real[1] + b"\n")
    # The same line with progress redraws in it and no final newline.
    out["long-line-cr"] = folder / "long-cr.log"
    with open(out["long-line-cr"], "wb") as f:
        written = 0
        while written < long_line:
            f.write(b"Capturing CUDA graphs (FULL):  10%|#         | 5/51 " * 200 + b"\r")
            written += 52 * 200 + 1

    out["random-bytes"] = folder / "random.bin"
    with open(out["random-bytes"], "wb") as f:
        left = random_bytes
        while left > 0:
            n = min(left, MB)
            f.write(rng.randbytes(n))
            left -= n

    out["invalid-utf8"] = folder / "utf8.log"
    bad = [b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
           "\u4e2d\u6587".encode("utf-8")[:-1], b"\x80\x80\x80"]
    _write_lines(out["invalid-utf8"], (
        (lambda ln, i: ln[:i] + rng.choice(bad) + ln[i:])(ln, rng.randrange(len(ln) + 1))
        for ln in (rng.choice(real) for _ in range(max(1000, junk_lines // 20)))))

    import re

    number = re.compile(rb"\d+(?:\.\d+)?")
    numeric = [ln for ln in real if number.search(ln)]
    out["absurd-numbers"] = folder / "absurd.log"
    _write_lines(out["absurd-numbers"], (
        number.sub(lambda m: rng.choice(ABSURD).encode(), ln)
        for ln in (numeric * (1 + max(1000, junk_lines // 20) // len(numeric)))))
    return out


def _expected_lines(path: Path) -> int:
    """Lines as parse_file counts them: split on \\n, a last unterminated line counts."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(MB):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def _strict_json(report) -> str | None:
    """None if the report serialises as strict JSON (no NaN/Infinity), else why not."""
    try:
        text = json.dumps(report.to_dict(include_stats=True), default=str, allow_nan=False)
        json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, TypeError) as exc:
        return str(exc)[:200]
    return None


def row_parser_fuzz(seed: int = 2, junk_lines: int = 1_000_000, long_line: int = 10 * MB,
                    random_bytes: int = 50 * MB, workdir: Path | None = None, max_growth_mb: float = 50.0,
                    cli: bool = True) -> Verdict:
    from ernie_tui.engine_ctl.logs import LogParser, LogTailer, parse_file

    v = Verdict("parser-fuzz")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="ernie-rel-fuzz-"))
    t0 = time.monotonic()
    inputs = make_fuzz_inputs(workdir, seed, junk_lines, long_line, random_bytes)
    made = time.monotonic() - t0
    exceptions = swallowed = 0
    peak = 0.0
    bytes_in = 0
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t1 = time.monotonic()
    for name, path in inputs.items():
        bytes_in += path.stat().st_size
        # The whole-file path (parse-log, --replay).
        parser = LogParser()
        try:
            with PeakRSS() as mem:
                report = parse_file(path, parser=parser)
        except Exception as exc:  # noqa: BLE001  the fuzz counts any exception: the contract is never to raise
            exceptions += 1
            v.fail(f"{name}: parse_file raised {type(exc).__name__}: {exc}")
            continue
        peak = max(peak, mem.growth_mb)
        swallowed += parser.internal_errors
        if parser.internal_errors:
            v.fail(f"{name}: parse_file swallowed {parser.internal_errors} handler exceptions")
        if mem.growth_mb > max_growth_mb:
            v.fail(f"{name}: parse_file grew RSS by {mem.growth_mb:.1f} MB")
        want = _expected_lines(path)
        if report.lines != want:
            v.fail(f"{name}: parse_file counted {report.lines} lines, the file has {want}")
        why = _strict_json(report)
        if why:
            v.fail(f"{name}: parse_file report is not strict JSON: {why}")
        # The live path (the dashboard's monitor): tailer slices into LogParser.feed.
        live = LogParser()
        try:
            with PeakRSS() as mem, LogTailer(path, from_start=True) as tailer:
                n = 0
                while lines := tailer.read_new():
                    for line in lines:
                        live.feed(line)
                    n += len(lines)
                if tailer.partial:
                    live.feed(tailer.partial)
                    n += 1
        except Exception as exc:  # noqa: BLE001  the fuzz counts any exception: the contract is never to raise
            exceptions += 1
            v.fail(f"{name}: the live path raised {type(exc).__name__}: {exc}")
            continue
        peak = max(peak, mem.growth_mb)
        if n != want:  # the tailer ends lines at \n (CRLF once; a lone \r is a redraw), as parse_file does
            v.fail(f"{name}: the tailer gave {n} lines, the file has {want}")
        swallowed += live.internal_errors
        if live.internal_errors:
            v.fail(f"{name}: LogParser.feed swallowed {live.internal_errors} handler exceptions")
        if mem.growth_mb > max_growth_mb:
            v.fail(f"{name}: the live path grew RSS by {mem.growth_mb:.1f} MB")
        why = _strict_json(live.report)
        if why:
            v.fail(f"{name}: live report is not strict JSON: {why}")
    parse_s = time.monotonic() - t1
    maxrss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss_before) / 1024
    cli_checked = 0
    if cli:  # `parse-log --json` as a user runs it: exit 0, strict JSON on stdout, nothing on stderr
        for name in ("absurd-numbers", "invalid-utf8", "long-line"):
            r = subprocess.run([sys.executable, "-m", "ernie_tui", "parse-log", "--json", "--all-stats",
                                str(inputs[name])], capture_output=True, env=_env_with_src(), timeout=300)
            cli_checked += 1
            try:
                json.loads(r.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
            except ValueError as exc:
                v.fail(f"parse-log --json {name}: not strict JSON ({exc})")
            if r.returncode != 0 or r.stderr.strip():
                v.fail(f"parse-log --json {name}: exit {r.returncode}, stderr {r.stderr[-300:]!r}")
    shutil.rmtree(workdir, ignore_errors=True)
    v.figures.update(inputs=len(inputs), junk_lines=junk_lines, long_line_mb=long_line / MB,
                     random_mb=random_bytes / MB, input_mb=round(bytes_in / MB, 1),
                     exceptions=exceptions, swallowed=swallowed, peak_rss_growth_mb=peak,
                     maxrss_growth_mb=maxrss_growth, cli_json_checked=cli_checked,
                     make_s=made, parse_s=parse_s)
    return v


def _env_with_src(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


# ---------------------------------------------------------------------------
# tailer

class _Writer:
    """A log writer that appends numbered lines and can truncate, rotate and
    delete its file, as copytruncate, logrotate and `rm` do."""

    def __init__(self, path: Path, rng: random.Random):
        self.path = path
        self.rng = rng
        self.n = 0
        self.f = open(path, "ab", buffering=0)

    def line(self) -> bytes:
        pad = "." * self.rng.choice([0, 1, 10, 200, 5000])
        text = f"line {self.n} {pad}".encode()
        self.n += 1
        return text + self.rng.choice([b"\n", b"\n", b"\n", b"\r\n"])

    def write_lines(self, k: int, pieces: bool) -> None:
        for _ in range(k):
            data = self.line()
            if pieces and len(data) > 3:  # a line written in parts (the tailer must hold it)
                i = self.rng.randrange(1, len(data) - 1)
                self.f.write(data[:i])
                self.f.write(data[i:])
            else:
                self.f.write(data)

    def event(self, kind: str, poll: Callable[[], None]) -> None:
        if kind == "truncate":  # copytruncate: the same file, cut to 0
            os.truncate(self.path, 0)
        elif kind == "rotate":  # rename away, write to a new file
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self.f.close()
            poll()  # the tailer may look while there is no llm.log at all
            self.f = open(self.path, "ab", buffering=0)
        elif kind == "delete":
            os.unlink(self.path)
            self.f.close()
            poll()
            self.f = open(self.path, "ab", buffering=0)

    def close(self) -> None:
        self.f.close()


def _check_sequence(got: list[str], total: int) -> tuple[int, int, int]:
    """(lost, doubled, out of order) for lines 'line N ...' numbered 0..total-1."""
    nums = []
    for text in got:
        parts = text.split(" ", 2)
        if len(parts) >= 2 and parts[0] == "line" and parts[1].isdigit():
            nums.append(int(parts[1]))
    seen = set(nums)
    lost = sum(1 for i in range(total) if i not in seen)
    doubled = len(nums) - len(seen)
    disorder = sum(1 for a, b in zip(nums, nums[1:], strict=False) if b <= a)
    return lost, doubled, disorder


def tailer_interleaved(path: Path, events: int, seed: int) -> dict[str, int]:
    """Writer and tailer in one thread, interleaved at random points (even
    mid-line); at each event the writer pauses: the tailer polls before and
    after it, as it would while a real writer paused."""
    from ernie_tui.engine_ctl.logs import LogTailer

    rng = random.Random(seed)
    w = _Writer(path, rng)
    tailer = LogTailer(path, from_start=True, max_line=1 << 16)
    got: list[str] = []

    def poll() -> None:
        got.extend(tailer.read_new())

    counts = {"truncate": 0, "rotate": 0, "delete": 0}
    for _ in range(events):
        for _ in range(rng.randrange(1, 6)):
            w.write_lines(rng.randrange(0, 40), pieces=rng.random() < 0.3)
            if rng.random() < 0.5:
                poll()
        poll()  # the pause before the event: the tailer catches up
        kind = rng.choice(list(counts))
        counts[kind] += 1
        w.event(kind, poll)
        poll()  # the pause after it
    w.write_lines(5, pieces=False)
    poll()
    w.close()
    tailer.close()
    lost, doubled, disorder = _check_sequence(got, w.n)
    return {"lines": w.n, **counts, "lost": lost, "doubled": doubled, "out_of_order": disorder,
            "rotations_seen": tailer.rotations, "truncations_seen": tailer.truncations}


WRITER_PROCESS = r"""
import os, random, sys, time
path, events, seed, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rng = random.Random(seed)
n = 0
f = open(path, "ab", buffering=0)
for e in range(events):
    for _ in range(rng.randrange(20, 200)):
        f.write(b"line %d %s\n" % (n, b"." * rng.choice([0, 10, 300])))
        n += 1
        if rng.random() < 0.05:
            time.sleep(0.001)
    time.sleep(pause)
    kind = ("truncate", "rotate", "delete")[e % 3]
    if kind == "truncate":
        os.truncate(path, 0)
    elif kind == "rotate":
        os.replace(path, path + ".1"); f.close(); f = open(path, "ab", buffering=0)
    else:
        os.unlink(path); f.close(); f = open(path, "ab", buffering=0)
    time.sleep(pause)
f.write(b"line %d end\n" % n); n += 1
f.close()
print(n)
"""


def tailer_live(path: Path, events: int, seed: int, poll_s: float = 0.1) -> dict[str, int | float]:
    """A writer process and the tailer polling every poll_s, as the server
    monitor does; the writer pauses 3 polls before and after each event."""
    from ernie_tui.engine_ctl.logs import LogTailer

    path.touch()
    tailer = LogTailer(path, from_start=True)
    got: list[str] = []
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", WRITER_PROCESS, str(path), str(events), str(seed),
                             str(3 * poll_s)], stdout=subprocess.PIPE, text=True)
    while proc.poll() is None:
        got.extend(tailer.read_new())
        time.sleep(poll_s)
    for _ in range(3):
        got.extend(tailer.read_new())
    total = int(proc.stdout.read().strip() or 0)
    proc.stdout.close()
    tailer.close()
    lost, doubled, disorder = _check_sequence(got, total)
    return {"lines": total, "events": events, "lost": lost, "doubled": doubled, "out_of_order": disorder,
            "seconds": time.monotonic() - t0}


def row_tailer(events: int = 1000, live_events: int = 60, seed: int = 3, workdir: Path | None = None) -> Verdict:
    v = Verdict("tailer")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="ernie-rel-tail-"))
    t0 = time.monotonic()
    fd0 = open_fds()
    a = tailer_interleaved(workdir / "a.log", events, seed)
    b = tailer_live(workdir / "b.log", live_events, seed) if live_events else {"lines": 0, "lost": 0, "doubled": 0,
                                                                              "out_of_order": 0}
    fds = open_fds() - fd0
    for name, r in (("interleaved", a), ("live", b)):
        for what in ("lost", "doubled", "out_of_order"):
            if r[what]:
                v.fail(f"{name}: {r[what]} lines {what.replace('_', ' ')}")
    if fds > 0:
        v.fail(f"{fds} descriptors left open")
    shutil.rmtree(workdir, ignore_errors=True)
    v.figures.update(events=events, truncate=a["truncate"], rotate=a["rotate"], delete=a["delete"],
                     lines=a["lines"], lost=a["lost"], doubled=a["doubled"], out_of_order=a["out_of_order"],
                     live_events=live_events, live_lines=b["lines"], live_lost=b["lost"],
                     live_doubled=b["doubled"], live_out_of_order=b["out_of_order"], leaked_fds=max(0, fds),
                     seconds=time.monotonic() - t0)
    return v


# ---------------------------------------------------------------------------
# presets

# (name, file text, the line the error must name). Each is broken one way.
PRESET_CASES: list[tuple[str, bytes, int]] = [
    ("unclosed table", b"[presets.a\nblock_size = 32\n", 1),
    ("missing value", b"[presets.a]\nblock_size = 32\nmax_model_len = \n", 3),
    ("unclosed string", b'[presets.a]\ndescription = "never ends\nblock_size = 32\n', 2),
    ("unclosed array", b'[presets.a]\nlauncher = ["python",\n', 2),
    ("duplicate key", b"[presets.a]\nblock_size = 32\nblock_size = 64\n", 3),
    ("duplicate table", b"[presets.a]\nblock_size = 32\n[presets.a]\nport = 1\n", 3),
    ("string for int", b'[presets.a]\nport = 8000\nblock_size = "16"\n', 3),
    ("int for bool", b"[presets.a]\n\nenable_prefix_caching = 1\n", 3),
    ("bad size", b'[presets.a]\nblock_size = 32\nkv_cache_memory_bytes = "lots"\n', 3),
    ("negative size", b'[presets.a]\nkv_cache_memory_bytes = "-64M"\n', 2),
    ("port out of range", b"[presets.a]\nport = 70000\n", 2),
    ("negative port", b"[presets.a]\n# the port\nport = -1\n", 3),
    ("huge int", b"[presets.a]\nmax_model_len = 99999999999999999999999\n", 2),
    ("float for int", b"[presets.a]\nmax_model_len = 2048.5\n", 2),
    ("nan", b"[presets.a]\ngpu_memory_utilization = nan\n", 2),
    ("env not a table", b'[presets.a]\nenv = "X=1"\n', 2),
    ("env value a table", b"[presets.a]\n[presets.a.env]\nX = { y = 1 }\n", 3),
    ("launcher not a list", b'[presets.a]\nlauncher = "python -m vllm"\n', 2),
    ("empty launcher", b"[presets.a]\nlauncher = []\n", 2),
    ("extends unknown", b'[presets.a]\nblock_size = 32\nextends = "nope"\n', 3),
    ("extends cycle", b'[presets.a]\nextends = "b"\n[presets.b]\nextends = "a"\n', 4),
    ("preset not a table", b'[presets]\na = 5\n', 2),
    ("top-level key", b"block_size = 32\n[presets.a]\n", 1),
    ("invalid UTF-8", b'[presets.a]\ndescription = "caf\xe9"\n', 2),
    ("NUL byte", b'[presets.a]\ndescription = "a\x00b"\n', 2),
    ("garbage", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 1),
]


def _run_cli_inprocess(argv: list[str]) -> tuple[int | None, str, str, str | None]:
    """(exit code, stdout, stderr, escaped exception) of `ernie-tui ARGV` in this process."""
    from ernie_tui.cli import main

    out, err = io.StringIO(), io.StringIO()
    escaped = None
    code: int | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001  a traceback a user would see: counted
            escaped = f"{type(exc).__name__}: {exc}"
    return code, out.getvalue(), err.getvalue(), escaped


def _judge_preset_error(v: Verdict, label: str, path: Path, code, out: str, err: str, escaped: str | None,
                        want_line: int | None, n_lines: int) -> str:
    """'ok' (exit 0), 'error' (a good error) or 'bad'."""
    import re

    if escaped or "Traceback" in out + err:
        v.fail(f"{label}: traceback ({escaped or err.strip().splitlines()[-1]})")
        return "bad"
    if code == 0:
        if want_line is not None:
            v.fail(f"{label}: accepted a malformed file")
            return "bad"
        return "ok"
    lines = err.strip().splitlines()
    m = re.match(rf"ernie-tui: error: {re.escape(str(path))}:(\d+): ", lines[0]) if lines else None
    if code != 1 or len(lines) != 1 or not m:
        v.fail(f"{label}: exit {code}, stderr {err.strip()[:300]!r}")
        return "bad"
    line = int(m.group(1))
    if want_line is not None and line != want_line:
        v.fail(f"{label}: names line {line}, the fault is on line {want_line}: {lines[0]}")
        return "bad"
    if not 1 <= line <= n_lines + 1:
        v.fail(f"{label}: names line {line} of a {n_lines}-line file")
        return "bad"
    return "error"


def _mutate(rng: random.Random, text: bytes) -> bytes:
    lines = text.split(b"\n")
    i = rng.randrange(len(lines))
    k = rng.randrange(6)
    if k == 0 and lines[i]:
        j = rng.randrange(len(lines[i]))
        lines[i] = lines[i][:j] + lines[i][j + 1:]
    elif k == 1:
        j = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:j] + rng.choice([b"=", b"[", b"]", b"{", b"\"", b"'", b".", b",", b"#", b"\xff",
                                               b"\x00", b"-", b"9" * 30, b"nan"]) + lines[i][j:]
    elif k == 2:
        lines.insert(i, lines[rng.randrange(len(lines))])
    elif k == 3 and b"=" in lines[i]:
        key = lines[i].split(b"=", 1)[0]
        lines[i] = key + b"= " + rng.choice([b'"16"', b"-1", b"true", b"[]", b"{}", b"1.5", b'"lots"', b"1e999"])
    elif k == 4:
        del lines[i]
    else:
        lines[i] = lines[i].upper()
    return b"\n".join(lines)


def row_presets(mutations: int = 300, seed: int = 4, processes: bool = True, workdir: Path | None = None) -> Verdict:
    v = Verdict("presets")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="ernie-rel-presets-"))
    t0 = time.monotonic()
    counts = {"errors": 0, "accepted": 0, "bad": 0}
    for i, (name, text, line) in enumerate(PRESET_CASES):
        path = workdir / f"case{i:02d}.toml"
        path.write_bytes(text)
        for argv in (["presets", "list", "--presets", str(path)], ["--presets", str(path), "check", "a"]):
            verdict = _judge_preset_error(v, f"{name} ({' '.join(argv[:2])})", path, *_run_cli_inprocess(argv),
                                          want_line=line, n_lines=text.count(b"\n") + 1)
            counts["errors" if verdict == "error" else "bad" if verdict == "bad" else "accepted"] += 1
    rng = random.Random(seed)
    from ernie_tui.presets.loader import _builtin_text

    base = _builtin_text().encode()
    mutated_errors = mutated_ok = 0
    for i in range(mutations):
        text = base
        for _ in range(rng.randrange(1, 4)):
            text = _mutate(rng, text)
        path = workdir / f"mut{i:03d}.toml"
        path.write_bytes(text)
        verdict = _judge_preset_error(v, f"mutation {i}", path,
                                      *_run_cli_inprocess(["presets", "list", "--presets", str(path)]),
                                      want_line=None, n_lines=text.count(b"\n") + 1)
        mutated_errors += verdict == "error"
        mutated_ok += verdict == "ok"
        counts["bad"] += verdict == "bad"
    runs = 0
    if processes:  # as a user meets them: `ernie-tui presets list` and the dashboard's start
        for i, (name, text, line) in enumerate(PRESET_CASES):
            path = workdir / f"case{i:02d}.toml"
            for argv in (["presets", "list", "--presets", str(path)], ["--presets", str(path), "--preset", "a"]):
                r = subprocess.run([sys.executable, "-m", "ernie_tui", *argv], capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, env=_env_with_src(ERNIE_TUI_HOME=str(workdir / "home")),
                                   timeout=60)
                runs += 1
                if _judge_preset_error(v, f"{name} (process: {' '.join(argv[:2])})", path, r.returncode, r.stdout,
                                       r.stderr, None, line, text.count(b"\n") + 1) == "bad":
                    counts["bad"] += 1
    shutil.rmtree(workdir, ignore_errors=True)
    v.figures.update(cases=len(PRESET_CASES), case_runs=len(PRESET_CASES) * 2, good_errors=counts["errors"],
                     mutations=mutations, mutation_errors=mutated_errors, mutations_still_valid=mutated_ok,
                     process_runs=runs, bad=counts["bad"], seconds=time.monotonic() - t0)
    return v


# ---------------------------------------------------------------------------
# A misbehaving HTTP server for /metrics and the probe

class RawServer:
    """A TCP server whose every connection runs `behave(conn, request_head)`.
    Raw sockets, so it can do what no HTTP library would: hang, drip, drop."""

    def __init__(self, behave: Callable[[socket.socket, bytes], None]):
        self.behave = behave
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head = b""
            conn.settimeout(5)
            while b"\r\n\r\n" not in head:
                part = conn.recv(65536)
                if not part:
                    return
                head += part
            # Read the body too: closing a socket with unread input sends a
            # reset, and the client would see that instead of our behaviour.
            head, _, body = head.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip() or 0)
            while len(body) < length:
                part = conn.recv(65536)
                if not part:
                    return
                body += part
            self.behave(conn, head)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=2)
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.close()
        self.sock.close()

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_closed(srv_stop: threading.Event, seconds: float) -> None:
    srv_stop.wait(seconds)


def _http(status: str, body: bytes, ctype: bytes = b"text/plain", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def _metrics_behaviours(rng: random.Random, junk_lines: int) -> dict[str, Callable[[RawServer], Callable]]:
    junk = rng.randbytes(200_000)
    big = b"".join(b"vllm:x%d{a=\"%d\"} %s\n" % (i, i, rng.choice([b"1", b"nan", b"+Inf", b"1e999", b"x", b""]))
                   for i in range(junk_lines))
    return {
        "hang-accept": lambda s: lambda c, h: _wait_closed(s.stop, 3600),
        "hang-after-headers": lambda s: lambda c, h: (c.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\nvllm:a 1\n"),
            _wait_closed(s.stop, 3600)),
        "drip": lambda s: lambda c, h: _drip(s, c, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                                  b"Content-Length: 100000000\r\n\r\n", b"vllm:a 1\n"),
        "drop-mid-body": lambda s: lambda c, h: c.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5000\r\n\r\nvllm:num_requests_"),
        "close-at-once": lambda s: lambda c, h: None,
        "not-http": lambda s: lambda c, h: c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
        "random-bytes-200": lambda s: lambda c, h: c.sendall(_http("200 OK", junk)),
        "invalid-utf8-200": lambda s: lambda c, h: c.sendall(_http("200 OK", b"vllm:a{b=\"\xff\xfe\"} 1\n\xc3\n")),
        "html-200": lambda s: lambda c, h: c.sendall(_http("200 OK", b"<html><body>login</body></html>",
                                                           b"text/html")),
        "junk-metrics": lambda s: lambda c, h: c.sendall(_http("200 OK", big)),
        "absurd-values": lambda s: lambda c, h: c.sendall(_http("200 OK", (
            b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} NaN\n"
            b"vllm:num_requests_running{model_name=\"m\"} 1e999\n"
            b"vllm:prompt_tokens_total{model_name=\"m\"} -Inf\n"
            b"vllm:cache_config_info{block_size=\"-1\",kv_cache_size_tokens=\"1e400\",num_gpu_blocks=\"x\"} 1\n"))),
        "http-500": lambda s: lambda c, h: c.sendall(_http("500 Internal Server Error", b"boom" * 10000)),
        "http-401": lambda s: lambda c, h: c.sendall(_http("401 Unauthorized", b'{"error":"Unauthorized"}')),
    }


def _drip(s: RawServer, c: socket.socket, head: bytes, piece: bytes) -> None:
    """Answer, then send a few bytes every 0.2 s for ever: each read gets
    something, so only a deadline on the whole request ends it."""
    c.sendall(head)
    while not s.stop.wait(0.2):
        c.sendall(piece)


def _timed(fn: Callable[[], Any], limit: float) -> tuple[Any, BaseException | None, float, bool]:
    """Run fn in a thread: (result, exception, seconds, finished within limit)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["r"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            box["e"] = exc

    t0 = time.monotonic()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit)
    return box.get("r"), box.get("e"), time.monotonic() - t0, not th.is_alive()


def row_metrics(timeout: float = 2.0, seed: int = 5, rounds: int = 3, junk_lines: int = 200_000) -> Verdict:
    """MetricsClient(timeout=T) against each bad /metrics: fetch_text() and
    fetch() raise MetricsError or return, try_fetch() never raises, and the
    request itself (fetch_text) ends within T + 3 s: a hung scrape stalls the
    charts that poll it. Parsing time is reported, not bounded (it grows with
    what the server sent: 8 MB of junk takes seconds)."""
    from ernie_tui.engine_ctl.load import MetricsClient, MetricsError

    v = Verdict("metrics")
    rng = random.Random(seed)
    bound = timeout + 3.0
    cases = 0
    errors = snapshots = 0
    slowest = slowest_parse = peak = 0.0
    t0 = time.monotonic()
    port = free_port()  # down: nothing listens
    targets: list[tuple[str, RawServer | None]] = [("down", None)]
    for name, make in _metrics_behaviours(rng, junk_lines).items():
        srv = RawServer(lambda c, h: None)
        srv.behave = make(srv)
        targets.append((name, srv))
    try:
        for _ in range(rounds):
            for name, srv in targets:
                url = srv.url if srv else f"http://127.0.0.1:{port}"
                client = MetricsClient(url, timeout=timeout)
                try:
                    for how in ("fetch_text", "fetch", "try_fetch"):
                        cases += 1
                        with PeakRSS() as mem:
                            result, exc, secs, done = _timed(getattr(client, how), bound + 30)
                        peak = max(peak, mem.growth_mb)
                        if not done:
                            v.fail(f"{name}: {how}() still blocked after {secs:.0f} s")
                            continue
                        if how == "fetch_text":  # the network part: bounded by the timeout
                            slowest = max(slowest, secs)
                            if secs > bound:
                                v.fail(f"{name}: {how}() took {secs:.1f} s (timeout {timeout:g} s)")
                        else:  # plus parsing, which grows with what was sent
                            slowest_parse = max(slowest_parse, secs)
                        if exc is not None and not (how != "try_fetch" and isinstance(exc, MetricsError)):
                            v.fail(f"{name}: {how}() raised {type(exc).__name__}: {exc}")
                        elif isinstance(exc, MetricsError):
                            errors += 1
                            if not str(exc).strip():
                                v.fail(f"{name}: an empty error message")
                        elif result is None:
                            errors += 1
                        else:
                            snapshots += 1
                finally:
                    client.close()
    finally:
        for _, srv in targets:
            if srv:
                srv.close()
    v.figures.update(cases=cases, kinds=len(targets), errors=errors, snapshots=snapshots,
                     exceptions=sum(1 for p in v.problems if "raised" in p), slowest_fetch_s=slowest,
                     slowest_fetch_and_parse_s=slowest_parse, peak_rss_growth_mb=peak, timeout_s=timeout,
                     seconds=time.monotonic() - t0)
    return v


# ---------------------------------------------------------------------------
# probe

def _sse_head() -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _token(i: int) -> bytes:
    return b"data: " + json.dumps({"id": "x", "object": "text_completion", "model": "m", "choices": [
        {"index": 0, "text": f" w{i}", "finish_reason": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": i + 1, "total_tokens": i + 4}}).encode() + b"\n\n"


def _probe_behaviours(rng: random.Random) -> dict[str, tuple[Callable[[RawServer], Callable], str]]:
    """name -> (make behaviour, what must come back: 'error' or 'ok-malformed')."""
    garbage = [b"data: {not json\n\n", b"data: [1, 2\n\n", b"data: \xff\xfe\xc3\n\n", b"\x00\x01\x02\n\n",
               b"data: {\"choices\": 5}\n\n", b"data: {\"choices\": [{\"text\": 7}]}\n\n",
               b"data: {\"usage\": {\"completion_tokens\": 1e400}}\n\n", b"event: x\nid: \xff\n\n",
               b"data: {\"choices\": [{\"index\": 0, \"text\": null}], \"usage\": {\"completion_tokens\": -5}}\n\n",
               rng.randbytes(3000).replace(b"\n", b" ") + b"\n\n"]

    def stream(parts: list[bytes], end: bool) -> Callable:
        def make(s: RawServer) -> Callable:
            def behave(c: socket.socket, h: bytes) -> None:
                c.sendall(_sse_head())
                for p in parts:
                    c.sendall(_chunk(p))
                if end:
                    c.sendall(b"0\r\n\r\n")
            return behave
        return make

    def hang_after(parts: list[bytes]) -> Callable:
        def make(s: RawServer) -> Callable:
            def behave(c: socket.socket, h: bytes) -> None:
                c.sendall(_sse_head())
                for p in parts:
                    c.sendall(_chunk(p))
                s.stop.wait(3600)
            return behave
        return make

    def drip(s: RawServer) -> Callable:
        def behave(c: socket.socket, h: bytes) -> None:
            c.sendall(_sse_head())
            while not s.stop.wait(0.2):
                c.sendall(_chunk(b": keep-alive\n\n"))
        return behave

    def huge_line(s: RawServer) -> Callable:
        def behave(c: socket.socket, h: bytes) -> None:
            c.sendall(_sse_head())
            c.sendall(_chunk(_token(0)))
            block = b"x" * MB
            for _ in range(20):  # a 20 MB line, past the parser's 16 MB cap
                c.sendall(_chunk(block))
            c.sendall(_chunk(b"\n\n" + _token(1) + b"data: [DONE]\n\n"))
            c.sendall(b"0\r\n\r\n")
        return behave

    tokens = [_token(i) for i in range(4)]
    return {
        "hang-accept": (lambda s: lambda c, h: s.stop.wait(3600), "error"),
        "hang-before-first-token": (hang_after([]), "error"),
        "hang-mid-stream": (hang_after(tokens[:2]), "error"),
        "keepalive-drip": (drip, "error"),
        "drop-before-headers": (lambda s: lambda c, h: None, "error"),
        "drop-mid-stream": (stream(tokens[:2], end=False), "error"),
        "drop-mid-chunk": (lambda s: lambda c, h: c.sendall(_sse_head() + b"400\r\ndata: {\"choi"), "error"),
        "not-http": (lambda s: lambda c, h: c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), "error"),
        "html-200": (lambda s: lambda c, h: c.sendall(_http("200 OK", b"<html>login</html>", b"text/html")), "error"),
        "http-500": (lambda s: lambda c, h: c.sendall(_http("500 Internal Server Error", b"<h1>boom</h1>")), "error"),
        "only-garbage": (stream(garbage, end=True), "error"),
        "only-garbage-then-done": (stream(garbage + [b"data: [DONE]\n\n"], end=True), "error"),
        "garbage-between-tokens": (stream([x for pair in zip(tokens, garbage, strict=False) for x in pair]
                                          + [b"data: [DONE]\n\n"], end=True), "ok-malformed"),
        "huge-sse-line": (huge_line, "ok-malformed"),
    }


def row_probe(read_timeout: float = 2.0, total_timeout: float = 6.0, seed: int = 6,
              skip: tuple[str, ...] = ()) -> Verdict:
    """run_probe against each bad server: never raises; an error that says
    what happened (or, for junk between real tokens, a result that counts the
    junk); done within total_timeout + 3 s."""
    from ernie_tui.engine_ctl.load import run_probe

    v = Verdict("probe")
    rng = random.Random(seed)
    bound = total_timeout + 3.0
    errors = oks = 0
    slowest = 0.0
    kinds: dict[str, str] = {}
    t0 = time.monotonic()
    cases = [("refused", None, "error")] + [(n, make, want) for n, (make, want) in _probe_behaviours(rng).items()
                                             if n not in skip]
    for name, make, want in cases:
        srv = None
        if make is not None:
            srv = RawServer(lambda c, h: None)
            srv.behave = make(srv)
        url = srv.url if srv else f"http://127.0.0.1:{free_port()}"
        try:
            result, exc, secs, done = _timed(lambda url=url: run_probe(url, "hello", model="m", max_tokens=8,
                                                               read_timeout=read_timeout,
                                                               total_timeout=total_timeout), bound + 30)
        finally:
            if srv:
                srv.close()
        slowest = max(slowest, secs)
        if not done:
            v.fail(f"{name}: run_probe still blocked after {secs:.0f} s")
            continue
        if exc is not None:
            v.fail(f"{name}: run_probe raised {type(exc).__name__}: {exc}")
            continue
        if secs > bound:
            v.fail(f"{name}: took {secs:.1f} s (read timeout {read_timeout:g} s, total {total_timeout:g} s)")
        err = result.error
        kinds[name] = err.kind if err else f"ok({result.malformed_lines} malformed)"
        if want == "error":
            if err is None or not str(err.message).strip():
                v.fail(f"{name}: no error (ok={result.ok}, tokens={result.completion_tokens}, "
                       f"malformed={result.malformed_lines})")
            else:
                errors += 1
        else:
            if err is not None or not result.ok:
                v.fail(f"{name}: {err.kind if err else 'not ok'}: {err.message if err else ''}")
            elif not result.malformed_lines:
                v.fail(f"{name}: the junk was not counted")
            else:
                oks += 1
    v.figures.update(cases=len(cases), clear_errors=errors, ok_with_junk_counted=oks, slowest_s=slowest,
                     read_timeout_s=read_timeout, total_timeout_s=total_timeout, seconds=time.monotonic() - t0)
    v.figures["kinds"] = ",".join(f"{k}:{x}" for k, x in kinds.items())
    return v


# ---------------------------------------------------------------------------
# hangup

class Tmux:
    """One session on a private tmux server (-L): nothing else's is touched."""

    def __init__(self, name: str):
        self.name = name

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True, **kw)

    def start(self, command: str) -> None:
        self.run("new-session", "-d", "-s", self.name, "-x", "120", "-y", "40", command, check=True)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.name).stdout

    def pane_pid(self) -> int:
        return int(self.run("display-message", "-p", "-t", self.name, "#{pane_pid}", check=True).stdout.strip())

    def kill_server(self) -> None:
        """The terminal goes away: tmux hangs up on the pane (SIGHUP)."""
        self.run("kill-server")
        socket_dir = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
        (socket_dir / self.name).unlink(missing_ok=True)


def hangup_once(on_exit: str, workdir: Path, ready_timeout: float = 90.0) -> dict[str, Any]:
    """Start the dashboard on the stand-in server in tmux, wait for READY,
    hang up, and see what became of the app and the server."""
    from ernie_tui.engine_ctl.control import group_members

    marker = f"hangup-{on_exit}-{uuid.uuid4().hex[:8]}"
    home = workdir / f"home-{on_exit}"
    (home / "config").mkdir(parents=True)
    port = free_port()
    presets = workdir / f"presets-{on_exit}.toml"
    import tomli_w

    # The stand-in ignores the model, but preflight reads its config.json before a launch.
    p = stand_in_preset(port, marker, _tiny_model(), delay=0.05)
    presets.write_text(tomli_w.dumps({"presets": {"stand-in": {
        "launcher": p.launcher, "model": p.model, "port": port, "block_size": 32, "max_model_len": 2048,
        "kv_cache_memory_bytes": "64M", "env": p.env}}}))
    cmd = " ".join(shlex.quote(x) for x in [
        "env", "-u", "COLUMNS", "-u", "LINES", f"PYTHONPATH={SRC}", f"ERNIE_TUI_HOME={home}", "TERM=xterm-256color",
        sys.executable, "-m", "ernie_tui", "--presets", str(presets), "--preset", "stand-in", "--start",
        "--on-exit", on_exit])
    tmux = Tmux(f"ernie-rel-{on_exit}-{os.getpid()}")
    out: dict[str, Any] = {"on_exit": on_exit, "problems": []}
    started: list[psutil.Process] = []
    try:
        tmux.start(f"cd {shlex.quote(str(ROOT))} && exec {cmd}")
        app = psutil.Process(tmux.pane_pid())
        deadline = time.monotonic() + ready_timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = tmux.screen()
            head = screen.splitlines()[0] if screen else ""
            if "READY" in head:
                break
            time.sleep(0.3)
        else:
            out["problems"].append(f"never READY; screen:\n{screen}")
            return out
        started = marked_processes(marker)
        server_pids = sorted(p.pid for p in started)
        if not server_pids:
            out["problems"].append("READY but no server process carries the marker")
            return out
        server_pid = min(server_pids)
        t_hup = time.monotonic()
        tmux.kill_server()
        try:
            app.wait(timeout=60)
            out["app_exit_s"] = time.monotonic() - t_hup
        except psutil.TimeoutExpired:
            out["problems"].append("the app was still running 60 s after the hangup")
            app.kill()
        # The stop may still be escalating in the app's last moments; give it the same bound.
        deadline = time.monotonic() + 30
        while on_exit != "leave" and marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = marked_processes(marker)
        record = home / "state" / "server.json"
        out["server_left_running"] = bool(left)
        out["server_json"] = record.is_file()
        if on_exit in ("ask", "stop"):
            if left or group_members(server_pid):
                out["problems"].append(f"--on-exit {on_exit}: engine processes left: {[x.pid for x in left]}")
            if port_listening(port):
                out["problems"].append(f"--on-exit {on_exit}: port {port} still answers")
        else:
            if not left:
                out["problems"].append("--on-exit leave: the server did not survive the hangup")
            if not record.is_file():
                out["problems"].append("--on-exit leave: no server.json")
            else:
                info = json.loads(record.read_text())
                if info.get("pid") != server_pid:
                    out["problems"].append(f"--on-exit leave: server.json names pid {info.get('pid')}, "
                                           f"the server is {server_pid}")
            import httpx

            try:
                out["health_after"] = httpx.get(f"http://127.0.0.1:{port}/health", timeout=3).status_code
            except httpx.HTTPError as exc:
                out["problems"].append(f"--on-exit leave: /health does not answer: {exc}")
            # Stop it ourselves, as the user would later: SIGINT to its group, then SIGKILL.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server_pid, signal.SIGINT)
            gone, alive = psutil.wait_procs(left, timeout=15)
            end_processes(alive)
        return out
    finally:
        tmux.kill_server()
        end_processes(marked_processes(marker) + [p for p in started if p.is_running()])


def row_hangup(modes: tuple[str, ...] = ("ask", "stop", "leave"), workdir: Path | None = None) -> Verdict:
    v = Verdict("hangup")
    if shutil.which("tmux") is None:
        v.fail("tmux is not installed")
        return v
    workdir = Path(workdir or tempfile.mkdtemp(prefix="ernie-rel-hup-"))
    t0 = time.monotonic()
    for mode in modes:
        r = hangup_once(mode, workdir)
        for p in r["problems"]:
            v.fail(f"{mode}: {p}")
        v.figures[f"{mode}_exit_s"] = r.get("app_exit_s", float("nan"))
        v.figures[f"{mode}_server"] = "running" if r.get("server_left_running") else "stopped"
        if mode == "leave":
            v.figures["leave_server_json"] = r.get("server_json")
    shutil.rmtree(workdir, ignore_errors=True)
    v.figures["seconds"] = time.monotonic() - t0
    return v


# ---------------------------------------------------------------------------
# command line

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="row", required=True)
    c = sub.add_parser("cycles", help="start/stop/restart/kill -9 cycles")
    c.add_argument("--server", choices=["stand-in", "vllm"], default="stand-in")
    c.add_argument("--n", type=int, default=50)
    c.add_argument("--model", help="with --server vllm: the model dir (default: the tiny test model)")
    c.add_argument("--seed", type=int, default=1)
    f = sub.add_parser("parser-fuzz", help="the log parser on junk")
    f.add_argument("--junk-lines", type=int, default=1_000_000)
    f.add_argument("--long-line-mb", type=float, default=10)
    f.add_argument("--random-mb", type=float, default=50)
    f.add_argument("--seed", type=int, default=2)
    t = sub.add_parser("tailer", help="the log tailer under truncate/rotate/delete")
    t.add_argument("--events", type=int, default=1000)
    t.add_argument("--live-events", type=int, default=60)
    t.add_argument("--seed", type=int, default=3)
    p = sub.add_parser("presets", help="malformed preset files")
    p.add_argument("--mutations", type=int, default=300)
    p.add_argument("--seed", type=int, default=4)
    m = sub.add_parser("metrics", help="/metrics down, garbage, hanging")
    m.add_argument("--timeout", type=float, default=2.0)
    m.add_argument("--seed", type=int, default=5)
    pr = sub.add_parser("probe", help="probe against hanging, dropping, malformed servers")
    pr.add_argument("--read-timeout", type=float, default=2.0)
    pr.add_argument("--total-timeout", type=float, default=6.0)
    pr.add_argument("--seed", type=int, default=6)
    sub.add_parser("hangup", help="SIGHUP with each --on-exit, in tmux")
    sub.add_parser("all", help="every row at full size except `cycles --server vllm`")
    a = ap.parse_args(argv)

    rows: list[Callable[[], Verdict]]
    if a.row == "cycles":
        rows = [lambda: row_cycles(a.server, a.n, a.seed, model_dir=a.model)]
    elif a.row == "parser-fuzz":
        rows = [lambda: row_parser_fuzz(a.seed, a.junk_lines, int(a.long_line_mb * MB), int(a.random_mb * MB))]
    elif a.row == "tailer":
        rows = [lambda: row_tailer(a.events, a.live_events, a.seed)]
    elif a.row == "presets":
        rows = [lambda: row_presets(a.mutations, a.seed)]
    elif a.row == "metrics":
        rows = [lambda: row_metrics(a.timeout, a.seed)]
    elif a.row == "probe":
        rows = [lambda: row_probe(a.read_timeout, a.total_timeout, a.seed)]
    elif a.row == "hangup":
        rows = [row_hangup]
    else:
        rows = [lambda: row_cycles("stand-in", 50), row_parser_fuzz, row_tailer, row_presets, row_metrics,
                row_probe, row_hangup]
    failed = 0
    for row in rows:
        verdict = row()
        print(verdict.report(), flush=True)
        failed += not verdict.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
