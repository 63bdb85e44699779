"""Is the paired sweep's verdict ever confidently wrong? (issue #56)

Three cases, each run N times, tallied against the truth:
- A/A: one preset under two names, served side by side: "within noise" is
  the only right answer (goal: 19 of 20);
- 25 %: the stronger carries 25 % more, on a drifting host whose tail
  sometimes spikes near the limit: never the weaker beyond noise; the
  stronger beyond noise with its gap within 10 points of 25 % (goal: 16 of 20);
- 10 %: never the weaker beyond noise (goal: 10 of 10).

Two stands:
- --stand sim (the default): tests/knee_sim.py, the real search, turn
  gate, ladder and verdict over simulated servers and clock (the paced
  stand-in's --itl-scale-knee model with its drift, p99 spikes of 30-90 % in a
  share of levels, noise on every reading): a run takes a fraction of a
  second, so every case runs its full count; --design fixed runs the duels
  at the loads round 0 found, as before 2026-12-07, for comparison;
  --knee queueing serves knee_sim's queueing model instead (a real
  server's knee, vLLM on an H100: TTFT p99 flat, then steeply over its
  limit one step up; short levels near the limit end undecided);
- --stand paced: `ernie-tui sweep A B --capacity` on two paced stand-ins
  (tests/paced_server.py) with --drift and --tail-jitter: minutes a run on
  the 2-core box. --plan aa=10,25=10,10=5 runs a batch whose cases take
  turns (aa 25 10 aa 25 aa 25 10 ...: schedule()), so the box's busy and
  quiet spells fall on every case alike; each run is one JSON line
  (--json), written as it ends, with the load average before and after it
  and, under --keep, the sweep's export and output for the runs to be
  analysed. --time-scale S stretches the stand-ins' time (their ITL and
  TTFT, the tail spikes, the SLO's limits) by S: every ratio that decides a
  level stays, and the client's own stalls on a busy box weigh 1/S as much.

    .venv/bin/python bench/verdict_calibration.py                       # sim, 20/20/10 runs
    .venv/bin/python bench/verdict_calibration.py --design fixed        # the old duels, same cases
    .venv/bin/python bench/verdict_calibration.py --knee queueing       # a queueing knee, same cases
    .venv/bin/python bench/verdict_calibration.py --stand paced --case 25 --runs 2 --level-time 10
    .venv/bin/python bench/verdict_calibration.py --stand paced --plan aa=10,25=10,10=5 \
        --json runs.jsonl --keep runs.d --time-scale 2 --start-concurrency 8 --level-time 15 --rotate 1
    .venv/bin/python bench/verdict_calibration.py --summarise runs.jsonl [more.jsonl]   # the counts
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

# case -> (knee of the weaker, knee of the stronger, runs by default)
CASES = {"aa": (8, 8, 20), "25": (8, 10, 20), "10": (10, 11, 10)}
# The paced stand-ins at --time-scale 1 (the first paced runs): each token
# gap 20 ms (x the batch beyond the knee, x the drift), first token 20 ms,
# a spike 15 ms; the SLO ITL p99 50 ms, TTFT p99 500 ms. Capacity K x 50 / 20.
PACED_ITL_MS, PACED_TTFT_MS, PACED_JITTER_MS = 20.0, 20.0, 15.0
SLO_ITL_MS, SLO_TTFT_MS = 50.0, 500.0


def tally_one(pair: dict, truth_pct: float, names: tuple[str, str]) -> dict:
    better = pair.get("better") if pair.get("beyond_noise") else None
    gap = pair.get("gap_pct")
    g = gap[0] if gap else None
    return {"better": better, "gap_pct": g, "held_back": bool(pair.get("held_back")), "text": pair.get("text"),
            "right": better == names[1] and truth_pct > 0, "wrong": better is not None and (truth_pct == 0
                                                                                       or better == names[0]),
            "within_10": better == names[1] and g is not None and abs(g - truth_pct) <= 10.0}


def run_sim(case: str, runs: int, design: str, drift: float, period: float, jitter: float, first_seed: int,
            knee: str = "itl") -> list:
    from knee_sim import SimHost, SimPreset, run

    ka, kb, _ = CASES[case]
    truth = (kb / ka - 1) * 100
    out = []
    for i in range(runs):
        seed = first_seed + i
        host = SimHost(drift=drift, period_s=period, jitter=jitter, seed=seed, phase=seed * 0.7, model=knee)
        result = run([SimPreset("weaker", ka), SimPreset("stronger", kb)], host, ladder=design == "ladder")
        v = tally_one(result.pairs[0].to_dict(), truth, ("weaker", "stronger"))
        rounds = max((d.round for d in result.duels), default=0) or 1
        v.update(run=i + 1, seed=seed, sim_s=round(host.now), uncertain=[n for n, k in result.knees.items()
                                                                          if k.get("uncertain")],
                 # simulated seconds of duel levels a round (rungs and second looks included)
                 duel_round_s=round(sum(d.seconds for d in result.duels) / rounds, 1),
                 # duel levels measured a round, and rungs skipped (paired_sweep.ladder_round: a live bracket
                 # one step wide above a knee that passed: a row that says so, nothing measured)
                 duel_levels_round=round(sum(1 for d in result.duels if not getattr(d, "skipped", "")) / rounds, 2),
                 rungs_skipped=sum(1 for d in result.duels if getattr(d, "skipped", "")))
        out.append(v)
    return out


def write_presets(path: Path, ka: int, kb: int, drift: float, period: float, jitter: float, jitter_ms: float,
                  port: int, scale: float = 1.0) -> tuple[str, str]:
    from paced_presets import paced_preset
    from vllm_support import tiny_model_dir

    body = ""
    for i, (name, knee) in enumerate((("weaker", ka), ("stronger", kb))):
        env = {"PACED_SLOTS": "512", "PACED_TTFT_MS": f"{PACED_TTFT_MS * scale:g}",
               "PACED_ITL_MS": f"{PACED_ITL_MS * scale:g}", "PACED_ITL_SCALE_KNEE": str(knee),
               "PACED_DRIFT": str(drift), "PACED_DRIFT_PERIOD_S": str(period), "PACED_TAIL_JITTER": str(jitter),
               "PACED_TAIL_JITTER_MS": str(jitter_ms)}
        body += paced_preset(name, tiny_model_dir(), port + i, env)
    path.write_text(body)
    return "weaker", "stronger"


def schedule(plan: dict[str, int], rotate: int = 0) -> list[str]:
    """The cases of a batch in the order they run: each case's runs spread
    evenly over the batch (its i-th run at (i + 1/2) / n of the way), ties
    in the plan's order. {aa: 2, 25: 2, 10: 1}: aa 25 10 aa 25. So a busy
    spell of the shared box falls on every case alike, not on one case's
    block of runs. `rotate` starts it that many runs in (wrapping round):
    streams run side by side with different rotations are at different
    cases at any moment, so a busy spell does not land on one case in all."""
    slots = [((i + 0.5) / n, k, case) for k, (case, n) in enumerate(plan.items()) for i in range(n)]
    order = [case for _, _, case in sorted(slots)]
    k = rotate % len(order) if order else 0
    return order[k:] + order[:k]


def parse_plan(text: str) -> dict[str, int]:
    """'aa=10,25=10,10=5' -> {'aa': 10, '25': 10, '10': 5}; ValueError on a case not in CASES."""
    plan: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        case, _, n = part.partition("=")
        if case not in CASES or not n.isdigit():
            raise ValueError(f"--plan: {part!r} is not CASE=N with CASE one of {', '.join(CASES)}")
        plan[case] = int(n)
    return plan


def last_start(hhmm: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """HH:MM UTC today (tomorrow where that has passed by more than 12 hours)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    h, m = (int(x) for x in hhmm.split(":"))
    t = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return t + datetime.timedelta(days=1) if (now - t).total_seconds() > 12 * 3600 else t


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def not_compared(paired: dict) -> str:
    """Why a run has no pair verdict, from its export (the searches' stops and the notes)."""
    stops = "; ".join(f"{s.get('preset')}: {s.get('stop')} after {s.get('levels')} levels"
                      for s in paired.get("searches") or [])
    return "not compared: " + " | ".join(filter(None, [*(paired.get("notes") or []), stops]))


