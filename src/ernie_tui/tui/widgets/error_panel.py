"""The crash panel: the classified error and its root-cause line, in a red
box across the whole screen that cannot be missed. Hidden while all is well.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

KIND_WORDS = {
    "kv_cache_too_small": "KV cache too small for max_model_len",
    "no_cache_memory": "no memory left for the KV cache",
    "insufficient_free_memory": "not enough free memory for the requested utilization",
    "max_model_len_too_large": "max_model_len above the model's limit",
    "tp_exceeds_gpus": "tensor parallel size exceeds the visible GPUs",
    "heads_not_divisible": "attention heads not divisible by tensor parallel size",
    "block_size_unsupported": "block size not supported by any attention backend",
    "unknown_argument": "unknown vLLM argument",
    "port_in_use": "port already in use",
    "cuda_oom": "CUDA out of memory",
    "missing_module": "a Python module is missing",
    "engine_dead": "the engine died",
    "illegal_instruction": "a worker hit an instruction this CPU refuses",
    "other": "error",
}


class ErrorPanel(Static):
    """Shows an EngineError (and, when known, the fix) or nothing."""

    def __init__(self, *, id: str | None = None):
        super().__init__("", id=id)
        self.error = None
        self.exit_code: int | None = None
        self.fix_text: str | None = None
        self.mode = "control"
        self.fixable = False
        self.title: str | None = None  # the diagnosis' one-line title, when there is one
        self.leftovers = 0  # engine processes the crashed server left running, ended since

    def show_error(self, error, exit_code: int | None = None, fix_text: str | None = None,
                   mode: str = "control", leftovers: int | None = None) -> None:
        self.error, self.exit_code, self.fix_text, self.mode = error, exit_code, fix_text, mode
        if leftovers is not None:
            self.leftovers = leftovers
        self.set_class(error is not None, "-visible")
        if error is None:
            self.leftovers = 0
            self.update("")
            return
        kind = getattr(error.kind, "value", str(error.kind))
        head = [("✖ ", "bold"), (" CRASHED " if mode != "replay" else " FAILED ", "bold reverse"),
                ("  ", ""), (kind, "bold")]
        if exit_code is not None:
            head.append((f" · exit code {exit_code}", ""))
        head.append((f" — {self.title or KIND_WORDS.get(kind, '')}", ""))
        lines = [Content.assemble(*head)]
        lines.append(Content.assemble(("root cause  ", "dim"), (error.message, "bold")))
        extra: list[tuple[str, str]] = []
        if error.line_no:
            extra.append((f"log line {error.line_no}, marked in the log pane (j jumps to it)", ""))
        if error.estimated_max_model_len:
            extra.append((f"  · vLLM estimates max_model_len ≤ {error.estimated_max_model_len:,}", "bold"))
        if extra:
            lines.append(Content.assemble(("where       ", "dim"), *extra))
        if self.leftovers:
            n = self.leftovers
            lines.append(Content.assemble(("cleanup     ", "dim"),
                                          f"ended {n} engine process{'es' if n != 1 else ''} the server left "
                                          "running (they held memory and served nobody)"))
        if fix_text:
            label = "fix         " if self.fixable else "what to do  "
            lines.append(Content.assemble((label, "dim"), (fix_text, "bold")))
        if mode == "control":
            keys = "f save the fix as NAME-fixed and relaunch · " if fix_text and self.fixable else ""
            lines.append(Content.assemble(("keys        ", "dim"),
                                          f"{keys}r restart · 1-9 switch preset · e edit presets"))
        self.update(Content("\n").join(lines))
