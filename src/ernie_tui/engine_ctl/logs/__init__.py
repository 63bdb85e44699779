"""Reading vLLM's log: following llm.log as it grows (logtail), opening a big log
at its last start (logopen), turning lines into a live startup report
(logparse, report), classifying failures (errors), per-rank processes
(ranks) and the sanity of numbers read (figures).

Imports nothing else of engine_ctl (units aside): a log can be read with no
server, no GPU and no network.
"""
