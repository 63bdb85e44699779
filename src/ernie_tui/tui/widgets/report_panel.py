"""The startup report: the figures vLLM printed while starting, and a progress
bar through the phases (load weights → compile → KV profiling → CUDA graphs
→ ready) with each phase's seconds as they happen."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import Label, ProgressBar, Static

from ernie_tui.engine_ctl.logs import PHASES, parallel_ranks, parser_error_notice
from ernie_tui.tui import format as fmt

PHASE_LABEL = {
    "load_weights": "weights",
    "compile": "compile",
    "kv_profiling": "KV profile",
    "cuda_graphs": "CUDA graphs",
    "ready": "ready",
}
# Args the header or other rows already show, left out of the args row.
_HIDDEN_ARGS = {"host", "port", "model", "served_model_name"}


def _row(label: str, *value: str | tuple[str, str]) -> Content:
    return Content.assemble((f"{label:<12}", "dim"), *value)


def _model_row(r) -> Content:
    model = r.model or "–"
    return _row("model", (model.rstrip("/").rsplit("/", 1)[-1], "bold"), (f"  {r.architecture or ''}", "dim"))


def _args_row(r) -> Content:
    """The non-default args, less those the other rows show."""
    args = {k: v for k, v in (r.non_default_args or {}).items() if k not in _HIDDEN_ARGS}
    args_text = " ".join(f"{k}={fmt.size_arg(v)}" for k, v in args.items()) or "(defaults)"
    return _row("args", args_text)


def _layout_row(r) -> Content:
    """Block size, max model len and the attention backend."""
    return _row("block · len", (fmt.integer(r.block_size), "bold"), " · ",
                (fmt.integer(r.max_model_len), "bold"),
                ("   attention ", "dim"), (r.attention_backend or "–", "bold"),
                (" (implied on CPU)" if r.attention_implied else "", "dim"))


def _weights(r) -> str:
    """The weights' size and load time, whichever the log gave."""
    if r.weights_gib is not None:
        weights = fmt.gib(r.weights_gib)
        if r.weights_load_seconds is not None:
            weights += f", loaded in {fmt.seconds(r.weights_load_seconds)}"
        return weights
    if r.weights_load_seconds is not None:
        return f"loaded in {fmt.seconds(r.weights_load_seconds)} (size not logged)"
    return "–"


def _concurrency_row(r) -> Content:
    conc = f"{r.max_concurrency:.2f}×" if r.max_concurrency is not None else "–"
    at = f" at {fmt.integer(r.max_model_len)} tokens/request" if r.max_model_len and r.max_concurrency else ""
    return _row("concurrency", (conc, "bold"), at)


def _graphs_row(r) -> Content:
    """CUDA graphs' capture time and memory, and the engine's init time."""
    graphs = "n/a on CPU" if r.platform == "cpu" else (
        f"{fmt.seconds(r.cuda_graph_seconds)}, {fmt.gib(r.cuda_graph_gib)}"
        if r.cuda_graph_seconds is not None else "–")
    return _row("CUDA graphs", graphs, ("   init engine ", "dim"), fmt.seconds(r.init_engine_seconds))


