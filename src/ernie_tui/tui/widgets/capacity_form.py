"""The capacity search's form: one widget for the probe pane's Burst tab and
the sweep screen (they used to write it twice).

Its fields are make_search's arguments, as `--capacity` takes them on the
command line: the SLO, the mode (a closed loop at a concurrency, or open
loop at a request rate), where the search starts and how high it may go,
the tolerance, the requests and seconds per level, the attainment target
and (rate mode) the arrival schedule. Every default is read from the load
district's constants (engine_ctl/load/capacity.py), never written here.

`search_args()` reads the fields into make_search's keyword arguments and
`search()` checks them there: ValueError in plain words, naming the field.
The ids are `{prefix}-slo`, `{prefix}-mode`, `{prefix}-start`, ... so that
each screen keeps its own (pf-cap-*, sw-cap-*).
"""

from __future__ import annotations

from typing import Any, Literal

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Select

from ernie_tui.engine_ctl.load import (
    ARRIVALS,
    DEFAULT_ARRIVALS,
    DEFAULT_ATTAINMENT,
    DEFAULT_LEVEL_TIME_S,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RATE,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_SLO,
    DEFAULT_START,
    DEFAULT_START_RATE,
    DEFAULT_TOLERANCE,
    make_search,
)
from ernie_tui.tui.widgets.form import labelled, read_float, read_int

MODE_CONCURRENCY, MODE_RATE = "concurrency", "rate"
MODE_OPTIONS = (("concurrency (closed loop)", MODE_CONCURRENCY), ("rate, req/s (open loop)", MODE_RATE))

# The field each make_search argument comes from:
# (argument, id suffix, label, input type, default as shown).
FIELDS: tuple[tuple[str, str, str, Literal["integer", "number"], str], ...] = (
    ("start", "start", "start C", "integer", str(DEFAULT_START)),
    ("max_concurrency", "maxc", "max C", "integer", str(DEFAULT_MAX_CONCURRENCY)),
    ("start_rate", "start-rate", "start req/s", "number", f"{DEFAULT_START_RATE:g}"),
    ("max_rate", "max-rate", "max req/s", "number", f"{DEFAULT_MAX_RATE:g}"),
    ("tolerance", "tol", "tolerance", "number", f"{DEFAULT_TOLERANCE:g}"),
    ("attainment", "att", "attainment ≥", "number", f"{DEFAULT_ATTAINMENT:g}"),
    ("min_requests", "minr", "min reqs", "integer", str(DEFAULT_MIN_REQUESTS)),
    ("max_requests", "maxr", "max reqs", "integer", str(DEFAULT_MAX_REQUESTS)),
    ("level_time_s", "time", "level s", "number", f"{DEFAULT_LEVEL_TIME_S:g}"),
)
_CONCURRENCY_ONLY = ("start", "max_concurrency")
_RATE_ONLY = ("start_rate", "max_rate")


class CapacityForm(Vertical):
    """The capacity search's fields; `prefix` names their ids."""

    # A grid whose column count follows the width (on_resize): the fields
    # wrap onto more rows where the form is narrow instead of running off it.
    DEFAULT_CSS = """
    CapacityForm { layout: grid; grid-size: 8; grid-columns: 14; grid-rows: 2; grid-gutter: 0 1; height: auto; }
    CapacityForm .cf-field { width: 100%; height: 2; }
    CapacityForm .cf-field.-wide { column-span: 2; }
    CapacityForm .cf-field Label { color: $text-muted; }
    CapacityForm .cf-field Input { width: 12; }
    CapacityForm .cf-field.-wide Input, CapacityForm .cf-field.-wide Select { width: 100%; }
    CapacityForm .-rate-only { display: none; }
    CapacityForm.-rate .-rate-only { display: block; }
    CapacityForm.-rate .-concurrency-only { display: none; }
    """

    def __init__(self, prefix: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.prefix = prefix

    def field_id(self, suffix: str) -> str:
        """The id of one of its fields (`slo`, `mode`, `start`, ...)."""
        return f"{self.prefix}-{suffix}"

    def compose(self) -> ComposeResult:
        yield labelled("SLO (METRIC_pNN=LIMIT ...)",
                       Input(DEFAULT_SLO, id=self.field_id("slo"), compact=True, classes="-slo"), "cf-field -wide")
        yield labelled("search", Select(MODE_OPTIONS, value=MODE_CONCURRENCY, allow_blank=False,
                                        id=self.field_id("mode"), compact=True), "cf-field -wide")
        yield labelled("arrivals", Select([(a, a) for a in ARRIVALS], value=DEFAULT_ARRIVALS, allow_blank=False,
                                          id=self.field_id("arrivals"), compact=True), "cf-field -wide -rate-only")
        for arg, suffix, label, kind, default in FIELDS:
            where = " -concurrency-only" if arg in _CONCURRENCY_ONLY else " -rate-only" if arg in _RATE_ONLY else ""
            yield labelled(label, Input(default, type=kind, id=self.field_id(suffix), compact=True),
                           "cf-field" + where)

    def on_resize(self) -> None:
        columns = max(2, (self.size.width + 1) // 15)  # 14 a column, 1 between
        if self.styles.grid_size_columns != columns:
            self.styles.grid_size_columns = columns

    # -- the mode ---------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return str(self.query_one(f"#{self.field_id('mode')}", Select).value)

    @mode.setter
    def mode(self, value: str) -> None:
        self.query_one(f"#{self.field_id('mode')}", Select).value = value
        self.set_class(value == MODE_RATE, "-rate")

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        if event.select.id == self.field_id("mode"):
            self.set_class(event.value == MODE_RATE, "-rate")

    # -- reading ------------------------------------------------------------------------------
    def search_args(self) -> dict[str, Any]:
        """make_search's arguments from the fields (the SLO first, as `slo`).
        ValueError naming the field when one is not a number."""
        rate = self.mode == MODE_RATE
        args: dict[str, Any] = {"slo": self.query_one(f"#{self.field_id('slo')}", Input).value, "rate": rate}
        for arg, suffix, label, kind, _ in FIELDS:
            if arg in (_CONCURRENCY_ONLY if rate else _RATE_ONLY):
                continue  # the other mode's fields are hidden: their values are not this search's
            field = self.query_one(f"#{self.field_id(suffix)}", Input)
            args[arg] = read_int(field, label) if kind == "integer" else read_float(field, label)
        if rate:
            args["arrivals"] = str(self.query_one(f"#{self.field_id('arrivals')}", Select).value)
        return args

    def search(self) -> tuple[list, Any, Any]:
        """(objectives, SearchConfig, LevelRules), checked by make_search as
        the command line's options are; ValueError in plain words."""
        args = self.search_args()
        slo = args.pop("slo")
        if not 0.0 <= args["attainment"] <= 1.0:
            raise ValueError(f"attainment ≥ is a share between 0 and 1 (0.9 = 90 % of requests meet the SLO), "
                             f"got {args['attainment']:g}")
        return make_search(slo, **args)
