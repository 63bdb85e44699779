"""The run store as an operator browses it: one line per record (`runs
list`) and a record's headline figures (`runs show`)."""

from __future__ import annotations

from typing import Any

from ernie_tui.engine_ctl.control import floor_words
from ernie_tui.engine_ctl.load import RunRecord, second_look, verdict_text
from ernie_tui.engine_ctl.report.inputs import comparison_of, sweep_runs


def _f(v: Any, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}") + unit
    return f"{v}{unit}"


def _look(lv: dict[str, Any]) -> str:
    """' (conf.)' after a second look's load, as the probe pane's table names it."""
    look = second_look(lv)
    return f" ({look})" if look else ""


def headline(rec: RunRecord) -> str:
    """What the run found, in a few words."""
    res = rec.results or {}
    if rec.kind == "capacity":
        cap = res.get("capacity") if isinstance(res.get("capacity"), dict) else None
        slo = " ".join(str(s) for s in res.get("slo") or [])
        n = len(res.get("levels") or [])
        if cap:
            key = "rate" if cap.get("rate") is not None and cap.get("concurrency") is None else "concurrency"
            where = f"{'c' if key == 'concurrency' else 'r'}={cap.get(key)}"
            return (f"capacity {where} under {slo}: goodput {_f(cap.get('goodput_output_tps'))} tok/s, "
                    f"{n} levels")
        return f"no capacity under {slo} ({res.get('stop_reason') or '?'}), {n} levels"
    if rec.kind == "burst":
        cfg = res.get("config") or {}
        ttft = (res.get("ttft") or {}).get("p99")
        return (f"burst N={cfg.get('n', '?')} C={cfg.get('concurrency', '?')}: "
                f"{_f(res.get('output_tps'))} output tok/s, TTFT p99 "
                f"{_f(None if ttft is None else ttft * 1000, ' ms')}, {res.get('failed', 0)} failed")
    if rec.kind == "sweep":
        meta = res.get("meta") or {}
        runs = res.get("runs") or []
        how = "capacity" if "capacity" in meta else "burst"
        names = meta.get("presets") or rec.notes or "?"
        return f"{how} sweep of {names}: {len(runs)} runs, repeat {meta.get('repeat', 1)}"
    if rec.kind == "probe":
        return f"probe: TTFT {_f(res.get('ttft_ms'), ' ms')}"
    if rec.kind == "tune":
        best = res.get("best") or {}
        verdict = (res.get("verdict") or {}).get("text") or "–"
        return (f"tune of {res.get('base', '?')}: {res.get('measured_trials', 0)} trials measured, best "
                f"{best.get('preset') or '–'} {_f(best.get('goodput'))} tok/s; {verdict}")
    return rec.kind


def list_line(rec: RunRecord) -> str:
    return f"{rec.id:<32} {rec.kind:<9} {(rec.preset_name or '–')[:20]:<20} {headline(rec)}"


def describe(rec: RunRecord) -> str:
    """A record in plain text: where it came from and what it found."""
    lines = [f"run {rec.id}", f"  kind:     {rec.kind}", f"  time:     {rec.timestamp} UTC",
             f"  file:     {rec.path}", f"  preset:   {rec.preset_name or '–'}"]
    args = (rec.preset or {}).get("engine_args")
    if args:
        lines.append("  engine args: " + " ".join(f"--{k}={v}" for k, v in args.items()))
    er = rec.engine_report or {}
    if er.get("vllm_version") or er.get("platform"):
        lines.append(f"  vLLM:     {er.get('vllm_version') or '?'} ({er.get('platform') or '?'})")
    if rec.model or rec.url:
        lines.append(f"  model:    {rec.model or '–'} at {rec.url or '–'}")
    if rec.notes:
        lines.append(f"  notes:    {rec.notes}")
    lines.append(f"  result:   {headline(rec)}")
    res = rec.results or {}
    if rec.kind == "capacity":
        for lv in res.get("levels") or []:
            key = "rate" if lv.get("rate") is not None and lv.get("concurrency") is None else "concurrency"
            att = lv.get("attainment")
            lines.append(f"    {key} {lv.get(key)}{_look(lv)}: {verdict_text(lv):<9} "
                         f"{_f(lv.get('output_tps'))} tok/s, "
                         f"TTFT p99 {_f(lv.get('ttft_p99_ms'), ' ms')}, ITL p99 {_f(lv.get('itl_p99_ms'), ' ms')}, "
                         f"attainment {'–' if att is None else f'{att * 100:.1f}%'}")
    if rec.kind == "sweep":
        lines += _sweep_lines(res)
    return "\n".join(lines)


