"""ernie-tui: a terminal dashboard for tuning a vLLM server live."""

__version__ = "0.1.0"
