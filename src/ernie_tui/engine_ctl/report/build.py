"""A report file: one self-contained HTML page, or one PNG/SVG picture, and
the CSV of every level.

The HTML holds everything inline: the pictures as SVG markup, its style in
one <style> block, the CSV as a data: URI download link; no script, and no
src or href that reaches the network, so it opens offline, in a mail
attachment or a pull request's artifacts alike.
"""

from __future__ import annotations

import base64
import csv
import io
import re
import time
from functools import partial
from html import escape
from pathlib import Path
from typing import Any

from ernie_tui import __version__, paths
from ernie_tui.engine_ctl.control import PAIRED_TABLE_NOTE, SweepRow, at_ceiling, measured
from ernie_tui.engine_ctl.report import figures as F
from ernie_tui.engine_ctl.report import tune_figures as TF
from ernie_tui.engine_ctl.report.html_parts import fmt as _fmt
from ernie_tui.engine_ctl.report.html_parts import info_html
from ernie_tui.engine_ctl.report.html_parts import pct as _pct
from ernie_tui.engine_ctl.report.html_parts import svg_inline as _svg_inline
from ernie_tui.engine_ctl.report.html_parts import table as _table
from ernie_tui.engine_ctl.report.inputs import Comparison, Curve, ReportData, ReportError
from ernie_tui.engine_ctl.report.tune_html import tune_html

FORMATS = (".html", ".htm", ".png", ".svg")

# -- CSV -------------------------------------------------------------------------

CSV_COLUMNS = ["run_id", "preset", "kind", "notes", "level_key", "level", "verdict", "is_capacity", "requests",
               "output_tps", "goodput_output_tps", "goodput_rps", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
               "itl_p99_ms", "e2e_p99_ms", "attainment", "attainment_low", "attainment_high", "stop", "slo"]


def levels_csv(data: ReportData) -> str:
    """Every level of every run, one row each; vLLM's own figures as vllm_* columns."""
    vllm_keys = sorted({k for c in data.curves for lv in c.levels for k in lv.vllm})
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS + [f"vllm_{k}" for k in vllm_keys])
    for c in data.curves:
        for lv in c.levels:
            values: dict[str, Any] = {
                "run_id": c.run_id, "preset": c.name, "kind": c.kind, "notes": c.repeat, "level_key": lv.key,
                "level": f"{lv.x:g}", "verdict": lv.verdict, "is_capacity": lv is c.capacity,
                "slo": " ".join(c.slo), "stop": lv.stop,
            }
            row = [values.get(col, getattr(lv, col, None)) for col in CSV_COLUMNS]
            row += [lv.vllm.get(k) for k in vllm_keys]
            w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


