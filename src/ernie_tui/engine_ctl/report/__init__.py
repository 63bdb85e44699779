"""Reports from saved runs: the curves and comparisons people share away
from the terminal. Reads run records and sweep exports (inputs), draws them
with matplotlib's Agg backend (figures; the optional `report` extra), and
writes one self-contained HTML page, a PNG/SVG picture, or a CSV of every
level (build); lists and describes the run store (catalog). A tune's
record gets a section of its own (tune_inputs, tune_figures, tune_html):
its answer, its trials, their front and each parameter's effect.

The top district: it reads load's records and Pareto front and reuses
control's sweep fold (median, spread, "within noise"); nothing below uses it.
"""

from ernie_tui.engine_ctl.report.build import FORMATS, levels_csv, network_refs, report_html, write_csv, write_report
from ernie_tui.engine_ctl.report.catalog import describe, headline, list_line
from ernie_tui.engine_ctl.report.figures import INSTALL_HINT
from ernie_tui.engine_ctl.report.inputs import Comparison, Curve, ReportData, ReportError, load_report_data
from ernie_tui.engine_ctl.report.tune_inputs import TuneReport

__all__ = [
    "Comparison",
    "Curve",
    "FORMATS",
    "INSTALL_HINT",
    "ReportData",
    "ReportError",
    "TuneReport",
    "describe",
    "headline",
    "levels_csv",
    "list_line",
    "load_report_data",
    "network_refs",
    "report_html",
    "write_csv",
    "write_report",
]
