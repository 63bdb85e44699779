"""Turn vLLM server log lines into a live EngineReport.

    parser = LogParser()
    if parser.feed_many(tailer.read_new()):  # how many report changes the lines made
        publish(parser.report)                # the EngineReport filled so far

    parse_file("llm.log")             # -> EngineReport (fast path for whole files)

Formats understood: vLLM 0.26 (GPU) and 0.32 (CPU) as captured in
tests/fixtures/vllm-logs, plus older wording: `# GPU blocks: N`, separate
`GPU KV cache size` / `Maximum concurrency` lines, the V0 stats line
(`Running/Swapped/Pending`), `torch.compile takes`, `Loading model weights
took N GB`, un-prefixed lines from before the `(APIServer pid=N)` era.

A change is a report field that got a value, a phase started or finished,
a rank's pid, the shutdown, the version, the args, a stats sample, ready,
an error (set or replaced by a better root cause), or a second server start
in one log (which resets the report). (Typed events per change were built
here once; nothing read them: logs/events.py is gone.)

Speed. Most lines in a vLLM log are access-log lines, route listings,
traceback frames and warnings. Each line gets a cheap prefilter with no
regex: one dict lookup on the five characters after the process prefix
(the log level), then for vLLM's own lines one dict lookup on the first
four characters of the message; traceback frames are rejected by their
indentation, other lines by a few substring checks. Only the few lines that
pass reach the detailed regexes (bench/parse_speed.py measures it).

Robustness. feed() and the parse_* functions never raise on log content:
every detailed handler runs under a try/except. What one raises is the
parser's own bug, never silent: logged (logger "ernie_tui.engine_ctl.logs.logparse",
with the line number and text), counted (`LogParser.internal_errors`) and
put in the report (`parser_errors`, `parser_error_count`), which parse-log
and the dashboard show.

Errors. The report keeps the FIRST fatal error with its ROOT CAUSE: vLLM
prints the real exception (e.g. `ValueError: No common block size ...`) and
then generic wrappers (`RuntimeError: Engine core initialization failed.
See root cause above`); wrappers are kept only until a specific cause shows
up, whichever order the processes' output interleaves in. Errors after the
server became ready count only when they are fatal (engine died, CUDA OOM,
port in use), so a rejected request does not mark the server as crashed.
"""

from __future__ import annotations

import ast
import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

from ernie_tui.engine_ctl.logs.errors import _HANDLER_TEXT_CAP, ErrorKind, classify_error
from ernie_tui.engine_ctl.logs.figures import _figure, _finite, _note
from ernie_tui.engine_ctl.logs.logtail import strip_ansi as _strip_ansi
from ernie_tui.engine_ctl.logs.ranks import is_rank, note_rank
from ernie_tui.engine_ctl.logs.report import PARSER_ERRORS_KEPT, PHASES, EngineError, EngineReport, StatsSample

__all__ = [
    "LogParser", "classify_error",
    "parse_file", "parse_lines",
]


log = logging.getLogger(__name__)

# Periodic stats samples kept in a report (see _m_stats).
MAX_STATS = 5000


# --------------------------------------------------------------------------- prefilter

# "(APIServer pid=1938) " / "(EngineCore_DP0 pid=7) " / "(VllmWorker-0 pid=13964) ",
# and Ray's "(RayWorkerWrapper pid=2436, ip=10.0.0.2) "
_PFX = re.compile(r"\(([^()\s][^()]{0,40}?) pid=(\d+)(?:, ip=[^()\s]{1,64})?\) ")

# The five characters after the prefix say what kind of line it is:
# 1 = vLLM's own INFO/WARNING/DEBUG line ("INFO 11-30 03:20:09 [cuda.py:482] msg"),
# 2 = uvicorn ("INFO:     127.0.0.1:5075 - "GET /health HTTP/1.1" 200 OK"),
# 3 = an error line, vLLM's ("ERROR 11-30 ...") or uvicorn's ("ERROR:    ...").
# Anything else (traceback text, bare exception lines, tqdm bars) is "plain".
_LEVELS = {"INFO ": 1, "WARNI": 1, "DEBUG": 1, "INFO:": 2, "ERROR": 3, "CRITI": 3}

# First four characters of an interesting vLLM message -> handler method name.
# A dict lookup rejects the other ~95% of vLLM lines without running a regex;
# handlers then check the full wording (several messages share a key).
_KEYS = {
    "vLLM": "_k_ver", "non-": "_k_args", "Reso": "_k_arch", "Usin": "_k_using", "Load": "_k_load",
    "Mode": "_k_mltook", "torc": "_k_tctook", "Init": "_k_init", "init": "_k_inittook",
    "Grap": "_k_graphtook", "Avai": "_k_kvmem", "Expl": "_k_kvset", "Maxi": "_k_conc",
    "Star": "_k_start", "Engi": "_k_engine", "Avg ": "_k_stats", "Pref": "_k_prefixhit",
    "Dyna": "_k_compile", "Warm": "_k_compile", "Comp": "_k_compile", "Capt": "_k_capture",
    "Auto": "_k_platform", "Work": "_k_fail", "Asyn": "_k_fail",
    **{f"{d} ": "_k_kvsize" for d in ("GPU", "CPU", "XPU", "TPU", "HPU", "NPU")},
    **{f"# {d}": "_k_blocks" for d in ("GP", "gp", "cu", "CU", "CP", "cp", "XP", "xp", "TP", "tp", "HP", "hp")},
}

# --------------------------------------------------------------------------- detail regexes

_RE_VER = re.compile(r"vLLM (?:API )?server version (\S+?),?(?:\s|$)(?:serving model (\S+))?")
_RE_BANNER = re.compile(r"[ \u2580-\u259f]+(version|model)\s+(\S+)")
_RE_BACKEND = re.compile(r"Using ([A-Za-z][\w\- ]*?) (?:attention )?backend(?: on V1 engine)?(?:\.|\s|$)")
_RE_WTOOK = re.compile(r"weights took (\d+(?:\.\d+)?) ?(GiB|GB|seconds|s)\b")
_RE_MLTOOK = re.compile(r"Model loading took (\d+(?:\.\d+)?) ?(?:GiB|GB)(?: memory)? and (\d+(?:\.\d+)?) s")
_RE_SECS = re.compile(r"took (\d+(?:\.\d+)?) s")
_RE_INIT = re.compile(r"\) took (\d+(?:\.\d+)?) s(?:econds)?(?: \(compilation: (\d+(?:\.\d+)?) s)?")
_RE_GRAPH = re.compile(r"finished in (\d+(?:\.\d+)?) secs?, took (-?\d+(?:\.\d+)?) GiB")
_RE_KVSET = re.compile(r"Explicitly set \((-?\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)\) GiB for KV cache")
_RE_KVSIZE = re.compile(r"(?:(\w+) )?KV cache size: ([\d,]+) tokens"
                        r"(?:, Maximum concurrency for ([\d,]+) tokens per request: (\d+(?:\.\d+)?)x)?")
