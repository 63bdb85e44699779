"""Reading vLLM's log: following llm.log as it grows (logtail), opening a big log
at its last start (logopen), turning lines into a live startup report
(logparse, report), classifying failures (errors), per-rank processes
(ranks) and the sanity of numbers read (figures).

Imports nothing else of engine_ctl (units aside): a log can be read with no
server, no GPU and no network.
"""

from ernie_tui.engine_ctl.logs.errors import ErrorKind, Severity
from ernie_tui.engine_ctl.logs.logparse import LogParser, parse_file
from ernie_tui.engine_ctl.logs.logtail import LogTailer
from ernie_tui.engine_ctl.logs.ranks import describe_rank, parallel_ranks
from ernie_tui.engine_ctl.logs.report import PHASES, EngineReport, parser_error_notice

__all__ = [
    "EngineReport",
    "ErrorKind",
    "LogParser",
    "LogTailer",
    "PHASES",
    "Severity",
    "describe_rank",
    "parallel_ranks",
    "parse_file",
    "parser_error_notice",
]