class ReportPanel(Vertical):
    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._composed = False
        self._report = None
        self._state = "stopped"
        self._kv_metrics: int | None = None
        self._estimate = None
        self._estimate_for: str | None = None
        self._unreachable: list[tuple[str, str]] | None = None
        self._no_log: str | None = None  # attached without a log: how to give one

    def compose(self) -> ComposeResult:
        yield Static("", id="report-body")
        with Horizontal(id="phase-row"):
            yield Label("phases ", id="phase-label")
            yield ProgressBar(total=len(PHASES), show_eta=False, show_percentage=False, id="phase-bar")
            yield Label("", id="phase-count")
        yield Static("", id="phase-line")

    def on_mount(self) -> None:
        self._composed = True
        self._redraw()

    def set_report(self, report) -> None:
        self._report = report
        self._redraw()

    def set_unreachable(self, lines: list[tuple[str, str]] | None) -> None:
        """(text, style) lines for a server that does not answer, shown
        instead of the report; None: the report again."""
        if lines != self._unreachable:
            self._unreachable = lines
            self._redraw()

    def set_no_log(self, hint: str | None) -> None:
        """Attached with no log to read (`--attach URL` alone): the report
        cannot fill in, so say so and how to give one (`hint`), instead of
        promising it fills in as vLLM starts."""
        if hint != self._no_log:
            self._no_log = hint
            self._redraw()

    def set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self._redraw()

    def set_estimate(self, estimate, name: str) -> None:
        """Preflight's capacity estimate for the preset being launched."""
        self._estimate, self._estimate_for = estimate, name
        self._redraw()

    def set_metrics_kv_tokens(self, tokens: int | None) -> None:
        if tokens != self._kv_metrics:
            self._kv_metrics = tokens
            self._redraw()

    # -- drawing ------------------------------------------------------------
    def _put(self, widget, content, layout: bool = True) -> None:
        """Update only on change (the report is re-sent whenever the log
        moves), and ask for a layout pass only when the text's shape changed:
        more or fewer rows, or a different width for an auto-width label."""
        text = str(content)
        key = (text, repr(getattr(content, "spans", None)))
        if getattr(widget, "_shown_key", None) == key:
            return
        width = widget.styles.width
        shape = (text.count("\n"), len(text) if width is not None and width.is_auto else 0)
        needs_layout = layout and shape != getattr(widget, "_shown_shape", None)
        widget._shown_key, widget._shown_shape = key, shape
        widget.update(content, layout=needs_layout)

    def _redraw(self) -> None:
        if not self._composed:
            return
        r = self._report
        body = self.query_one("#report-body", Static)
        no_report = r is None or r.lines == 0
        body.set_class(self._unreachable is not None or (no_report and self._no_log is not None), "-wrap")
        if self._unreachable is not None and (r is None or r.lines == 0 or self._state != "ready"):
            self._put(body, Content("\n").join([Content.styled(text, style) for text, style in self._unreachable]),
                      layout=False)
            self._phases(None)
            return
        if no_report and self._no_log is not None:
            self._put(body, Content.assemble(("No startup report: no log was given.", "bold $warning"), "\n",
                                             (self._no_log, "")), layout=False)
            self._phases(None)
            return
        if no_report:
            self._put(body, Content.from_markup(
                "[dim]No startup report yet.[/]\n"
                "[dim]It fills in from the server's log as vLLM starts:[/]\n"
                "[dim]args, attention backend, weights, KV cache, concurrency.[/]"), layout=False)
            self._phases(None)
            return
        # No layout pass: the body has a fixed height (1fr of the panel, the
        # stylesheet), so more or fewer rows never move anything else. With
        # height auto, a log flood that keeps changing the report (4 times a
        # second) reflowed the whole screen twice per change: most of the
        # dashboard's layout time under the flood (docs/lab/benchmarks/tui-overhead.md).
        self._put(body, Content("\n").join(self._report_rows(r)), layout=False)
        self._phases(r)

    def _report_rows(self, r) -> list[Content]:
        """The report's rows, top to bottom; the estimate and the parser's
        notice only when there is one."""
        rows = [_model_row(r), _args_row(r), _layout_row(r), _row("weights", _weights(r)), self._kv_row(r),
                _concurrency_row(r), _graphs_row(r)]
        for i, rank in enumerate(parallel_ranks(getattr(r, "ranks", []))):
            # Every rank of a parallel server with its pid and its own figures.
            rows.append(_row("ranks" if i == 0 else "", (rank.name, "bold"), (f" pid {rank.pid}", "dim"),
                             *self._rank_figures(rank)))
        if self._estimate is not None:
            rows.append(self._estimate_row(r, self._estimate))
        notice = parser_error_notice(r)
        if notice:  # the log parser's own bug: a field may be missing above
            rows.append(_row("parser", (notice, "bold $error")))
        return rows

    def _kv_row(self, r) -> Content:
        """The KV cache the log gave, and whether /metrics agrees with it."""
        if r.kv_cache_gib is None and r.kv_cache_tokens is None:
            kv_parts: list[str | tuple[str, str]] = [("– (after KV profiling)", "dim")]
        else:
            kv_parts = [(fmt.gib(r.kv_cache_gib), "bold"), " = ",
                        (f"{fmt.integer(r.kv_cache_tokens)} tokens", "bold $accent")]
        if self._kv_metrics is not None and r.kv_cache_tokens is not None:
            if self._kv_metrics == r.kv_cache_tokens:
                kv_parts.append(("  ✔ /metrics agrees", "$success"))
            else:
                kv_parts.append((f"  ≠ /metrics {self._kv_metrics:,}", "bold $error"))
        return _row("KV cache", *kv_parts)

    @staticmethod
    def _estimate_row(r, est) -> Content:
        """Preflight's estimate, and how far it was from what the log says."""
        parts: list[str | tuple[str, str]] = [(f"{fmt.gib(est.kv_cache_gib)} = {est.kv_cache_tokens:,} tokens, "
                                               f"{est.max_concurrency:.2f}×", "")]
        if r.kv_cache_tokens and est.kv_cache_tokens:
            err = (est.kv_cache_tokens - r.kv_cache_tokens) / r.kv_cache_tokens * 100
            parts.append((f"  {err:+.1f}% vs the log", "$success" if abs(err) <= 10 else "bold $warning"))
        parts.append(("  (preflight)", "dim"))
        return _row("estimate", *parts)

    @staticmethod
    def _rank_figures(rank) -> list[str | tuple[str, str]]:
        parts: list[str | tuple[str, str]] = []
        if rank.kv_cache_gib is not None or rank.kv_cache_tokens is not None:
            parts += ["  KV ", (fmt.gib(rank.kv_cache_gib), "bold")]
            if rank.kv_cache_tokens is not None:
                parts += [" = ", (f"{fmt.integer(rank.kv_cache_tokens)} tokens", "bold $accent")]
        if rank.max_concurrency is not None:
            parts.append(f"  {rank.max_concurrency:.2f}×")
        if rank.weights_gib is not None:
            parts.append(("  weights " + fmt.gib(rank.weights_gib), "dim"))
        return parts

    def _phases(self, r) -> None:
        bar = self.query_one("#phase-bar", ProgressBar)
        line = self.query_one("#phase-line", Static)
        count = self.query_one("#phase-count", Label)
        if r is None:
            if bar.progress != 0:
                bar.update(progress=0)
            self._put(count, "")
            self._put(line, Content.assemble(*[(f"· {PHASE_LABEL[p]}  ", "dim") for p in PHASES]), layout=False)
            return
        reached = PHASES.index(r.phase) if r.phase in PHASES else -1
        if r.ready:
            reached = len(PHASES) - 1
        failed = r.error is not None or self._state == "crashed"
        done = reached + 1 if (r.ready or failed) else reached
        done = max(done, 0)
        if bar.progress != done:
            bar.update(progress=done)
        self._put(count, f" {done}/{len(PHASES)}")
        parts: list[tuple[str, str]] = []
        failure_marked = False
        for i, p in enumerate(PHASES):
            secs = r.phases.get(p)
            label = PHASE_LABEL[p]
            if p == "cuda_graphs" and r.platform == "cpu":
                parts.append(("– graphs n/a ", "dim"))
                continue
            is_done = i < reached or (i == reached and (r.ready or secs is not None))
            if is_done:
                t = f" {fmt.seconds(secs)}" if secs is not None else ""
                parts.append((f"✔ {label}{t} ", "$success"))
            elif failed and not failure_marked:
                failure_marked = True  # the phase it died in
                parts.append((f"✖ {label} ", "bold $error"))
            elif i == reached and not failed:
                parts.append((f"◐ {label}… ", "bold $warning"))
            else:
                parts.append((f"· {label} ", "dim"))
        self._put(line, Content.assemble(*parts), layout=False)
