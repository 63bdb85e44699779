"""The run store as an operator browses it: one line per record (`runs
list`) and a record's headline figures (`runs show`)."""

from __future__ import annotations

from typing import Any

from ernie_tui.engine_ctl.load import RunRecord, second_look, verdict_text


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
        for r in res.get("runs") or []:
            lines.append(f"    {r.get('preset')} r{r.get('repeat')}: {r.get('status')}"
                         + (f", record {r['record_id']}" if r.get("record_id") else ""))
    return "\n".join(lines)
