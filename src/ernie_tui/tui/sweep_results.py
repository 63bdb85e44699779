"""What a finished sweep says on the sweep screen, and in its record: the
Done line, the paired verdicts in the screen's order, and the record's
meta. (A preset never measured, or measured and in no pair, reads in the
table as the exported table words it: engine_ctl's fold and paired_rows.)

Pure (Textual's Content for styled text, nothing drawn here). Why each is
as it is (issue 59): the record said "repeat 1" for a sweep of 3 duel
rounds; a preset that preflight skipped read "within noise", as if compared;
at 80x24 the Done line ran to four lines and the ranking was cut.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.content import Content

from ernie_tui.engine_ctl.control import CapacitySweep, SweepRow, SweepRun, sweep_meta
from ernie_tui.engine_ctl.load import BurstConfig
from ernie_tui.tui.messages import SweepFinished
from ernie_tui.tui.sweep_progress import rounds_run


def record_meta(names: list[str], repeat: int, config: BurstConfig, runs: list[SweepRun],
                capacity: CapacitySweep | None, paired: Any) -> dict[str, Any]:
    """What the sweep's record and exports say of it (sweep_meta): a paired
    sweep's repeat is the duel rounds it ran (`repeat` asked for them), as
    `runs list` and `runs show` then read it."""
    if paired is None:
        return sweep_meta(names, repeat, config, runs, capacity=capacity)
    ran = rounds_run(paired)
    meta = sweep_meta(names, ran, config, runs, capacity=capacity)
    rounds = f"{ran} rounds" if ran == repeat else f"{ran} of {repeat} duel rounds"
    meta.update(mode=f"paired: {rounds}, levels alternating between presets", servers=paired.co_residency)
    return meta


def home_short(path: str) -> str:
    """`path` with the home directory as ~ (an 80-column line holds it)."""
    home = str(Path.home())
    return "~" + path[len(home):] if path == home or path.startswith(home + "/") else path


def measured(row: SweepRow) -> bool:
    return any(r.status == "ok" for r in row.runs)


def verdict_lines(lines: list[str]) -> list[Content]:
    """A paired sweep's summary lines for the screen: the ranking first and
    bold (the answer), then the pairs' verdicts and the rest in their order."""
    ranking = [line for line in lines if line.startswith("Ranking")]
    rest = [line for line in lines if not line.startswith("Ranking")]
    return [Content.styled(line, "bold") for line in ranking] + [Content(line) for line in rest]


def done_line(runs: list[SweepRun], message: SweepFinished, elapsed: str) -> Content:
    """The sweep's last word: Done or Cancelled with what it measured, then
    what broke and where its record and logs are, in as few lines as wrap."""
    ok = sum(1 for r in runs if r.status == "ok")
    stopped = "the servers were stopped" if message.paired is not None else "the server was stopped"
    head = (f"Cancelled: {stopped}; " if message.cancelled else "Done: ") + \
        f"{len(runs)} run(s), {ok} measured, in {elapsed}."
    style = "bold $warning" if message.cancelled or not ok else "bold $success"
    parts = [Content.styled(head + (" Nothing was measured: see why below." if runs and not ok else ""), style)]
    if message.error:
        parts.append(Content.styled(message.error, "$error"))
    if message.record:
        parts.append(Content.assemble(("Run record ", "dim"), message.record, (".", "dim")))
    return Content(" ").join(parts)