def paced_record(paired: dict, truth: float, names: tuple[str, str]) -> dict:
    """One run's line from its export: the tally, the interval, each
    preset's round-0 search (capacity, stop, levels, doubts) and knees by
    round, so a wrong, held-back or uncompared run can be read from it."""
    pair = paired["pairs"][0] if paired.get("pairs") else {}
    v = tally_one(pair, truth, names)
    if not pair:
        v["text"] = not_compared(paired)
    elif pair.get("gap_pct") is None:  # a pair with no round measured on both: say why
        v["text"] = f"{pair.get('text')} | {not_compared(paired)}"
    v["interval"] = pair.get("gap_pct")
    v["held_back_why"] = pair.get("held_back")
    v["uncertain"] = [n for n, k in (paired.get("knees") or {}).items() if k.get("uncertain")]
    v["knees"] = {n: k.get("knees") for n, k in (paired.get("knees") or {}).items()}
    v["searches"] = [{k: s.get(k) for k in ("preset", "capacity", "stop", "levels", "duel_load", "final_knee",
                                                         "doubts")}
                     for s in paired.get("searches") or []]
    v["notes"] = paired.get("notes") or []
    return v


def keep_records(export: dict, keep: Path) -> list[str]:
    """Copy the run records of an export's searches (each level's readings:
    load, verdict, percentiles, the client's lag) into `keep`; their ids."""
    from ernie_tui import paths

    ids = [r.get("record_id") for row in export.get("rows") or [] for r in row.get("runs") or []]
    kept = []
    for rid in filter(None, ids):
        src = paths.runs_dir() / f"{rid}.json"
        if src.exists():
            (keep / src.name).write_bytes(src.read_bytes())
            kept.append(rid)
    return kept