_RE_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: (\d+(?:\.\d+)?)x")
_RE_BLOCKS = re.compile(r"# (\w+) blocks: (\d+)(?:, # CPU blocks: (\d+))?")
_RE_URL = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (\S+)")
_RE_STATS_KV = re.compile(r"(?:^|, |: )([A-Za-z][A-Za-z ]*?): (-?\d+(?:\.\d+)?)")
_RE_TS = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")
_RE_TQDM = re.compile(r"([^\r|]*?):\s+(\d+)%(?:\|[^|]*\||\s+Completed\s+\|)\s*(\d+)/(\d+)")
_RE_EXC = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?$")
_RE_ARGPARSE = re.compile(r"[\w.\- ]{1,60}: error: (.*)")
# What the interpreter itself prints when `python -m MODULE` / `python FILE`
# cannot even begin, as "<executable>: <reason>" (runpy's and main's own
# wording): the launcher's Python has no vLLM, or the script is not there.
_RE_INTERPRETER = re.compile(r"\S+: (?:Error while finding module specification for |No module named "
                             r"|can't open file )")
_RE_STARTED = re.compile(r"Started server process \[(\d+)\]")
_RE_UVICORN_URL = re.compile(r"Uvicorn running on (\S+)")
_RE_PYD_TAIL = re.compile(r"\s*\[type=[\w.]+, input_value=.*$")

# Exceptions that are how processes end, not why they failed.
_IGNORED_EXC = ("KeyboardInterrupt", "SystemExit", "CancelledError", "GeneratorExit")
# Error kinds that still matter after the server became ready.
_FATAL_AFTER_READY = {ErrorKind.ENGINE_DEAD, ErrorKind.CUDA_OOM, ErrorKind.PORT_IN_USE,
                      ErrorKind.ILLEGAL_INSTRUCTION}
# vLLM 0.32's "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup".
_ENGINE_GONE = "engine core exited unexpectedly"
# Messages that only say "something failed, see above".
_WRAPPERS = ("Engine core initialization failed", "WorkerProc initialization failed",
             "Engine process failed to start", "validation error for", "validation errors for",
             "EngineCore failed to start", "WorkerProc hit an exception", "WorkerProc failed to start",
             "please check the stack trace above", "See stack trace for root cause",
             "See root cause above")
# Role names vLLM versions print for the same processes.
_ROLE_NORM = re.compile(r"(EngineCore)_DP0$|(?:VllmWorker[- ]|Worker_TP)(\d+)$")
# vLLM's own (non-exception) messages that report an engine failure.
_ERROR_MESSAGES = ("EngineCore failed to start", "EngineCore encountered", "Engine core proc ",
                   "WorkerProc hit an exception", "WorkerProc failed to start", "Worker proc ",
                   "AsyncLLM output_handler failed")
# vLLM's words for a start it gave up itself (a process of it failed to
# initialise): the server will exit, whatever else the log says.
_START_FAILED = ("EngineCore failed to start", "WorkerProc failed to start", "WorkerProc hit an exception",
                 "Engine core initialization failed", "Engine process failed to start")
_PHASE_INDEX: dict[str, int] = {p: i for i, p in enumerate(PHASES)}  # phase name -> its place


def _is_wrapper(kind: ErrorKind, message: str) -> bool:
    if kind is ErrorKind.ENGINE_DEAD:
        return True
    return kind is ErrorKind.OTHER and any(w in message for w in _WRAPPERS)


def _parse_args(text: str) -> dict[str, Any]:
    """Parse the repr of vLLM's non-default args dict without executing anything.

    literal_eval handles the usual case; values that are not literals (an enum
    repr like <CompilationMode.X: 3>, a config object) make it fail, and then
    each top-level `'key': value` pair is parsed on its own, keeping the raw
    text of values that are still not literals.
    """
    text = text.strip()
    try:
        value = ast.literal_eval(text)
        if isinstance(value, dict):
            return value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    out: dict[str, Any] = {}
    body = text[1:-1] if text.startswith("{") and text.endswith("}") else text.lstrip("{")
    for item in _split_top_level(body):
        key, sep, raw = item.partition(":")
        if not sep:
            continue
        key = key.strip().strip("'\"")
        raw = raw.strip()
        if not key:
            continue
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            out[key] = raw
    return out


