"""A tune's section of the report page: the answer on top (the best
setting against BASE, the verdict with its interval or "within noise",
what was measured and why the search stopped), its three pictures
(tune_figures), every trial in a table with preflight's reasons, and links
to the capacity curves drawn further down the page (or why one is not)."""

from __future__ import annotations

from html import escape
from typing import Any

from ernie_tui.engine_ctl.report import tune_figures as TF
from ernie_tui.engine_ctl.report.html_parts import fmt, info_html, svg_inline, table
from ernie_tui.engine_ctl.report.tune_inputs import MAX_OTHER_CURVES, Trial, TuneReport

OUTCOME_CLASS = {"measured": "pass", "failed": "fail", "refused": "undecided", "repeat": "undecided",
                 "cancelled": "undecided"}


def _load(v: float | None) -> str:
    return "–" if v is None else f"{v:g}"


def _changes(tune: TuneReport, best: Trial) -> str:
    """The best's values against BASE's: "max_num_seqs 128 → 256"."""
    parts = []
    for k, v in best.params.items():
        base = tune.base_args.get(k, "vLLM's default")
        parts.append(f"{k} {v} (as BASE)" if str(base) == str(v) else f"{k} {base} → {v}")
    return ", ".join(parts) or "BASE's own setting"


def verdict_label(verdict: dict[str, Any]) -> str:
    """The verdict in two or three words, for the eye; its text says the rest."""
    gain, beyond = verdict.get("gain_pct"), verdict.get("beyond_noise")
    if gain is None:
        return "not compared"
    if beyond is False:
        return "within noise"
    if beyond is None:
        return "one measurement each"
    return "better than BASE" if gain > 0 else "worse than BASE"


def _best_html(tune: TuneReport) -> str:
    best = tune.best
    if best is None:
        refused, failed = len(tune.with_outcome("refused")), len(tune.with_outcome("failed"))
        return (f"<p><b>No trial was measured</b> ({refused} refused by preflight, {failed} failed): there is no "
                "best setting, and nothing to draw of the trials' goodput but this.</p>")
    return (f"<p><b>Best setting</b>: trial {best.number} (<code>{escape(best.preset or '–')}</code>): "
            f"<code>{escape(_changes(tune, best))}</code>. Goodput <b>{fmt(best.goodput)} tok/s</b> at the SLO, "
            f"capacity {escape(_load(best.capacity))}, TTFT p99 {fmt(best.ttft_p99_ms)} ms, "
            f"ITL p99 {fmt(best.itl_p99_ms)} ms.</p>")


def answer_html(tune: TuneReport) -> str:
    """The answer, first thing on the section."""
    base = tune.base_goodput
    times = f", median of {len(tune.base_goodputs)}" if len(tune.base_goodputs) > 1 else ""
    against = (f"<p><b>Against BASE</b> ({escape(tune.base)}: {fmt(base)} tok/s{times}): "
               f"<b>{escape(verdict_label(tune.verdict))}</b>: {escape(str(tune.verdict.get('text') or '–'))}.</p>")
    counts = {o: len(tune.with_outcome(o)) for o in ("measured", "failed", "refused", "repeat", "cancelled")}
    trials = f"{counts['measured'] + counts['failed']} measured ({counts['failed']} of them failed), " \
             f"{counts['refused']} refused by preflight"
    trials += "".join(f", {counts[o]} {o}" for o in ("repeat", "cancelled") if counts[o])
    if tune.settings_in_space is not None:
        trials += f", of {tune.settings_in_space:,} settings in the space"
    rows = [("SLO", tune.slo or "–"), ("trials", trials), ("stopped", tune.stopped or "–"),
            ("wall time", "–" if tune.seconds is None else f"{tune.seconds / 60:.1f} min ({tune.seconds:,.0f} s)"),
            ("space", "; ".join(tune.space) or "–"), ("study", tune.study or "–")]
    facts = "".join(f'<tr><th class="l">{escape(k)}</th><td class="l">{escape(v)}</td></tr>' for k, v in rows)
    return _best_html(tune) + against + f"<table>{facts}</table>"


