"""What a report draws of a tune, read from its run record.

A tune's record holds control.tune's TuneResult.to_dict() (saved by
`ernie-tui tune`): BASE, the SLO, every trial (its setting, outcome,
goodput, capacity and latencies, and the id of its own capacity search's
record), the best, the verdict against BASE, each parameter's importance
and effect. As everywhere in the report, every key is read with a default:
a record of an older tune lacks some (BASE's own summary, for one).

Which trials' capacity curves the page draws is chosen here (the best,
BASE, a few others); inputs loads them. Nothing here draws or reads files.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ernie_tui.engine_ctl.control import TrialRow
from ernie_tui.engine_ctl.load import RunRecord
from ernie_tui.engine_ctl.report.values import num, slo_limits

# Besides the best's and BASE's, the capacity curves drawn (the next best by
# goodput): each is a row of four pictures, and a tune has tens of trials.
MAX_OTHER_CURVES = 3
LATENCIES = ("ttft", "itl")  # what each trial keeps at its capacity: the p99 of each


class Trial(TrialRow):
    """One trial as the record keeps it (control.tune's TrialRow), with what
    the page asks of it."""

    @property
    def measured(self) -> bool:
        return self.outcome == "measured" and self.goodput is not None

    def latency(self, metric: str) -> float | None:
        return getattr(self, f"{metric}_p99_ms", None)

    @property
    def setting(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items()) or "–"


@dataclass
class TuneReport:
    """A tune: its answer, its trials, and the trials' curves drawn below it."""

    run_id: str
    base: str
    slo: str
    timestamp: str = ""
    study: str = ""
    space: list[str] = field(default_factory=list)
    settings_in_space: int | None = None
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    base_goodputs: list[float] = field(default_factory=list)
    best_goodputs: list[float] = field(default_factory=list)
    verdict: dict[str, Any] = field(default_factory=dict)  # text, gain_pct, low_pct, high_pct, beyond_noise
    importances: dict[str, float] = field(default_factory=dict)
    effects: dict[str, dict[str, float]] = field(default_factory=dict)  # param -> value -> median goodput
    stopped: str = ""
    seconds: float | None = None
    base_args: dict[str, Any] = field(default_factory=dict)  # BASE's engine arguments
    base_run: dict[str, Any] = field(default_factory=dict)  # BASE's own measurement (newer records)
    limits: dict[str, float] = field(default_factory=dict)  # "ttft_p99" -> ms
    info: dict[str, Any] = field(default_factory=dict)  # what it ran on: label -> text
    paired: dict[str, Any] | None = None  # the confirmation's paired sweep, when one ran
    # Filled by inputs: the curves drawn (what it is, run id), and why others are not.
    curves: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def measured(self) -> list[Trial]:
        return [t for t in self.trials if t.measured]

    def with_outcome(self, outcome: str) -> list[Trial]:
        return [t for t in self.trials if t.outcome == outcome]

    @property
    def base_goodput(self) -> float | None:
        return statistics.median(self.base_goodputs) if self.base_goodputs else None

    def judged(self) -> list[str]:
        """The latencies the SLO judges that the trials keep (TTFT, ITL), TTFT when it names neither."""
        named = [m for m in LATENCIES if any(k.startswith(m + "_") for k in self.limits)]
        return named or ["ttft"]


def trial_of(d: Any) -> Trial | None:
    """A trial from its dict; None when it has no number (not a trial)."""
    if not isinstance(d, dict) or num(d.get("number")) is None:
        return None
    params = d.get("params") if isinstance(d.get("params"), dict) else {}
    record = d.get("record_id")
    return Trial(number=int(num(d.get("number")) or 0), params=dict(params or {}),
                 outcome=str(d.get("outcome") or "?"), preset=str(d.get("preset") or ""),
                 goodput=num(d.get("goodput")), reason=str(d.get("reason") or ""), capacity=num(d.get("capacity")),
                 ttft_p99_ms=num(d.get("ttft_p99_ms")), itl_p99_ms=num(d.get("itl_p99_ms")),
                 record_id=str(record) if record else None, seconds=num(d.get("seconds")))


def _floats(values: Any) -> list[float]:
    return [f for f in (num(v) for v in values or []) if f is not None] if isinstance(values, list) else []


def _numbers(d: Any) -> dict[str, float]:
    return {str(k): f for k, v in (d or {}).items() if (f := num(v)) is not None} if isinstance(d, dict) else {}


def tune_of(rec: RunRecord) -> TuneReport:
    """A tune record as the report reads it."""
    res = rec.results if isinstance(rec.results, dict) else {}
    trials = sorted((t for t in (trial_of(d) for d in res.get("trials") or []) if t is not None),
                    key=lambda t: t.number)
    best = trial_of(res.get("best"))
    slo = res.get("slo")
    slo_text = " ".join(str(s) for s in slo) if isinstance(slo, list) else str(slo or "")
    preset = rec.preset or {}
    args = preset.get("engine_args") if isinstance(preset.get("engine_args"), dict) else {}
    effects: dict[str, Any] = res["effects"] if isinstance(res.get("effects"), dict) else {}
    extra = res.get("extra") if isinstance(res.get("extra"), dict) else {}
    paired = (extra or {}).get("paired")
    return TuneReport(
        run_id=rec.id, base=str(res.get("base") or preset.get("name") or "?"), slo=slo_text,
        timestamp=rec.timestamp, study=str(res.get("study_name") or rec.notes or ""),
        space=[str(s) for s in res.get("space") or []],
        settings_in_space=int(n) if (n := num(res.get("settings_in_space"))) is not None else None,
        trials=trials, best=best, base_goodputs=_floats(res.get("base_goodputs")),
        best_goodputs=_floats(res.get("best_goodputs")),
        verdict=dict(res.get("verdict") or {}) if isinstance(res.get("verdict"), dict) else {},
        importances=_numbers(res.get("importances")),
        effects={str(k): _numbers(v) for k, v in effects.items() if _numbers(v)},
        stopped=str(res.get("stopped") or ""), seconds=num(res.get("seconds")), base_args=dict(args or {}),
        base_run=dict(res.get("base_summary") or {}) if isinstance(res.get("base_summary"), dict) else {},
        limits=slo_limits(slo_text.split()), paired=paired if isinstance(paired, dict) else None)


def wanted_curves(tune: TuneReport) -> list[tuple[str, str | None]]:
    """The capacity searches to draw, (what it is, record id or None): the
    best's, BASE's, then the next best measured trials' (MAX_OTHER_CURVES)."""
    out: list[tuple[str, str | None]] = []
    best = tune.best
    if best is not None:
        out.append((f"the best, trial {best.number}", best.record_id))
    if tune.base_run:
        out.append((f"BASE {tune.base}", str(tune.base_run.get("record_id") or "") or None))
    others = sorted((t for t in tune.measured if best is None or t.number != best.number),
                    key=lambda t: -(t.goodput or 0.0))
    out += [(f"trial {t.number}", t.record_id) for t in others[:MAX_OTHER_CURVES]]
    return out