def _split_top_level(body: str) -> list[str]:
    """Split `a, b(c, d), 'e, f'` on the commas that are not nested or quoted."""
    items: list[str] = []
    depth = 0
    quote = ""
    start = 0
    i = 0
    n = len(body)
    while i < n:
        c = body[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
        i += 1
    items.append(body[start:])
    return items


def _seconds_between(first: str | None, last: re.Match | None) -> float | None:
    """Seconds from one log stamp "MM-DD HH:MM:SS" to a later one (a year
    boundary aside); None without both."""
    if first is None or last is None:
        return None
    from datetime import datetime

    try:
        a, b = (datetime.strptime("2000-" + t, "%Y-%m-%d %H:%M:%S") for t in (first, last.group(1)))
    except ValueError:
        return None
    secs = (b - a).total_seconds()
    return secs if secs >= 0 else None


def _word_after(text: str, sep: str) -> str | None:
    """The first whitespace-separated word after `sep`, or None (lines may be cut anywhere)."""
    rest = text.partition(sep)[2].split(None, 1)
    return rest[0] if rest else None


def _after(text: str, key: str) -> str | None:
    """The token after `key` in a `k=v, k2=v2` config dump (find-based: these lines are long)."""
    i = text.find(key)
    if i < 0:
        return None
    i += len(key)
    j = text.find(",", i)
    value = text[i:] if j < 0 else text[i:j]
    return value.strip().strip("'\"")


def _last_segment(text: str) -> str:
    """For a line holding several \\r-separated redraws, the one a terminal would show."""
    end = len(text.rstrip())  # a trailing "\r" (from "\r\n") ends no redraw
    if end == 0:
        return ""
    return text[text.rfind("\r", 0, end) + 1:end]


def _text(line: str, s: int) -> str:
    """The message from offset s, capped, with ANSI codes and \\r redraws resolved."""
    text = line[s:s + _HANDLER_TEXT_CAP]
    if "\x1b" in text or "\r" in text:
        return _clean(text)
    return text.strip()


def _clean(text: str) -> str:
    if "\x1b" in text:
        text = _strip_ansi(text)
    return _last_segment(text).strip()


# --------------------------------------------------------------------------- the parser


class LogParser:
    """Incremental vLLM log parser. Feed lines in order; read `.report` any time."""

    def __init__(self) -> None:
        self.report = EngineReport()
        self.internal_errors = 0  # handler exceptions caught (should stay 0; each is logged and reported)
        self._latin1 = False  # parse_file: lines are latin-1 decoded bytes (see _scan)
        self._changes = 0  # report changes made by the lines of the current feed/peek
        self._reset_state()
        self._args_cache: dict[str, dict[str, Any]] = {}
        self._keys = {key: getattr(self, name) for key, name in _KEYS.items()}

    def _reset_state(self) -> None:
        self._pfx = "\x00"  # prefix of the previous prefixed line (never matches at first)
        self._plen = 0
        self._rank: tuple[str, int] | None = None  # (name, pid) of that prefix, when it is a rank
        self._rank_names: dict[int, str] = {}  # pid -> the name last noted in report.ranks
        self._err_is_wrapper = False
        self._shutting_down = False
        self._pyd_pending: int | None = None  # line of a pydantic ValidationError header
        self._platform_sure = False
        self._kv_bytes: int | None = None  # kv_cache_memory_bytes from the args
        self._blocks: int | None = None  # `# GPU blocks: N` waiting for a block size
        self._warmup_ts: str | None = None  # CPU: when "Warming up model for the compilation" came
        # The line where vLLM itself gave its start up ("EngineCore failed to
        # start", ...): what follows is the root cause's traceback, then
        # teardown, which took 7 s here and once minutes on a busy box.
        self.start_failed_line: int | None = None

    # -- public API ---------------------------------------------------------

    def peek(self, text: str) -> int:
        """Look at the line being drawn right now (a tailer's `partial`: a live
        tqdm bar) without consuming it. Only the progress it shows is taken,
        so the phase moves on while CUDA graphs are captured; the line itself
        is parsed when it ends, and line numbers are not touched."""
        self._changes = 0
        try:
            if "\x1b" in text or "\r" in text:
                text = _clean(text)
            head = text[:60]
            if ("Capturing" in head and "raph" in head) or "checkpoint shards" in head:
                self._progress(text, self.report.lines + 1)
        except Exception as exc:  # noqa: BLE001  the contract: never raise on log content; reported
            self._internal_error(exc, self.report.lines + 1, text)
        return self._changes

    def feed(self, line: str) -> int:
        """Parse one line (a trailing newline is fine); return how many report
        changes it made (0: nothing new for the report's readers)."""
        self._changes = 0
        try:
            if isinstance(line, bytes):
                line = line.decode("utf-8", errors="replace")
            if "\x1b" in line:
                line = _strip_ansi(line)
            self._scan((line,))
        except Exception as exc:  # noqa: BLE001  the contract: never raise on log content; reported
            self._internal_error(exc, self.report.lines, line)
        return self._changes

    def feed_many(self, lines: Iterable[str]) -> int:
        """Parse several lines (cheaper than feed() per line); return how many
        report changes they made."""
        self._changes = 0
        try:
            self._scan([_strip_ansi(ln) if "\x1b" in ln else ln for ln in lines])
        except Exception as exc:  # noqa: BLE001  the contract: never raise on log content; reported
            self._internal_error(exc, self.report.lines, "")
        return self._changes

    # -- the hot loop -------------------------------------------------------

    def _scan(self, lines: Iterable[str]) -> None:
        """Prefilter every line; hand the few interesting ones to handlers.

        Written for speed (this loop is most of parse_file's time): locals
        instead of attributes and globals, dict lookups instead of regexes, no
        call for a rejected INFO/WARNING or access line (a log's bulk; a new
        writer, an ERROR line or one without a level goes through a method).
        (Scanning bytes lines was tried: slower than decoding whole blocks.)

        In latin-1 mode (parse_file) blocks are decoded as latin-1, which is
        much cheaper than UTF-8 for text with a few multi-byte characters
        (tqdm bars, the banner) and keeps every line one byte per char; the
        keywords are ASCII so the prefilter is unaffected, and the rare
        non-ASCII line that reaches a handler is re-decoded as UTF-8 exactly.
        """
        latin = self._latin1
        rep = self.report
        n = rep.lines
        pfx, plen = self._pfx, self._plen
        levels = _LEVELS
        keys = self._keys
        try:
            for line in lines:
                n += 1
                if line.startswith(pfx):
                    pos = plen
                elif line[:1] == "(":  # another writer's prefix (rare: when the writer changes)
                    pfx, plen, pos = self._new_writer(rep, line, n, pfx, plen)
                else:
                    pos = 0
                if line[pos:pos + 1] == "(" and pos:
                    pos, forwarded = self._innermost_writer(line, pos, n)
                    if forwarded:
                        pfx = "\x00"  # the next line names its own writer again
                lv = levels.get(line[pos:pos + 5])
                if lv == 1:  # vLLM INFO/WARNING: dispatch on the message's first 4 chars
                    k = line.find("] ", pos)
                    if k < 0:
                        continue
                    k += 2
                    h = keys.get(line[k:k + 4])
                    if h is None:
                        c = line[k:k + 1]
                        if c != "[" and c != " " and c < "\x80":
                            continue
                        h = self._k_odd  # "[backbone] " tags, the ASCII-art banner
                elif lv == 2:  # uvicorn
                    if "HTTP/1." in line:
                        continue  # access log: the bulk of a busy server's log
                    h, k = self._on_uvicorn, pos
                else:  # ERROR lines and lines without a level (rarer than INFO and access lines)
                    h = self._error_or_plain(line, pos, lv)
                    if h is None:
                        continue
                    k = pos
                self._hand(rep, h, line, k, n, latin)
                rep = self.report  # a handler may have started a new run's report
        finally:
            self.report.lines = n
            self._pfx, self._plen = pfx, plen

    def _new_writer(self, rep: EngineReport, line: str, n: int, pfx: str, plen: int) -> tuple[str, int, int]:
        """A line that starts with a prefix other than the last one: (the
        prefix, its length, where the text starts), the writer told to
        _on_prefix; a "(" that is no prefix leaves the last one and 0."""
        m = _PFX.match(line)
        if m is None:
            return pfx, plen, 0
        rep.lines = n
        try:
            self._on_prefix(m.group(1), m.group(2), n)
        except Exception as exc:  # noqa: BLE001  never raise on log content; reported
            self._internal_error(exc, n, line)
        return m.group(0), m.end(), m.end()

    def _innermost_writer(self, line: str, pos: int, n: int) -> tuple[int, bool]:
        """Ray forwards a worker's lines through the engine's output, each hop
        adding its prefix: "(EngineCore pid=7) (RayWorkerProc pid=9)
        (Worker_TP1 pid=9) INFO ...". The innermost one wrote the line: told
        to _on_prefix. (where the text starts, whether there was one)."""
        inner = None
        while (m := _PFX.match(line, pos)) is not None:
            inner, pos = m, m.end()
        if inner is None:
            return pos, False
        try:
            self._on_prefix(inner.group(1), inner.group(2), n)
        except Exception as exc:  # noqa: BLE001  never raise on log content; reported
            self._internal_error(exc, n, line)
        return pos, True

    def _error_or_plain(self, line: str, pos: int, lv: int | None) -> Callable[[str, int, int], None] | None:
        """The handler of an ERROR line (lv 3) or a line without a level, or
        None for one that says nothing (a frame, a source line, a tqdm bar)."""
        if lv == 3:
            k = line.find("] ", pos)
            # Traceback frames and source lines inside an ERROR block are
            # indented; only pydantic's "  Value error, ..." /
            # "  Assertion failed, ..." detail lines matter among them.
            if k >= 0 and line.startswith("  ", k + 2) and line[k + 4:k + 5] not in "VA":
                return None
            return self._on_error_line
        # no level: traceback text, bare exception lines, tqdm bars, argparse
        if line.startswith("  ", pos):  # frames, source lines, usage text
            if line[pos + 2:pos + 3] not in "VA":
                return None
        elif not ("rror" in line or "xception" in line or "Capturing" in line
                  or "shards" in line or "died" in line or "o module named" in line
                  or "can't open file" in line):
            return None
        return self._on_plain

    def _hand(self, rep: EngineReport, h: Callable[[str, int, int], None], line: str, k: int, n: int,
              latin: bool) -> None:
        """Hand a line to its handler; in latin-1 mode a non-ASCII line is
        decoded again as UTF-8 first (k moved to the same char)."""
        rep.lines = n
        try:
            if latin and not line.isascii():
                raw = line.encode("latin-1")
                line = raw.decode("utf-8", "replace")
                if len(line) != len(raw):  # multi-byte chars: k to a char offset
                    k = len(raw[:k].decode("utf-8", "replace"))
            h(line, k, n)
        except Exception as exc:  # noqa: BLE001  never raise on log content; reported
            self._internal_error(exc, n, line)

    # -- plumbing -----------------------------------------------------------

    def _fig(self, raw: str | float | None, unit: str, what: str, n: int) -> Any:
        """A figure from this line, range-checked (see _figure); None when dropped."""
        return _figure(raw, unit, what, self.report.notes, n)

    def _set(self, name: str, value: Any, n: int, override: bool = True) -> None:
        """Set a report field (if changed) and count the change."""
        if value is None:
            return
        old = getattr(self.report, name)
        if old == value or (old is not None and not override):
            return
        setattr(self.report, name, value)
        self._changes += 1

    def _platform(self, value: str, n: int, sure: bool = False) -> None:
        value = value.lower()
        if value in ("gpu", "nvidia"):
            value = "cuda"
        if self.report.platform is None or (sure and not self._platform_sure and self.report.platform != value):
            self._set("platform", value, n)
        self._platform_sure = self._platform_sure or sure

    def _advance(self, phase: str, n: int) -> None:
        cur = self.report.phase
        if cur is None or _PHASE_INDEX[phase] > _PHASE_INDEX[cur]:
            self.report.phase = phase
            self._changes += 1

    def _phase_done(self, phase: str, seconds: float | None, n: int) -> None:
        if seconds is not None:
            self.report.phases[phase] = seconds
        self._changes += 1

    def _internal_error(self, exc: BaseException, n: int, text: str) -> None:
        """A handler raised on line `n`: the parser's own bug. Logged with the
        line, counted, and kept in the report for the user to see."""
        self.internal_errors += 1
        shown = (text if isinstance(text, str) else repr(text)).rstrip("\r\n")
        if len(shown) > 200:
            shown = shown[:200] + "…"
        log.warning("log parser bug on line %d: %s: %s | %s", n, type(exc).__name__, exc, shown, exc_info=exc)
        rep = self.report
        rep.parser_error_count += 1
        if len(rep.parser_errors) < PARSER_ERRORS_KEPT:
            rep.parser_errors.append(f"line {n}: {type(exc).__name__}: {exc} | {shown}")
        self._changes += 1

    def _new_run(self, n: int) -> None:
        lines = self.report.lines
        # the parser's own errors are about the parser, not the run: they stay
        self.report = EngineReport(lines=lines, parser_errors=self.report.parser_errors,
                                   parser_error_count=self.report.parser_error_count)
        pfx, plen, rank = self._pfx, self._plen, self._rank
        self._reset_state()
        self._pfx, self._plen, self._rank = pfx, plen, rank
        self._changes += 1

    def _on_prefix(self, role: str, pid_text: str, n: int) -> None:
        """Record the pid of a process role, under the report's keys: "APIServer",
        "EngineCore", "Worker_0", ... ("EngineCore_DP0" -> "EngineCore",
        "VllmWorker-1" / "Worker_TP1" -> "Worker_1"; other ranks keep their name)."""
        pid = self._fig(pid_text, "pid", f"{role} pid", n)
        self._rank = (role, pid) if pid is not None and is_rank(role) else None
        if self._rank is not None and self._rank_names.get(pid) != role:  # prefixes alternate all the time
            self._rank_names[pid] = role
            self.report.ranks = note_rank(self.report.ranks, role, pid)
        if pid is None:
            return
        pids = self.report.pids
        m = _ROLE_NORM.match(role)
        if m:
            role = m.group(1) if m.group(2) is None else f"Worker_{m.group(2)}"
        if pids.get(role) == pid:
            return
        if pid in pids.values():
            return  # same process under a second name ("VllmWorker-0" then "Worker")
        if role == "Worker":
            role = "Worker_0" if "Worker_0" not in pids else f"Worker_{len(pids)}"
        pids[role] = pid
        self._changes += 1

    def _rank_fig(self, line: str, **figures: Any) -> None:
        """Figures a rank logged about itself, kept on that rank (ranks.py)."""
        if self._rank is not None and line[:1] == "(":
            self.report.ranks = note_rank(self.report.ranks, *self._rank, **figures)

    # -- vLLM-format messages: key handlers (line, message start, line no) ----

    def _k_ver(self, line: str, s: int, n: int) -> None:
        self._m_ver(_text(line, s), line, n)

    def _k_args(self, line: str, s: int, n: int) -> None:
        if line.startswith("non-default args: ", s):
            self._m_args(_text(line, s), line, n)

    def _k_arch(self, line: str, s: int, n: int) -> None:
        if line.startswith("Resolved architecture: ", s):
            self._m_arch(_text(line, s), line, n)

    def _k_using(self, line: str, s: int, n: int) -> None:
        self._m_using(_text(line, s), line, n)

    def _k_load(self, line: str, s: int, n: int) -> None:
        if line.startswith(("Loading weights took", "Loading model weights took"), s):
            self._m_wtook(_text(line, s), line, n)
        elif line.startswith("Loading model from", s):
            self._advance("load_weights", n)

    def _k_mltook(self, line: str, s: int, n: int) -> None:
        if line.startswith("Model loading took", s):
            self._m_mltook(_text(line, s), line, n)

    def _k_tctook(self, line: str, s: int, n: int) -> None:
        if line.startswith("torch.compile t", s):
            self._m_tctook(_text(line, s), line, n)

    def _k_init(self, line: str, s: int, n: int) -> None:
        if line.startswith("Initial profiling", s):
            self._m_proftook(_text(line, s), line, n)
        elif line.startswith(("Initializing a V1 LLM engine", "Initializing an LLM engine"), s):
            self._m_init(_text(line, s), line, n)
        elif line.startswith("Initializing model", s):
            self._advance("load_weights", n)

    def _k_inittook(self, line: str, s: int, n: int) -> None:
        if line.startswith("init engine (", s):
            self._m_inittook(_text(line, s), line, n)

    def _k_graphtook(self, line: str, s: int, n: int) -> None:
        if line.startswith("Graph capturing finished", s):
            self._m_graphtook(_text(line, s), line, n)

    def _k_kvmem(self, line: str, s: int, n: int) -> None:
        if line.startswith("Available KV cache memory: ", s):
            self._m_kvmem(_text(line, s), line, n)

    def _k_kvset(self, line: str, s: int, n: int) -> None:
        if line.startswith("Explicitly set (", s):
            self._m_kvset(_text(line, s), line, n)

    def _k_kvsize(self, line: str, s: int, n: int) -> None:
        self._m_kvsize(_text(line, s), line, n)

    def _k_conc(self, line: str, s: int, n: int) -> None:
        self._m_conc(_text(line, s), line, n)

    def _k_blocks(self, line: str, s: int, n: int) -> None:
        self._m_blocks(_text(line, s), line, n)

    def _k_start(self, line: str, s: int, n: int) -> None:
        if line.startswith("Start compiling", s):
            self._advance("compile", n)
        elif line.startswith(("Starting vLLM", "Starting to load model"), s):
            self._m_start(_text(line, s), line, n)

    def _k_engine(self, line: str, s: int, n: int) -> None:
        text = _text(line, s)
        if "Avg prompt throughput: " in text[:40]:
            self._m_stats(text, line, n)
        elif text.startswith(_ERROR_MESSAGES):
            self._error(text, n)

    def _k_stats(self, line: str, s: int, n: int) -> None:
        if line.startswith("Avg prompt throughput: ", s):
            self._m_stats(_text(line, s), line, n)

    def _k_prefixhit(self, line: str, s: int, n: int) -> None:
        self._m_prefixhit(_text(line, s), line, n)

    def _k_compile(self, line: str, s: int, n: int) -> None:
        if line.startswith(("Dynamo bytecode transform", "Warming up model", "Compiling a graph"), s):
            if line.startswith("Warming up model", s):
                ts = _RE_TS.search(line, 0, 120)
                self._warmup_ts = ts.group(1) if ts else None
            self._advance("compile", n)

    def _k_capture(self, line: str, s: int, n: int) -> None:
        self._m_capture(_text(line, s), line, n)

    def _k_platform(self, line: str, s: int, n: int) -> None:
        if line.startswith("Automatically detected platform ", s):
            self._m_platform(_text(line, s), line, n)

    def _k_fail(self, line: str, s: int, n: int) -> None:
        if line.startswith(_ERROR_MESSAGES, s):
            text = _text(line, s)
            if not text.startswith("Worker proc ") or "died" in text:
                self._error(text, n)

    def _k_odd(self, line: str, s: int, n: int) -> None:
        """Messages starting with "[tag] ", a space or box-drawing characters."""
        if line.startswith("[", s):
            if line.startswith("[shutdown]", s):
                if _ENGINE_GONE in line:
                    # vLLM 0.32's cleanup after its engine core died (killed, the
                    # OOM killer): a shutdown it did not choose, so a crash, even
                    # though the API server then exits 0 like a stopped one.
                    self._error(_text(line, s + 11), n, while_stopping=True)
                self._m_shutdown("", line, n)
                return
            k = line.find("] ", s)  # 0.32 puts "[backbone] " before monitor messages
            if k > 0:
                h = self._keys.get(line[k + 2:k + 6])
                if h is not None:
                    h(line, k + 2, n)
            return
        text = _text(line, s)
        if "version " in text or "model " in text:
            self._m_banner(text, line, n)

    def _on_error_line(self, line: str, pos: int, n: int) -> None:
        if self.report.error is not None and not self._err_is_wrapper:
            return  # the root cause is known; the rest of the block is its echo
        if line.startswith("ERROR:", pos):
            # uvicorn's own errors ("[Errno 98] error while attempting to bind ...");
            # its "ERROR: Traceback" / "Exception in ASGI application" say nothing.
            self._error(_text(line, pos + 6), n, known_only=True)
            return
        k = line.find("] ", pos)
        if k < 0:
            self._on_plain(line, pos, n)
            return
        text = _text(line, k + 2)
        if text.startswith(_ERROR_MESSAGES):
            if not text.startswith("Worker proc ") or "died" in text:
                self._error(text, n)
        elif text.startswith(("Value error, ", "Assertion failed, ")):
            self._pydantic(text, n)
        elif _RE_EXC.match(text):
            self._exception(text, n)

    def _on_uvicorn(self, line: str, pos: int, n: int) -> None:
        text = _text(line, pos + 5).strip()
        if text.startswith("Application startup complete"):
            self._ready(n)
        elif text.startswith("Started server process"):
            m = _RE_STARTED.match(text)
            if m and "APIServer" not in self.report.pids:
                self._on_prefix("APIServer", m.group(1), n)
        elif text.startswith("Uvicorn running on"):
            m = _RE_UVICORN_URL.match(text)
            if m:
                self._set("server_url", self._url(m.group(1), n), n, override=False)
        elif text.startswith("Shutting down"):
            self._m_shutdown(text, line, n)
        elif text.startswith("Application shutdown complete") and self._shutting_down:
            self.report.shutdown_complete = True

    def _m_shutdown(self, text: str, line: str, n: int) -> None:
        if not self._shutting_down:
            self._shutting_down = True
            self.report.shutdown_line = n
            self._changes += 1

    def _url(self, url: str, n: int) -> str | None:
        """The server's URL, or None when its port is no port (\"http://inf:-1\")."""
        scheme, sep, rest = url.partition("://")
        hostport = rest.split("/", 1)[0].rpartition("@")[2]
        port = hostport.partition("]")[2] if hostport.startswith("[") else hostport
        port = port.partition(":")[2] if ":" in port else ""
        if not sep or scheme not in ("http", "https") or not hostport.strip(":") or (
                port and _figure(port, "port", "server port") is None):
            _note(self.report.notes, f"line {n}: server URL {url[:60]} has no host and port (1 to 65535) "
                                     "to reach; dropped")
            return None
        return url

    def _version(self, version: str, n: int) -> None:
        rep = self.report
        if rep.vllm_version is not None and (rep.ready or rep.error is not None or rep.phase is not None
                                             or self._shutting_down):
            self._new_run(n)
        if self.report.vllm_version != version:
            self.report.vllm_version = version
            self._changes += 1

    def _m_ver(self, text: str, line: str, n: int) -> None:
        m = _RE_VER.search(text)
        if m:
            self._version(m.group(1), n)
            if m.group(2):
                self._set("model", m.group(2), n, override=False)

    def _m_banner(self, text: str, line: str, n: int) -> None:
        m = _RE_BANNER.match(text)
        if not m:
            return
        if m.group(1) == "version":
            self._version(m.group(2), n)
        else:
            self._set("model", m.group(2), n, override=False)

    def _m_args(self, text: str, line: str, n: int) -> None:
        raw = text[len("non-default args: "):]
        args = self._args_cache.get(raw)
        if args is None:
            args = _parse_args(raw)
            if len(self._args_cache) > 16:  # restarts in one log repeat the same line
                self._args_cache.clear()
            self._args_cache[raw] = args
        rep = self.report
        kept = {}
        for key, value in args.items():
            if _finite(value):
                kept[key] = value
            else:
                _note(rep.notes, f"line {n}: non-default arg {key} = {str(value)[:40]} is not a finite "
                                 "number; dropped")
        args = kept
        rep.non_default_args = args
        self._changes += 1
        model = args.get("model") or args.get("model_tag")
        if isinstance(model, str):
            self._set("model", model, n, override=False)
        bs = args.get("block_size")
        if isinstance(bs, int):
            self._set("block_size", self._fig(bs, "count", "block_size", n), n)
        mml = args.get("max_model_len")
        if isinstance(mml, int) and rep.max_model_len is None:
            self._set("max_model_len", self._fig(mml, "tokens", "max_model_len", n), n)
        kvb = args.get("kv_cache_memory_bytes")
        if isinstance(kvb, int):
            self._kv_bytes = self._fig(kvb, "bytes", "kv_cache_memory_bytes", n) or None
        self._blocks_to_tokens(n)

    def _m_arch(self, text: str, line: str, n: int) -> None:
        self._set("architecture", _word_after(text, ": "), n)

    def _m_using(self, text: str, line: str, n: int) -> None:
        if text.startswith("Using max model len "):
            self._set("max_model_len", self._fig(_word_after(text, " len "), "tokens", "max model len", n), n)
            return
        if "backend" not in text:
            return
        m = _RE_BACKEND.match(text)
        if not m:
            return
        name = m.group(1).strip()
        if any(w in name for w in ("MoE", "Mamba", "SSU", "SSM", "prefill", "custom", "Ray", "OOT")):
            return
        norm = name.upper().replace(" ", "_").replace("-", "_")
        norm = {"FLASH_ATTENTION": "FLASH_ATTN", "FLASHATTENTION": "FLASH_ATTN"}.get(norm, norm)
        self._set("attention_backend", norm, n)
        self.report.attention_implied = False
        if norm in ("FLASH_ATTN", "FLASHINFER", "XFORMERS", "FLASHMLA", "CUTLASS_MLA", "TRITON_MLA"):
            self._platform("cuda", n)
        elif norm in ("CPU_ATTN", "TORCH_SDPA", "CPU_MLA", "AMX_MLA"):
            self._platform("cpu", n)

    def _m_wtook(self, text: str, line: str, n: int) -> None:
        m = _RE_WTOOK.search(text)
        if not m:
            return
        gib = m.group(2) in ("GiB", "GB")  # V0: "Loading model weights took 14.99 GB"
        value = self._fig(m.group(1), "gib" if gib else "seconds", "weights " + ("size" if gib else "load time"), n)
        if value is None:
            return
        if gib:
            self._set("weights_gib", value, n)
            self._rank_fig(line, weights_gib=value)
            self._advance("load_weights", n)
            return
        rep = self.report
        if rep.weights_load_seconds is None:
            self._set("weights_load_seconds", value, n)
            self._advance("load_weights", n)
            self._phase_done("load_weights", value, n)
            self._advance("compile", n)

    def _m_mltook(self, text: str, line: str, n: int) -> None:
        m = _RE_MLTOOK.search(text)
        if not m:
            return
        gib = self._fig(m.group(1), "gib", "weights size", n)
        secs = self._fig(m.group(2), "seconds", "weights load time", n)
        self._set("weights_gib", gib, n)
        self._rank_fig(line, weights_gib=gib)
        self._set("weights_load_seconds", secs, n)
        self._advance("load_weights", n)
        self._phase_done("load_weights", secs, n)
        self._advance("compile", n)

    def _m_tctook(self, text: str, line: str, n: int) -> None:
        m = re.search(r"t(?:ook|akes) (\d+(?:\.\d+)?) s", text)
        if not m:
            return
        secs = self._fig(m.group(1), "seconds", "torch.compile time", n)
        self._set("compile_seconds", secs, n)
        self._advance("compile", n)
        self._phase_done("compile", secs, n)
        self._advance("kv_profiling", n)

    def _m_proftook(self, text: str, line: str, n: int) -> None:
        m = _RE_SECS.search(text)
        rep = self.report
        if rep.phase in (None, "load_weights", "compile") and "compile" not in rep.phases:
            # CPU: compilation ends without a "took" line; the CPU model
            # runner's warm-up (which compiles) is timed by its log stamps.
            secs = _seconds_between(self._warmup_ts, _RE_TS.search(line, 0, 120))
            if secs is not None and rep.compile_seconds is None:
                self._set("compile_seconds", secs, n)
            self._phase_done("compile", secs, n)
        if rep.platform == "cpu" and rep.attention_backend is None:
            # vLLM's CPU build logs no "Using ... backend" line: its decoder
            # attention is CPU_ATTN (the name in its block-size refusal,
            # "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])").
            self._set("attention_backend", "CPU_ATTN", n)
            rep.attention_implied = True
        self._advance("kv_profiling", n)
        secs = self._fig(m.group(1), "seconds", "profiling time", n) if m else None
        if secs is not None:
            rep.phases["kv_profiling"] = secs

    def _m_inittook(self, text: str, line: str, n: int) -> None:
        m = _RE_INIT.search(text)
        if not m:
            return
        self._set("init_engine_seconds", self._fig(m.group(1), "seconds", "init engine time", n), n)
        if m.group(2) and self.report.compile_seconds is None:
            self._set("compile_seconds", self._fig(m.group(2), "seconds", "compilation time", n), n)

    def _m_graphtook(self, text: str, line: str, n: int) -> None:
        m = _RE_GRAPH.search(text)
        if not m:
            return
        secs = self._fig(m.group(1), "seconds", "CUDA graph capture time", n)
        self._set("cuda_graph_seconds", secs, n)
        self._set("cuda_graph_gib", self._fig(m.group(2), "gib", "CUDA graph memory", n), n)
        self._advance("cuda_graphs", n)
        self._phase_done("cuda_graphs", secs, n)
        self._platform("cuda", n)

    def _m_kvmem(self, text: str, line: str, n: int) -> None:
        gib = self._fig(_word_after(text, ": "), "gib", "KV cache memory", n)
        self._set("kv_cache_gib", gib, n)
        self._rank_fig(line, kv_cache_gib=gib)
        self._advance("kv_profiling", n)
        if "gpu_worker" in line:
            self._platform("cuda", n)

    def _m_kvset(self, text: str, line: str, n: int) -> None:
        m = _RE_KVSET.search(text)
        if not m:
            return
        # The log rounds to 2 decimals (64 MiB shows as 0.06); the exact size is
        # in the args when the operator set it.
        gib = (self._kv_bytes / (1 << 30) if self._kv_bytes
               else self._fig(m.group(1), "gib", "KV cache memory", n))
        self._set("kv_cache_gib", gib, n)
        self._rank_fig(line, kv_cache_gib=gib)
        self._advance("kv_profiling", n)
        if "on node" in text or "cpu_worker" in line:
            self._platform("cpu", n)

    def _m_kvsize(self, text: str, line: str, n: int) -> None:
        m = _RE_KVSIZE.match(text)
        if not m:
            return
        device = (m.group(1) or "").upper()
        if device == "CPU":
            self._platform("cpu", n)
        elif device in ("GPU", "CUDA"):
            self._platform("cuda", n)
        tokens = self._fig(m.group(2), "tokens", "KV cache size", n)
        self._set("kv_cache_tokens", tokens, n)
        conc = self._fig(m.group(4), "ratio", "max concurrency", n) if m.group(4) else None
        if conc is not None:
            self._set("max_concurrency", conc, n)
        self._rank_fig(line, kv_cache_tokens=tokens, max_concurrency=conc)
        self._advance("kv_profiling", n)
        self._phase_done("kv_profiling", self.report.phases.get("kv_profiling"), n)

    def _m_conc(self, text: str, line: str, n: int) -> None:
        m = _RE_CONC.match(text)
        if m:
            conc = self._fig(m.group(2), "ratio", "max concurrency", n)
            self._set("max_concurrency", conc, n)
            self._rank_fig(line, max_concurrency=conc)

    def _m_blocks(self, text: str, line: str, n: int) -> None:
        m = _RE_BLOCKS.match(text)
        if not m:
            return
        device = m.group(1).lower()
        if device == "cpu" and m.group(3) is None:
            self._platform("cpu", n)  # V0 CPU backend: its KV cache lives in CPU blocks
        elif device in ("gpu", "cuda"):
            self._platform("cuda", n)
        self._blocks = self._fig(m.group(2), "count", "KV cache blocks", n)
        self._advance("kv_profiling", n)
        self._blocks_to_tokens(n)

    def _blocks_to_tokens(self, n: int) -> None:
        # "# GPU blocks: N" means N x block_size tokens, once the block size is known.
        if self._blocks is not None and self.report.block_size and self.report.kv_cache_tokens is None:
            self._set("kv_cache_tokens", self._fig(self._blocks * self.report.block_size, "tokens",
                                                   "KV cache size (blocks x block size)", n), n)

    def _m_start(self, text: str, line: str, n: int) -> None:
        if text.startswith("Starting to load model"):
            self._advance("load_weights", n)
            return
        m = _RE_URL.match(text)
        if m:
            # Not ready yet: the routes are listed and uvicorn starts after this
            # line; the socket serves once uvicorn says so (_on_uvicorn).
            self._set("server_url", self._url(m.group(1).rstrip("."), n), n)

    def _m_stats(self, text: str, line: str, n: int) -> None:
        values: dict[str, float] = {}
        for key, num in _RE_STATS_KV.findall(text):
            if key in values:
                continue
            unit = ("tps" if key.endswith("throughput") else "percent" if key.endswith(("usage", "rate"))
                    else "count")
            value = self._fig(num, unit, key, n)
            if value is None:
                return  # a sample with a made-up figure is no sample
            values[key] = float(value)
        kv = None
        for key, value in values.items():
            if key.endswith("KV cache usage"):
                kv = value
                break
        ts = _RE_TS.search(line, 0, 120)  # the prefix's "MM-DD HH:MM:SS"
        sample = StatsSample(
            timestamp=ts.group(1) if ts else None,
            prompt_tps=values.get("Avg prompt throughput", 0.0),
            generation_tps=values.get("Avg generation throughput", 0.0),
            running=int(values.get("Running", 0)),
            waiting=int(values.get("Waiting", values.get("Pending", 0))),
            kv_usage_pct=kv if kv is not None else 0.0,
            prefix_hit_pct=values.get("Prefix cache hit rate"),
            line_no=n,
        )
        stats = self.report.stats
        stats.append(sample)
        if not self.report.ready and self.report.error is None:
            self._ready(n)  # only a serving API server logs stats (uvicorn's INFO lines may be off)
        if len(stats) > 2 * MAX_STATS:
            # A server logs a stats line every 10 s, all day: keep the newest
            # MAX_STATS (about 14 h), trimming in halves so appends stay O(1).
            del stats[: len(stats) - MAX_STATS]
        self._changes += 1

    def _m_prefixhit(self, text: str, line: str, n: int) -> None:
        # V0 logs the prefix hit rate on its own line right after the stats line.
        m = re.match(r"Prefix cache hit rate: GPU: (\d+(?:\.\d+)?)%", text)
        pct = self._fig(m.group(1), "percent", "prefix cache hit rate", n) if m else None
        if pct is not None and self.report.stats:
            self.report.stats[-1].prefix_hit_pct = pct

    def _m_init(self, text: str, line: str, n: int) -> None:
        m = re.search(r"\(v([^)\s]+)\)", text[:200])
        if m and self.report.vllm_version is None:
            self._version(m.group(1), n)
        self._set("model", _after(text, "model="), n, override=False)
        device = _after(text, "device_config=")
        if device and device.isalpha():
            self._platform(device, n, sure=True)
        msl = self._fig(_after(text, "max_seq_len="), "tokens", "max_seq_len", n)
        if msl:
            self._set("max_model_len", msl, n)
        bs = self._fig(_after(text, " block_size="), "count", "block_size", n)
        if bs and self.report.block_size is None:
            self._set("block_size", bs, n)
            self._blocks_to_tokens(n)
        self._advance("load_weights", n)

    def _m_capture(self, text: str, line: str, n: int) -> None:
        if "graph" in text.lower():
            self._advance("cuda_graphs", n)
            self._platform("cuda", n)

    def _m_platform(self, text: str, line: str, n: int) -> None:
        value = (_word_after(text, "platform ") or "").rstrip(".")
        if value.isalpha():
            self._platform(value, n, sure=True)

    # -- other lines ------------------------------------------------------------

    def _on_plain(self, line: str, pos: int, n: int) -> None:
        """Lines without a log level: bare exception lines, argparse errors, tqdm bars."""
        text = _text(line, pos)
        if not text:
            return
        if "Capturing" in text or "shards" in text:
            self._progress(text, n)
        elif self.report.error is not None and not self._err_is_wrapper:
            return  # the root cause is known; the rest are its echoes
        elif text.startswith(("Value error, ", "Assertion failed, ")):
            self._pydantic(text, n)
        elif _RE_EXC.match(text):
            self._exception(text, n)
        elif _RE_ARGPARSE.match(text) or _RE_INTERPRETER.match(text):
            self._error(text, n)
        elif "died unexpectedly" in text:
            self._error(text, n)

    def _progress(self, text: str, n: int) -> None:
        head = text[:40]
        if "Capturing" in head and "raph" in head:  # CUDA graphs / cudagraph shapes
            self._advance("cuda_graphs", n)
            self._platform("cuda", n)
        elif "checkpoint shards" in head:
            self._advance("load_weights", n)

    def _ready(self, n: int) -> None:
        rep = self.report
        self._advance("ready", n)
        if rep.ready:
            return
        rep.ready = True
        if rep.error is not None:
            # It started after all: whatever was logged before was not fatal.
            rep.error = None
            self._err_is_wrapper = False
        self._changes += 1

    # -- errors -------------------------------------------------------------------

    def _exception(self, text: str, n: int) -> None:
        m = _RE_EXC.match(text)
        if not m:
            return
        etype = m.group(1)
        if etype.rsplit(".", 1)[-1] in _IGNORED_EXC:
            return
        message = (m.group(2) or "").strip()
        if etype.endswith("ValidationError") and "validation error" in message:
            self._pyd_pending = n  # the cause is on the next lines ("Value error, ...")
        self._error(text, n)

    def _pydantic(self, text: str, n: int) -> None:
        text = _RE_PYD_TAIL.sub("", text).strip()
        self._pyd_pending = None
        self._error(text, n)

    def _error(self, message: str, n: int, known_only: bool = False, while_stopping: bool = False) -> None:
        rep = self.report
        if (self.start_failed_line is None and not rep.ready and not self._shutting_down
                and any(m in message[:120] for m in _START_FAILED)):
            self.start_failed_line = n
        if rep.error is not None and not self._err_is_wrapper:
            return  # the root cause is known; the rest are its echoes
        if self._shutting_down and rep.error is None and not while_stopping:
            return  # noise while stopping (cancelled tasks, closed pipes)
        message = message.strip()
        dropped: list[str] = []  # notes on figures left out, kept only with the error
        kind, est, detail = classify_error(message, dropped, n)
        if known_only and kind is ErrorKind.OTHER:
            return
        if rep.ready and kind not in _FATAL_AFTER_READY:
            return  # a failed request, not a failed server
        wrapper = _is_wrapper(kind, message)
        if rep.error is not None and not (self._err_is_wrapper and not wrapper):
            return  # keep the first root cause; only a wrapper gives way, to a real cause
        rep.error = EngineError(kind=kind, message=message, line_no=n, estimated_max_model_len=est,
                                detail=detail)
        for note in dropped:
            _note(rep.notes, note)
        self._err_is_wrapper = wrapper
        if kind is ErrorKind.PORT_IN_USE and rep.ready:
            rep.ready = False  # old uvicorn says "startup complete" before it fails to bind
        if rep.platform is None and (kind is ErrorKind.CUDA_OOM or " for cuda " in message):
            self._platform("cuda", n)
        self._changes += 1


# --------------------------------------------------------------------------- whole-log helpers

_ANSI_B = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def parse_lines(lines: Iterable[str | bytes]) -> EngineReport:
    """Parse an iterable of lines (str or bytes, with or without newlines)."""
    parser = LogParser()

    def as_text(items: Iterable[str | bytes]) -> Iterable[str]:
        for item in items:
            yield item.decode("utf-8", errors="replace") if isinstance(item, bytes) else item

    batch: list[str] = []
    for line in as_text(lines):
        batch.append(line)
        if len(batch) >= 4096:
            parser.feed_many(batch)
            batch = []
    if batch:
        parser.feed_many(batch)
    return parser.report


def parse_file(path: str | os.PathLike[str], max_line: int = 65536, chunk_size: int = 4 << 20,
               *, parser: LogParser | None = None) -> EngineReport:
    """Parse a whole log file. Streams in chunks: memory stays bounded by
    chunk_size plus max_line even for a file that is one 10 MB line.

    Lines are split on \\n only (line numbers match `grep -n`); a line holding
    \\r progress redraws is parsed as the last redraw. Raises OSError if the
    file cannot be read; never raises on its content. Pass a fresh `parser`
    to read what the report does not carry (its `internal_errors`, the
    exceptions it swallowed: bench/reliability.py counts them).
    """
    parser = parser if parser is not None else LogParser()
    parser._latin1 = True
    with open(path, "rb") as f:
        rest = b""
        cut = False  # inside an over-long line: drop bytes until its newline
        while True:
            chunk = f.read(chunk_size)
            if not chunk:
                break
            if cut:
                k = chunk.find(b"\n")
                if k < 0:
                    continue
                chunk = chunk[k + 1:]
                cut = False
            data = rest + chunk if rest else chunk
            k = data.rfind(b"\n")
            if k < 0:
                rest = data
            else:
                rest = data[k + 1:]
                _feed_block(parser, data[:k])
            if len(rest) > max_line:
                # Keep the head of the monster line, finish it as a line of its own.
                _feed_block(parser, rest[:max_line])
                rest = b""
                cut = True
        if rest:
            _feed_block(parser, rest)
    return parser.report


def _feed_block(parser: LogParser, block: bytes) -> None:
    if b"\x1b" in block:
        block = _ANSI_B.sub(b"", block)
    try:
        parser._scan(block.decode("latin-1").split("\n"))
    except Exception as exc:  # noqa: BLE001  the contract: never raise on log content; reported
        parser._internal_error(exc, parser.report.lines, "")