def run_paced(plan: dict[str, int], drift: float, period: float, jitter: float, jitter_ms: float, port: int,
              extra: list[str], scale: float = 1.0, json_path: str | None = None, keep: Path | None = None,
              timeout_s: float = 1200.0, rotate: int = 0, last_start: datetime.datetime | None = None) -> list:
    """Each run of schedule(plan): two stand-ins (weaker, stronger) on
    `port` and the next, `ernie-tui sweep --capacity` on them; its line is
    appended to json_path as soon as it ends."""
    tmp = Path(tempfile.mkdtemp(prefix="verdict-cal-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "src")
    slo = ["--slo", f"ttft_p99={SLO_TTFT_MS * scale:g}ms", "--slo", f"itl_p99={SLO_ITL_MS * scale:g}ms"]
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    out = []
    done: dict[str, int] = {}
    for seq, case in enumerate(schedule(plan, rotate), 1):
        if last_start and datetime.datetime.now(datetime.timezone.utc) > last_start:
            print(f"  past {last_start:%H:%M} UTC: no more runs ({seq - 1} of {sum(plan.values())} made)", flush=True)
            break
        done[case] = done.get(case, 0) + 1
        ka, kb, _ = CASES[case]
        truth = (kb / ka - 1) * 100
        presets = tmp / f"presets-{case}.toml"
        names = write_presets(presets, ka, kb, drift, period, jitter, jitter_ms * scale, port, scale)
        started = datetime.datetime.now(datetime.timezone.utc)
        tag = f"{started:%H%M%S}-{case}-{port}"
        export = (keep or tmp) / f"{tag}.json"
        cmd = [sys.executable, "-m", "ernie_tui", "sweep", *names, "--presets", str(presets),
               "--capacity", "--out", str(export), "--max-tokens", "32", "--min-tokens", "10", "--max-tokens-in",
               "40", "--client-procs", "1", "--ready-timeout", "60", *slo, *extra]
        load0 = loadavg()
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = None, str(exc.stdout or ""), f"timed out after {timeout_s:.0f} s"
        wall = time.monotonic() - t0
        if keep:
            (keep / f"{tag}.out").write_text(stdout + "\n--- stderr ---\n" + stderr)
        if export.exists():
            data = json.loads(export.read_text())
            v = paced_record(data["paired"], truth, names)
            v["records"] = keep_records(data, keep) if keep else []
        else:
            v = {"better": None, "gap_pct": None, "text": f"no export (rc {rc}): {stderr[-300:]}", "right": False,
                 "wrong": False, "within_10": False, "held_back": False}
        v.update(case=case, run=done[case], seq=seq, port=port, started=started.isoformat(timespec="seconds"),
                 wall_s=round(wall), load_start=load0, load_end=loadavg(), rc=rc, time_scale=scale,
                 export=str(export) if keep and export.exists() else None, stand="paced", design="ladder")
        out.append(v)
        if json_path:
            with open(json_path, "a") as f:
                f.write(json.dumps(v) + "\n")
        print(f"  {case} run {done[case]} ({seq}/{sum(plan.values())}): {v['text']} ({wall:.0f} s, "
              f"load {load0[0]:.1f} -> {v['load_end'][0]:.1f})", flush=True)
    return out


def summary(case: str, vs: list) -> str:
    n = len(vs)
    if case == "aa":
        return (f"A/A: within noise {sum(1 for v in vs if v['better'] is None)} of {n} (held back by a knee "
                f"check: {sum(v['held_back'] for v in vs)}); beyond noise (wrong) {sum(v['wrong'] for v in vs)}")
    return (f"{case} %: wrong beyond noise {sum(v['wrong'] for v in vs)} of {n}; right beyond noise "
            f"{sum(v['right'] for v in vs)}, with its gap within 10 points {sum(v['within_10'] for v in vs)}; "
            f"within noise {sum(1 for v in vs if v['better'] is None)} (held back by a knee check: "
            f"{sum(v['held_back'] for v in vs)})")


def beyond_stand_in(level: dict, knee: int, scale: float, drift: float = 0.3,
                    jitter_ms: float = PACED_JITTER_MS) -> bool:
    """Whether a failed level read more than its stand-in can make: the
    stand-in's slowest gap at that concurrency (itl x max(1, C / K) x
    (1 + drift)) plus a tail spike, with 10 % to spare; or a TTFT p99 over
    its limit (the stand-in's TTFT is 20 ms x scale x the drift, no queue).
    Such a fail came from the box (the client's or a server thread's stall),
    not from the stand-in's knee."""
    if level.get("passed"):
        return False
    c = float(level.get("concurrency") or 0)
    worst = PACED_ITL_MS * scale * max(1.0, c / knee) * (1 + drift) + jitter_ms * scale
    itl, ttft = level.get("itl_p99_ms") or 0.0, level.get("ttft_p99_ms") or 0.0
    return itl > 1.1 * worst or ttft > SLO_TTFT_MS * scale


def box_fails(v: dict, keep: Path) -> tuple[int, int] | None:
    """(search levels failed beyond the stand-ins' reach, search levels
    failed) of one run's line, from its records kept in `keep`; None where
    none is kept."""
    ka, kb, _ = CASES[v["case"]]
    knees = {"weaker": ka, "stronger": kb}
    beyond = failed = 0
    found = False
    for rid in v.get("records") or []:
        path = keep / f"{rid}.json"
        if not path.exists():
            continue
        found = True
        rec = json.loads(path.read_text())
        knee = knees.get(rec.get("preset", {}).get("name"), ka)
        for lv in rec["results"].get("levels") or []:
            if not lv.get("passed"):
                failed += 1
                beyond += beyond_stand_in(lv, knee, v.get("time_scale") or 1.0)
    return (beyond, failed) if found else None


def uncompared(v: dict) -> bool:
    """A run that gave no comparison: no pair, no round measured on both, or no export."""
    text = str(v.get("text") or "")
    return text.startswith(("not compared", "no export")) or "not enough rounds measured" in text


# case -> the goal, as (runs, what is counted, the bound)
GOALS = {"aa": "within noise in at least 19 of 20", "25": "wrong 0 of 20; right beyond noise, gap within 10 "
         "points, in at least 16 of 20", "10": "wrong 0 of 10"}


def counts(vs: list) -> dict:
    """The tallies of one case's runs."""
    return {"runs": len(vs), "within_noise": sum(1 for v in vs if v.get("better") is None),
            "wrong": sum(bool(v.get("wrong")) for v in vs), "right": sum(bool(v.get("right")) for v in vs),
            "within_10": sum(bool(v.get("within_10")) for v in vs),
            "held_back": sum(bool(v.get("held_back")) for v in vs),
            "not_compared": sum(1 for v in vs if uncompared(v)),
            "wall_s": sorted(v["wall_s"] for v in vs if v.get("wall_s") is not None)}


def meets(case: str, c: dict) -> bool | None:
    """Whether a case's counts meet its goal, scaled to the runs made
    (at most 1 in 20 not within noise for A/A; 16 in 20 right for 25 %);
    None without runs."""
    n = c["runs"]
    if not n:
        return None
    if case == "aa":
        return c["within_noise"] >= n - n // 20
    if case == "25":
        return c["wrong"] == 0 and c["within_10"] >= 0.8 * n
    return c["wrong"] == 0


def summarise(lines: list[dict]) -> str:
    """The count table of a batch's JSON lines against the issue's goals,
    then every run that was wrong, held back or not compared, from its line."""
    out = ["| case | runs | within noise | wrong | right (gap within 10) | held back | not compared | wall, s "
           "(median, max) | goal | met |", "|---|---|---|---|---|---|---|---|---|---|"]
    for case in CASES:
        vs = [v for v in lines if v.get("case") == case]
        if not vs:
            continue
        c = counts(vs)
        w = c["wall_s"]
        wall = f"{w[len(w) // 2]}, {w[-1]}" if w else "–"
        ok = meets(case, c)
        out.append(f"| {case} | {c['runs']} | {c['within_noise']} | {c['wrong']} | {c['right']} ({c['within_10']}) "
                   f"| {c['held_back']} | {c['not_compared']} | {wall} | {GOALS[case]} | "
                   f"{'yes' if ok else 'no'} |")
    boxed = {id(v): box_fails(v, Path(v["export"]).parent) for v in lines if v.get("export")}
    seen = [b for b in boxed.values() if b]
    if seen:
        out.append(f"\nsearch levels failed beyond what the stand-in can make (the box's stalls): "
                   f"{sum(b[0] for b in seen)} of {sum(b[1] for b in seen)} failed levels, in "
                   f"{sum(1 for b in seen if b[0])} of {len(seen)} runs")
    loads = [x for v in lines for x in (v.get("load_start") or [])[:1] + (v.get("load_end") or [])[:1]]
    if loads:
        out.append(f"\nload average (1 min) at runs' starts and ends: {min(loads):.1f} to {max(loads):.1f}")
    odd = [v for v in lines if v.get("wrong") or v.get("held_back") or v.get("right") and not v.get("within_10")
           or v.get("better") is None and v.get("case") != "aa"
           or uncompared(v)]
    if odd:
        out.append("\nruns to read (wrong; held back; a true gap within noise or not compared; right but more "
                   "than 10 points off):")
        for v in odd:
            b = boxed.get(id(v))
            box = f"; search levels failed by the box {b[0]} of {b[1]}" if b else ""
            out.append(f"- {v.get('case')} run {v.get('run')} (port {v.get('port')}, {v.get('started')}, "
                       f"{v.get('wall_s')} s, load {(v.get('load_start') or ['?'])[0]} -> "
                       f"{(v.get('load_end') or ['?'])[0]}): {v.get('text')}; knees {v.get('knees')}{box}")
    return "\n".join(out)


def show(export_path: Path) -> str:
    """One kept run, level by level: each preset's search (from its record,
    kept beside the export) and the duel rounds' rungs."""
    data = json.loads(export_path.read_text())
    out = []
    for row in data.get("rows") or []:
        for r in row.get("runs") or []:
            rec = export_path.parent / f"{r.get('record_id')}.json"
            if not rec.exists():
                out.append(f"{row.get('preset')}: no record kept")
                continue
            res = json.loads(rec.read_text())["results"]
            out.append(f"{row.get('preset')} search: {res.get('stop_reason')} "
                       f"(capacity {(res.get('capacity') or {}).get('concurrency')})")
            for lv in res.get("levels") or []:
                out.append(f"  {lv.get('concurrency')}: {lv.get('verdict')} ({lv.get('stop')}, "
                           f"{lv.get('seconds') or 0:.1f} s, {lv.get('requests')} req) itl p99 "
                           f"{lv.get('itl_p99_ms') or 0:.1f} ms, ttft p99 {lv.get('ttft_p99_ms') or 0:.1f} ms, "
                           f"client lag p99/max {lv.get('client_lag_p99_ms') or 0:.0f}/"
                           f"{lv.get('client_lag_max_ms') or 0:.0f} ms")
    paired = data.get("paired") or {}
    for d in paired.get("duels") or []:
        out.append(f"round {d['round']} {d['preset']} {d['step']} at {d['load']:g}: {d['verdict']} "
                   f"({d['seconds']:.1f} s, {d.get('output_tps') or 0:.0f} tok/s, adjusted "
                   f"{d.get('adjusted') or 0:.3f})")
    for pair in paired.get("pairs") or []:
        out.append(f"verdict: {pair.get('text')} (held back: {pair.get('held_back')})")
    for name, k in (paired.get("knees") or {}).items():
        out.append(f"{name}: knees {k.get('knees')}, uncertain {k.get('uncertain')} {k.get('why')}; round 0 doubts "
                   f"{k.get('round0_doubts')}")
    return "\n".join(out)


def read_lines(paths: list[str]) -> list[dict]:
    lines = []
    for path in paths:
        lines += [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stand", choices=("sim", "paced"), default="sim")
    p.add_argument("--case", choices=(*CASES, "all"), default="all")
    p.add_argument("--runs", type=int, default=None, help="runs a case (sim: 20, 20, 10; paced: 1)")
    p.add_argument("--plan", metavar="CASE=N,...", help="paced: a batch, e.g. aa=10,25=10,10=5, its cases taking "
                   "turns (overrides --case and --runs)")
    p.add_argument("--rotate", type=int, default=0, metavar="K", help="paced: start the plan's order K runs in "
                   "(streams side by side each get their own K)")
    p.add_argument("--last-start", metavar="HH:MM", help="paced: start no run after this time of day, UTC")
    p.add_argument("--summarise", nargs="+", metavar="FILE.jsonl", help="print the counts of these runs' lines "
                   "against the goals, and the runs to read; runs nothing")
    p.add_argument("--design", choices=("ladder", "fixed"), default="ladder", help="sim only: the duels' design")
    p.add_argument("--drift", type=float, default=0.3, help="host speed drift, +- share (0.3)")
    p.add_argument("--period", type=float, default=120.0, help="the drift's period, s (120)")
    p.add_argument("--jitter", type=float, default=0.15,
                   help="sim: the share of levels whose p99 spikes by 30-90 %%; paced: of 5 s "
                        "periods whose tail spikes (0.15)")
    p.add_argument("--jitter-ms", type=float, default=PACED_JITTER_MS,
                   help="paced: a spike's extra gap, ms at --time-scale 1 (15)")
    p.add_argument("--time-scale", type=float, default=1.0, help="paced: the stand-ins' ITL and TTFT (20 ms), "
                   "their spikes and the SLO's limits (ITL p99 50 ms, TTFT p99 500 ms) times this (1)")
    p.add_argument("--knee", choices=("itl", "queueing"), default="itl",
                   help="sim: the servers' knee: the paced stand-in's ITL knee, or a queueing knee (TTFT)")
    p.add_argument("--seed", type=int, default=0, help="sim: the first run's seed (0)")
    p.add_argument("--port", type=int, default=29451, help="paced: the stand-ins' ports, this and the next")
    p.add_argument("--json", metavar="FILE", help="append one JSON line per run here (paced: as each run ends)")
    p.add_argument("--keep", metavar="DIR", help="paced: keep each run's export and sweep output here")
    p.add_argument("--show", metavar="EXPORT.json", help="print one kept run (--keep) level by level; runs nothing")
    args, extra = p.parse_known_args()
    if args.show:
        print(show(Path(args.show)))
        return 0
    if args.summarise:
        print(summarise(read_lines(args.summarise)))
        return 0
    if args.stand == "paced":
        try:
            plan = parse_plan(args.plan) if args.plan else {c: args.runs or 1 for c in
                                                            (CASES if args.case == "all" else [args.case])}
        except ValueError as exc:
            p.error(str(exc))
        t0 = time.monotonic()
        vs = run_paced(plan, args.drift, args.period, args.jitter, args.jitter_ms, args.port, extra,
                       args.time_scale, args.json, Path(args.keep) if args.keep else None, rotate=args.rotate,
                       last_start=last_start(args.last_start) if args.last_start else None)
        for case in plan:
            mine = [v for v in vs if v["case"] == case]
            if mine:
                print(f"[paced] {summary(case, mine)}", flush=True)
        print(f"[paced] {time.monotonic() - t0:.0f} s", flush=True)
        return 0
    cases = list(CASES) if args.case == "all" else [args.case]
    for case in cases:
        runs = args.runs or CASES[case][2]
        t0 = time.monotonic()
        vs = run_sim(case, runs, args.design, args.drift, args.period, args.jitter, args.seed, args.knee)
        for v in vs:
            v.update(case=case, stand=args.stand, design=args.design, knee=args.knee)
        if args.json:
            with open(args.json, "a") as f:
                f.writelines(json.dumps(v) + "\n" for v in vs)
        knee = f", {args.knee} knee" if args.stand == "sim" and args.knee != "itl" else ""
        print(f"[{args.stand}, {args.design}{knee}] {summary(case, vs)} ({time.monotonic() - t0:.0f} s)", flush=True)
        rounds_s = [v["duel_round_s"] for v in vs if v.get("duel_round_s")]
        if rounds_s:
            levels = [v.get("duel_levels_round", 0.0) for v in vs]
            print(f"    duel levels a round (simulated): mean {sum(rounds_s) / len(rounds_s):.1f} s, "
                  f"max {max(rounds_s):.1f} s; {sum(levels) / len(levels):.2f} levels a round, "
                  f"{sum(v.get('rungs_skipped', 0) for v in vs)} rungs skipped in {len(vs)} runs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