def trials_html(tune: TuneReport) -> str:
    """Every trial in the order run; the best's row marked, the reason of
    each one not measured (preflight's, for a refusal) beside it."""
    headers = ["trial", "setting", "outcome", "goodput tok/s", "capacity", "TTFT p99 ms", "ITL p99 ms", "s",
               "why", "its capacity search"]
    rows, classes, cells = [], [], []
    for t in tune.trials:
        best = tune.best is not None and t.number == tune.best.number
        rows.append([f"{t.number}" + (" ◀ best" if best else ""), t.setting, t.outcome, fmt(t.goodput),
                     _load(t.capacity), fmt(t.ttft_p99_ms), fmt(t.itl_p99_ms),
                     "–" if t.seconds is None else f"{t.seconds:,.0f}",
                     "" if t.outcome == "measured" else t.reason, t.record_id or "–"])
        classes.append("capacity" if best else "")
        cells.append(["", "l", OUTCOME_CLASS.get(t.outcome, "")] + [""] * 5 + ["l", "l"])
    if not rows:
        return "<p>The record holds no trial.</p>"
    return table(headers, rows, classes, cells) + (
        "<p class='note'>Goodput: output tok/s of the requests meeting the SLO, at the capacity the trial's "
        "search found; latencies are that capacity's p99. A failed trial counts as 0. "
        "<code>ernie-tui report ID</code> draws any trial's own search.</p>")


def _importances_text(tune: TuneReport) -> str:
    if not tune.importances:
        return "No importances: Optuna ranks the parameters once 4 trials are measured and one varied."
    return "Optuna's importances (PED-ANOVA): " + ", ".join(
        f"{k} {v:.2f}" for k, v in sorted(tune.importances.items(), key=lambda kv: -kv[1])) + "."


def figures_html(tune: TuneReport, index: int) -> str:
    """The three pictures; the front and the effects only when a trial was measured."""
    out = ["<h3>Goodput per trial</h3>",
           f'<div class="figure" id="tune-{index}-goodput">'
           f'{svg_inline(TF.goodput_figure(tune), f"tune-{index}-goodput")}</div>']
    if not tune.measured:
        out.append("<p class='note'>No trial was measured: no Pareto front and no parameter's effect to draw.</p>")
        return "\n".join(out)
    out += ["<h3>The Pareto front of the trials</h3>",
            "<p class='note'>Each measured trial at its capacity. On the front: no other trial carries more "
            "goodput at a lower latency; the choices worth making, one trading latency for goodput against "
            "the next.</p>",
            f'<div class="figure" id="tune-{index}-front">{svg_inline(TF.front_figure(tune), f"tune-{index}-front")}'
            "</div>"]
    if tune.effects:
        out += ["<h3>Each parameter's effect</h3>",
                f'<div class="figure" id="tune-{index}-effects">'
                f'{svg_inline(TF.effects_figure(tune), f"tune-{index}-effects")}</div>']
    out.append(f"<p class='note'>{escape(_importances_text(tune))}</p>")
    return "\n".join(out)


def curves_html(tune: TuneReport, curve_index: dict[str, int]) -> str:
    """Links to the trials' capacity curves drawn below, and why any is not."""
    items = [f'<li><a href="#run-{curve_index[rid]}">{escape(what)}</a> <span class="note">{escape(rid)}</span></li>'
             for what, rid in tune.curves if rid in curve_index]
    items += [f"<li>{escape(line)}: not drawn</li>" for line in tune.missing]
    if not items:
        return ""
    return ("<h3>Capacity searches drawn below</h3>"
            f"<p class='note'>The best's, BASE's and up to {MAX_OTHER_CURVES} more, each as its own run.</p>"
            f"<ul>{''.join(items)}</ul>")


def tune_html(tune: TuneReport, index: int, curve_index: dict[str, int]) -> str:
    """The tune's whole section."""
    return "\n".join([
        f'<h2 id="tune-{index}">tune of {escape(tune.base)} <span class="note">{escape(tune.run_id)}</span></h2>',
        answer_html(tune),
        figures_html(tune, index),
        "<h3>Trials</h3>",
        trials_html(tune),
        curves_html(tune, curve_index),
        "<details><summary>What BASE ran on</summary>", info_html(tune.info, tune.base_args), "</details>",
    ])
