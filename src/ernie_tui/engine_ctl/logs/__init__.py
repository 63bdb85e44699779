"""Reading vLLM's log: following llm.log as it grows (logtail), opening a big log
at its last start (logopen), turning lines into a live startup report
(logparse, report), classifying failures (errors), per-rank processes
(ranks) and the sanity of numbers read (figures).

Imports nothing else of engine_ctl (units aside): a log can be read with no
server, no GPU and no network.
"""

from ernie_tui.engine_ctl.logs.errors import ErrorKind, Severity, classify_error
from ernie_tui.engine_ctl.logs.logopen import LineIndex, Section, read_existing
from ernie_tui.engine_ctl.logs.logparse import LogParser, parse_file
from ernie_tui.engine_ctl.logs.logtail import LogTailer
from ernie_tui.engine_ctl.logs.ranks import describe_rank, parallel_ranks
from ernie_tui.engine_ctl.logs.report import PHASES, EngineError, EngineReport, ReportSnapshot, parser_error_notice

__all__ = [
    "EngineError",
    "EngineReport",
    "ErrorKind",
    "LineIndex",
    "LogParser",
    "LogTailer",
    "PHASES",
    "ReportSnapshot",
    "Section",
    "Severity",
    "classify_error",
    "describe_rank",
    "parallel_ranks",
    "parse_file",
    "parser_error_notice",
    "read_existing",
]