# -- HTML ------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1350px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: .2em;
margin-top: 2em; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .85em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
tr.capacity td { background: #fff3cd; font-weight: 600; }
td.pass { color: #1a7f37; } td.fail { color: #c62828; font-weight: 600; } td.undecided { color: #777; }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: .85em; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
.figure svg { max-width: 100%; height: auto; }
.note { color: #555; font-size: .9em; }
details { margin: .3em 0 1em; }
ul.warnings { color: #8a5300; background: #fff8e6; padding: .4em .4em .4em 1.6em; }
"""


_VLLM_COLUMNS = (("ttft_p50_ms", "vLLM TTFT p50"), ("ttft_p99_ms", "vLLM TTFT p99"),
                 ("itl_p50_ms", "vLLM ITL p50"), ("itl_p99_ms", "vLLM ITL p99"), ("e2e_p99_ms", "vLLM e2e p99"),
                 ("ttft_p50_s", "vLLM TTFT p50"), ("ttft_p99_s", "vLLM TTFT p99"), ("itl_mean_s", "vLLM ITL mean"),
                 ("output_tps", "vLLM output tok/s"))


def _levels_html(curve: Curve) -> str:
    vcols = [(k, h) for k, h in _VLLM_COLUMNS if any(lv.vllm.get(k) is not None for lv in curve.levels)]
    key = "concurrency" if curve.level_key == "concurrency" else "rate (req/s)"
    headers = [key, "verdict", "requests", "output tok/s", "goodput tok/s", "TTFT p50", "TTFT p99", "ITL p50",
               "ITL p99", "attainment", "interval", "stop"] + [h for _, h in vcols]
    rows, classes, cells = [], [], []
    for lv in sorted(curve.levels, key=lambda lv: lv.x):
        interval = ("–" if lv.attainment_low is None and lv.attainment_high is None
                    else f"{_pct(lv.attainment_low)} – {_pct(lv.attainment_high)}")
        cap = lv is curve.capacity
        rows.append([f"{lv.x:g}" + (" ◀ capacity" if cap else ""), lv.verdict or "–", _fmt(lv.requests),
                     _fmt(lv.output_tps), _fmt(lv.goodput_output_tps), _fmt(lv.ttft_p50_ms), _fmt(lv.ttft_p99_ms),
                     _fmt(lv.itl_p50_ms), _fmt(lv.itl_p99_ms), _pct(lv.attainment), interval, lv.stop]
                    + [_fmt(lv.vllm.get(k)) for k, _ in vcols])
        classes.append("capacity" if cap else "")
        cells.append(["", lv.verdict] + [""] * (len(headers) - 2))
    note = ("<p class='note'>Latencies in ms. Our figures are each request's own, timed at the client; the "
            "vLLM columns are the server's histograms (/metrics) over the same window.</p>")
    return _table(headers, rows, classes, cells) + note


def _curve_html(curve: Curve, index: int) -> str:
    cap = curve.capacity
    if curve.kind == "burst":
        head = "a burst (one point, no SLO)"
    elif cap is not None:
        head = (f"capacity <b>{escape(cap.label)}</b> under SLO <code>{escape(' '.join(curve.slo))}</code>: "
                f"goodput {_fmt(cap.goodput_output_tps)} tok/s, TTFT p99 {_fmt(cap.ttft_p99_ms)} ms, "
                f"ITL p99 {_fmt(cap.itl_p99_ms)} ms")
    else:
        head = (f"no capacity under SLO <code>{escape(' '.join(curve.slo))}</code> "
                f"(search stopped: {escape(curve.stop or '?')})")
    fig = F.curve_figure(curve)
    return "\n".join([
        f'<h2 id="run-{index}">{escape(F.curve_title(curve))} <span class="note">{escape(curve.run_id)}'
        f'{" · " + escape(curve.repeat) if curve.repeat else ""}</span></h2>',
        f"<p>{head}.</p>",
        *([f'<ul class="warnings">{"".join(f"<li>warning: {escape(w)}</li>" for w in curve.warnings)}</ul>']
          if curve.warnings else []),
        f'<div class="figure">{_svg_inline(fig, f"curve-{index}")}</div>',
        _levels_html(curve),
        "<details open><summary>What it ran on</summary>", info_html(curve.info, curve.engine_args), "</details>",
    ])


def _agg_text(row: SweepRow, col: str) -> str:
    a = row.stats.get(col)
    if a is None or a.median is None:
        return "–"
    load = col in ("capacity_concurrency", "capacity_rate")
    fmt = (lambda v: "–" if v is None else f"{v:g}") if load else _fmt
    text = fmt(a.median) + (" req/s" if col == "capacity_rate" else "")
    if load and at_ceiling(row):
        text = "≥ " + text  # a search stopped at its highest load allowed: a lower bound
    if len([r for r in row.runs if r.status == "ok"]) > 1:
        text += f" ({fmt(a.low)}–{fmt(a.high)})"
    return text


def _capacity_text(row: SweepRow) -> str:
    """The row's capacity: a request rate for open-loop searches (--rate),
    else a concurrency (a rate sweep's rows carry no concurrency)."""
    a = row.stats.get("capacity_rate")
    return _agg_text(row, "capacity_rate" if a is not None and a.median is not None else "capacity_concurrency")


def _pairs_html(paired: dict[str, Any]) -> str:
    """A paired sweep's verdicts: each pair with its interval, the ranking
    from the pairs beyond noise, and the drift the run saw."""
    rows = []
    for v in paired.get("pairs") or []:
        gap = v.get("gap_pct")
        interval = "–" if not gap else f"{gap[0]:+.0f} % ({gap[1]:+.0f} to {gap[2]:+.0f} %)"
        rows.append([f"{v.get('a')} / {v.get('b')}", str(v.get("rounds", "–")), interval,
                     "beyond noise" if v.get("beyond_noise") else "within noise", str(v.get("text", ""))])
    ranking = (paired.get("ranking") or {}).get("text")
    drift = paired.get("drift") or {}
    own = ", ".join(f"{k} {x:.0f} %" for k, x in (drift.get("own_range_pct") or {}).items() if x is not None)
    adj = ", ".join(f"{k} {x:.0f} %" for k, x in (drift.get("adjusted_pair_range_pct") or {}).items()
                    if x is not None)
    notes = [f"<b>Ranking</b> (pairs beyond noise only): {escape(ranking)}" if ranking else "",
             f"<b>Drift seen</b>: each preset's own figure moved by {escape(own)} across rounds; the pairs' "
             f"ratios, taken against the reference at the same moment, moved by {escape(adj or '–')}" if own else "",
             f"<b>Servers</b>: {escape(str(paired.get('co_residency')))}" if paired.get("co_residency") else ""]
    notes += [f"Note: {escape(str(n))}" for n in paired.get("notes") or []]
    return "\n".join([
        "<h3>Pairs, measured in the same minutes</h3>",
        _table(["pair", "rounds", "gap of the second (interval)", "verdict", "in words"], rows),
        "".join(f"<p class='note'>{n}</p>" for n in notes if n),
    ])


def _comparison_html(cmp_: Comparison, index: int, curves: list[Curve]) -> str:
    capacity = cmp_.score == "goodput_output_tps"
    headers = ["rank", "preset", "status", "runs", f"{'goodput tok/s' if capacity else 'output tok/s'}",
               "vs best"]
    if capacity:
        headers += ["capacity", "TTFT p99 ms", "ITL p99 ms", "Pareto front"]
    else:
        headers += ["TTFT p50 ms", "ITL p50 ms"]
    rows = []
    for row in sorted(cmp_.rows, key=lambda r: (r.rank is None, r.rank or 0)):
        r = [_fmt(row.rank), row.preset, row.status, str(len(row.runs)), _agg_text(row, cmp_.score),
             row.vs_best or "–"]
        if capacity:
            r += [_capacity_text(row), _agg_text(row, "ttft_p99_ms"),
                  _agg_text(row, "itl_p99_ms"), "★ on the front" if row.preset in cmp_.front else ""]
        else:
            r += [_agg_text(row, "ttft_p50_ms"), _agg_text(row, "itl_p50_ms")]
        rows.append(r)
    # (one preset measured, or none, is compared with nothing: no spread to hedge)
    single = all(len([x for x in r.runs if x.status == "ok"]) <= 1 for r in cmp_.rows) and sum(
        measured(r) for r in cmp_.rows) > 1
    paired = any(r.paired for r in cmp_.rows)
    notes = ["Figures are medians over the repeats with their min–max range in brackets. A gap to the best "
             "that lies inside either preset's range is reported as <b>within noise</b>: the repeats do not "
             "tell the two apart."] if not paired else [f"{escape(PAIRED_TABLE_NOTE[0].upper())}"
                                                        f"{escape(PAIRED_TABLE_NOTE[1:])}."]
    if single and not paired:
        notes.append("One run per preset: no spread was measured, so no difference can be called noise; "
                     "<code>--repeat 3</code> gives medians with ranges.")
    if capacity:
        notes.append("The Pareto front: presets no other preset beats on both goodput (more) and TTFT p99 "
                     "(less) at its capacity.")
    noisy = [r.preset for r in cmp_.rows if r.vs_best == "within noise"]
    if noisy:
        notes.append(f"Within noise of the best: {escape(', '.join(noisy))}.")
    meta = "".join(f"<li><b>{escape(str(k))}</b>: {escape(str(v))}</li>" for k, v in cmp_.meta.items())
    fig = F.comparison_figure(cmp_, curves)
    return "\n".join([
        f'<h2 id="cmp-{index}">{escape(cmp_.title)}</h2>',
        f"<ul>{meta}</ul>" if meta else "",
        f'<div class="figure">{_svg_inline(fig, f"cmp-{index}")}</div>',
        _pairs_html(cmp_.paired) if cmp_.paired else "",
        _table(headers, rows),
        "".join(f"<p class='note'>{n}</p>" for n in notes),
    ])


def report_html(data: ReportData, title: str | None = None) -> str:
    csv_text = levels_csv(data)
    csv_uri = "data:text/csv;charset=utf-8;base64," + base64.b64encode(csv_text.encode("utf-8")).decode("ascii")
    names = [f"tune of {t.base}" for t in data.tunes] or [c.name for c in data.curves]
    title = title or ("ernie-tui report: " + ", ".join(dict.fromkeys(names)) if names else "ernie-tui report")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p class='note'>Made {escape(time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))} by ernie-tui "
        f"{escape(__version__)} from {len(data.sources)} record(s): "
        f"{escape(', '.join(Path(s).name for s in data.sources))}. "
        f'<a download="levels.csv" href="{csv_uri}">Download every level as CSV</a>.</p>',
    ]
    toc = [f'<li><a href="#tune-{i}">tune of {escape(t.base)}</a> <span class="note">{escape(t.run_id)}</span></li>'
           for i, t in enumerate(data.tunes)]
    toc += [f'<li><a href="#cmp-{i}">{escape(c.title)}</a></li>' for i, c in enumerate(data.comparisons)]
    toc += [f'<li><a href="#run-{i}">{escape(F.curve_title(c))}</a> <span class="note">{escape(c.run_id)}</span></li>'
            for i, c in enumerate(data.curves)]
    if len(toc) > 1:
        parts.append(f"<ul>{''.join(toc)}</ul>")
    curve_index = {c.run_id: i for i, c in enumerate(data.curves)}
    for i, tune in enumerate(data.tunes):  # the answer on top: the curves it links to are drawn below
        parts.append(tune_html(tune, i, curve_index))
    for i, cmp_ in enumerate(data.comparisons):
        parts.append(_comparison_html(cmp_, i, data.curves))
    for i, curve in enumerate(data.curves):
        parts.append(_curve_html(curve, i))
    if not data.curves and not data.comparisons and not data.tunes:
        parts.append("<p>The runs hold nothing to draw.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


_NETWORK_RE = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


def network_refs(html_text: str) -> list[str]:
    """Attributes that would fetch from the network (none in our reports)."""
    return [m.group(0) for m in _NETWORK_RE.finditer(html_text)]


def write_report(data: ReportData, out: str | Path, title: str | None = None, dpi: float | None = None) -> Path:
    """Write FILE.html (the page), FILE.png or FILE.svg (every picture on one
    canvas; `dpi` sets a PNG's resolution, 100 by default)."""
    p = _out_file(out)
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise ReportError(f"the report must end in .html, .png or .svg, got {p.name}")
    if suffix in (".html", ".htm"):
        payload = report_html(data, title).encode("utf-8")
    else:
        tunes = [(partial(TF.draw_tune_rows, tune=t), TF.rows_height(t)) for t in data.tunes]
        fig = F.overview_figure(data.curves, data.comparisons, tunes)
        payload = F.render(fig, suffix[1:], salt=p.stem, dpi=dpi)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(payload)
    tmp.replace(p)
    return p


def write_csv(data: ReportData, out: str | Path) -> Path:
    p = _out_file(out)
    p.write_text(levels_csv(data), encoding="utf-8")
    return p



def _out_file(out: str | Path) -> Path:
    """The file to write, its folder there (paths.out_file), as a ReportError."""
    try:
        return paths.out_file(out)
    except paths.OutPathError as exc:
        raise ReportError(str(exc)) from None
