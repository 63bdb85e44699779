"""Why a vLLM server failed: the error kinds and the classifier.

classify_error maps one root-cause message (an exception line of the log)
to an ErrorKind, vLLM's own estimate of the max model len that would fit,
and the figures the message states. The log parser picks which message is
the root cause; preflight and the diagnosis use the same kinds.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Callable

from ernie_tui.engine_ctl.logs.figures import _figure


# Kinds and severities are StrEnums: code compares members, while JSON,
# run records and printed text see the same strings as before.
class ErrorKind(StrEnum):
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    NO_CACHE_MEMORY = "no_cache_memory"
    INSUFFICIENT_FREE_MEMORY = "insufficient_free_memory"
    MAX_MODEL_LEN_TOO_LARGE = "max_model_len_too_large"
    TP_EXCEEDS_GPUS = "tp_exceeds_gpus"
    HEADS_NOT_DIVISIBLE = "heads_not_divisible"
    BLOCK_SIZE_UNSUPPORTED = "block_size_unsupported"
    UNKNOWN_ARGUMENT = "unknown_argument"
    PORT_IN_USE = "port_in_use"
    CUDA_OOM = "cuda_oom"
    MISSING_MODULE = "missing_module"
    ILLEGAL_INSTRUCTION = "illegal_instruction"
    ENGINE_DEAD = "engine_dead"
    OTHER = "other"


class Severity(StrEnum):
    """How bad a preflight problem is: an ERROR means vLLM would not start."""

    ERROR = "error"
    WARNING = "warning"


_HANDLER_TEXT_CAP = 65536  # handlers look at most this much of one line


# --------------------------------------------------------------------------- error classification

_CLASSIFIERS: list[tuple[re.Pattern[str], ErrorKind]] = [
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"), ErrorKind.CUDA_OOM),
    (re.compile(r"estimated maximum model length is|To serve at least one request with the model's max seq len"
                r"|is larger than the maximum number of tokens that can be stored in KV cache"),
     ErrorKind.KV_CACHE_TOO_SMALL),
    (re.compile(r"No available memory for the cache blocks"), ErrorKind.NO_CACHE_MEMORY),
    (re.compile(r"on startup is less than desired \w+ memory utilization|Error in memory profiling"),
     ErrorKind.INSUFFICIENT_FREE_MEMORY),
    (re.compile(r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len"),
     ErrorKind.MAX_MODEL_LEN_TOO_LARGE),
    (re.compile(r"World size \(\d+\) is larger than the number of available GPUs"
                r"|number of required GPUs exceeds the total number of available GPUs"),
     ErrorKind.TP_EXCEEDS_GPUS),
    (re.compile(r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size"),
     ErrorKind.HEADS_NOT_DIVISIBLE),
    (re.compile(r"No common block size for|share no supported KV cache block size"
                r"|No valid attention backend found.*block_size not supported"
                r"|argument --block-size: invalid choice"), ErrorKind.BLOCK_SIZE_UNSUPPORTED),
    (re.compile(r"unrecognized arguments: "), ErrorKind.UNKNOWN_ARGUMENT),
    (re.compile(r"[Aa]ddress already in use|\[Errno (?:98|48|10048)\]"), ErrorKind.PORT_IN_USE),
    (re.compile(r"ModuleNotFoundError|No module named "), ErrorKind.MISSING_MODULE),
    # A worker killed by SIGILL: vLLM prints the negative signal number as its
    # exit code. Before ENGINE_DEAD, which the same line would match.
    (re.compile(r"died unexpectedly \(exit code: -4\)|Illegal instruction|\bSIGILL\b"),
     ErrorKind.ILLEGAL_INSTRUCTION),
    (re.compile(r"EngineDeadError|Engine core proc \S+ died|died unexpectedly|exited unexpectedly"
                r"|EngineCore encountered"
                r"|Engine core initialization failed|WorkerProc initialization failed|EngineCore failed to start"
                r"|WorkerProc hit an exception|WorkerProc failed to start|Engine process failed to start"
                r"|AsyncLLM output_handler failed"), ErrorKind.ENGINE_DEAD),
]


def classify_error(message: str, notes: list[str] | None = None,
                   line_no: int | None = None) -> tuple[ErrorKind, int | None, dict[str, Any]]:
    """Map one root-cause message to (kind, vLLM's estimated max model len, detail).
    Figures outside any physical range are left out, with a note in `notes`."""
    text = message[:_HANDLER_TEXT_CAP]
    if "Worker failed with error '" in text:
        # EngineCore's wrapper quotes the worker's message: classify that.
        inner = text.split("Worker failed with error '", 1)[1].rsplit("'", 1)[0]
        inner_kind, inner_est, inner_detail = classify_error(inner, notes, line_no)
        if inner_kind is not ErrorKind.OTHER and inner_kind is not ErrorKind.ENGINE_DEAD:
            return inner_kind, inner_est, inner_detail
    kind = ErrorKind.OTHER
    for rx, k in _CLASSIFIERS:
        if rx.search(text):
            kind = k
            break
    figures = _Figures(notes, line_no)
    read = _DETAIL_READERS.get(kind)
    est = read(text, figures) if read is not None else None
    return kind, est, figures.detail


class _Figures:
    """The figures read from one message: each checked against its physical
    range (_figure), an out-of-range one left out with a note."""

    def __init__(self, notes: list[str] | None, line_no: int | None) -> None:
        self.notes, self.line_no = notes, line_no
        self.detail: dict[str, Any] = {}

    def value(self, raw: str | None, unit: str, name: str) -> int | float | None:
        return _figure(raw, unit, name, self.notes, self.line_no)

    def put(self, key: str, raw: str | None, unit: str) -> None:
        value = self.value(raw, unit, key.replace("_", " "))
        if value is not None:
            self.detail[key] = value


# Each kind's figures, read from its message; a reader returns vLLM's
# estimated max model len where the message gives one.

def _read_kv_cache_too_small(text: str, fig: _Figures) -> int | None:
    m = re.search(r"estimated maximum model length is (\d+)", text)
    if not m:  # V0 wording states how many tokens fit; that is the usable max length
        m = re.search(r"stored in KV cache \((\d+)\)", text)
    fits = fig.value(m.group(1), "tokens", "estimated max model len") if m else None
    est = int(fits) if fits is not None else None
    m = re.search(r"max seq len \((\d+)\)", text)
    if m:
        fig.put("max_model_len", m.group(1), "tokens")
    m = re.search(r"\((\d+(?:\.\d+)?) GiB KV cache is needed"
                  r".*available KV cache memory \((\d+(?:\.\d+)?) GiB\)", text)
    if m:
        fig.put("needed_gib", m.group(1), "gib")
        fig.put("available_gib", m.group(2), "gib")
    return est


def _read_insufficient_free_memory(text: str, fig: _Figures) -> None:
    m = re.search(r"\((\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) GiB\) on startup is less than desired \w+ memory utilization "
                  r"\((\d+(?:\.\d+)?), (\d+(?:\.\d+)?) GiB\)", text)
    if m:
        fig.put("free_gib", m.group(1), "gib")
        fig.put("total_gib", m.group(2), "gib")
        fig.put("utilization", m.group(3), "fraction")
        fig.put("requested_gib", m.group(4), "gib")


def _read_max_model_len_too_large(text: str, fig: _Figures) -> None:
    m = re.search(r"max_model_len \((\d+)\) is greater than the derived max_model_len "
                  r"\((?:[a-z_ ]+=)?(\d+)(?:\.\d+)?", text)  # the key vLLM took it from varies
    if m:
        fig.put("requested", m.group(1), "tokens")
        fig.put("derived", m.group(2), "tokens")


def _read_tp_exceeds_gpus(text: str, fig: _Figures) -> None:
    m = re.search(r"World size \((\d+)\) is larger than the number of available GPUs(?: \((\d+)\))?", text)
    if m:
        fig.put("world_size", m.group(1), "count")
        fig.put("available_gpus", m.group(2), "count")


def _read_heads_not_divisible(text: str, fig: _Figures) -> None:
    m = re.search(r"attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)", text)
    if m:
        fig.put("heads", m.group(1), "count")
        fig.put("tensor_parallel_size", m.group(2), "count")


def _read_block_size_unsupported(text: str, fig: _Figures) -> None:
    m = (re.search(r"No common block size for (\d+)", text) or re.search(r"block_size=(\d+)", text)
         or re.search(r"--block-size: invalid choice: '?(\d+)", text))
    if m:
        fig.put("block_size", m.group(1), "count")
    m = re.search(r"No common block size for \d+ \((.*)\)", text)
    if m:
        fig.detail["supported"] = m.group(1)


def _read_unknown_argument(text: str, fig: _Figures) -> None:
    args = text.split("unrecognized arguments: ", 1)[1].split()
    if args:
        fig.detail["argument"] = args[0]
        fig.detail["arguments"] = args


def _read_port_in_use(text: str, fig: _Figures) -> None:
    m = re.search(r"address \('([^']*)', (\d+)\)", text)
    if m:
        fig.detail["host"] = m.group(1)
        fig.put("port", m.group(2), "port")


def _read_cuda_oom(text: str, fig: _Figures) -> None:
    m = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", text)
    if m:
        fig.detail["tried_to_allocate"] = m.group(1)


def _read_missing_module(text: str, fig: _Figures) -> None:
    m = re.search(r"No module named '?([\w.]+)", text)
    if m:
        fig.detail["module"] = m.group(1)


_DETAIL_READERS: dict[ErrorKind, Callable[[str, _Figures], int | None]] = {
    ErrorKind.KV_CACHE_TOO_SMALL: _read_kv_cache_too_small,
    ErrorKind.INSUFFICIENT_FREE_MEMORY: _read_insufficient_free_memory,
    ErrorKind.MAX_MODEL_LEN_TOO_LARGE: _read_max_model_len_too_large,
    ErrorKind.TP_EXCEEDS_GPUS: _read_tp_exceeds_gpus,
    ErrorKind.HEADS_NOT_DIVISIBLE: _read_heads_not_divisible,
    ErrorKind.BLOCK_SIZE_UNSUPPORTED: _read_block_size_unsupported,
    ErrorKind.UNKNOWN_ARGUMENT: _read_unknown_argument,
    ErrorKind.PORT_IN_USE: _read_port_in_use,
    ErrorKind.CUDA_OOM: _read_cuda_oom,
    ErrorKind.MISSING_MODULE: _read_missing_module,
}