def _sweep_lines(res: dict[str, Any]) -> list[str]:
    """A sweep's verdict where `runs show` is read: each preset's rank and vs
    best (from the paired duels when it had them, as the table and the
    report say), the pairs' verdicts, the ranking and the drift; then the
    runs. It listed only the runs ("r0: ok") though the record held it all."""
    paired = res.get("paired") if isinstance(res.get("paired"), dict) else None
    lines = []
    cmp_ = comparison_of(sweep_runs(res.get("runs")), res.get("meta") or {}, "", paired)
    if cmp_ is not None:
        how = "by the pairs beyond noise" if paired and not paired.get("refused") else (
            "by goodput at the SLO" if cmp_.score == "goodput_output_tps" else "by output tok/s")
        lines.append(f"  ranking:  {how}")
        width = max(len(r.preset) for r in cmp_.rows)
        unit = "goodput tok/s" if cmp_.score == "goodput_output_tps" else "output tok/s"
        for row in sorted(cmp_.rows, key=lambda r: (r.rank is None, r.rank or 0)):
            rank = f"#{row.rank}" if row.rank else "–"
            score = row.stats.get(cmp_.score)
            figure = "" if score is None or score.median is None else f"{_f(score.median)} {unit}"
            lines.append(f"    {rank:<3} {row.preset:<{width}}  {figure:<{len(unit) + 8}}  {row.vs_best or '–'}")
    if paired:
        lines += _paired_lines(paired)
    lines.append("  runs:")
    for r in res.get("runs") or []:
        lines.append(f"    {r.get('preset')} r{r.get('repeat')}: {r.get('status')}"
                     + (f", record {r['record_id']}" if r.get("record_id") else ""))
    return lines


def _paired_lines(paired: dict[str, Any]) -> list[str]:
    """The paired sweep's verdicts, from its exported dict (the words it
    wrote then, so an old record reads as it did)."""
    if paired.get("refused"):
        return [f"  paired:   not side by side ({paired['refused']}); measured one after another"]
    pairs = [p for p in paired.get("pairs") or [] if isinstance(p, dict)]
    rounds = max((int(p.get("rounds") or 0) for p in pairs), default=0)
    lines = [f"  pairs:    {rounds} duel round(s), output tok/s at each preset's capacity against a reference"]
    floor = paired.get("min_difference_pct")  # (a record from before the floor has none)
    if isinstance(floor, (int, float)):
        lines.append(f"  floor:    {floor_words(floor / 100.0)} (--min-difference)")
    lines += [f"    {p.get('text') or p.get('a', '?') + ' / ' + p.get('b', '?')}" for p in pairs]
    ranking = (paired.get("ranking") or {}).get("text") if isinstance(paired.get("ranking"), dict) else None
    if ranking:
        lines.append(f"  verdict:  {ranking} (pairs beyond noise only)")
    own = (paired.get("drift") or {}).get("own_range_pct") or {}
    moved = ", ".join(f"{k} {v:.0f} %" for k, v in own.items() if isinstance(v, (int, float)))
    if moved:
        lines.append(f"  drift:    each preset's tok/s moved across rounds by {moved}")
    return lines
