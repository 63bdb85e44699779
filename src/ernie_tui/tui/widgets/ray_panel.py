"""The Ray panel of the tune screen and the fleet view (`--ray`): the
cluster's nodes and, under each, the trials running there with their
servers' URLs.

    Ray 127.0.0.1:6379 · 2 nodes alive, 1 lost · 2 trials running
    ● 127.0.0.1 5f3a9c0e1b2d  alive  CPU 1, trial_slot 1
      └ shaped-tune-3 r0  http://127.0.0.1:18601  capacity: concurrency 2
    ✖ 127.0.0.1 9a8b7c6d5e4f  LOST   CPU 1, trial_slot 1

A trial running again after its node was lost says so on its line ("again:
lost 127.0.0.1 9a8b7c6d5e4f"). Lines never wrap (a narrow terminal cuts
them with an ellipsis) and the panel keeps to MAX_LINES, saying how many
more there are: the trials table below keeps its room at 80x24.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ernie_tui.engine_ctl.control import RaySnapshot, RayTrialView

MAX_LINES = 8


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _trial_line(t: RayTrialView, indent: str) -> Text:
    line = Text(f"{indent}└ ", style="dim")
    line.append(f"{t.trial} r{t.repeat}", style="bold")
    line.append(f"  {t.url or 'no port yet'}  ")
    line.append(t.phase, style="cyan")
    if t.retried_after_node_loss:
        line.append(f"  again: lost {', '.join(t.lost)}", style="yellow")
    return line


def snapshot_lines(snap: RaySnapshot) -> list[Text]:
    """The panel's lines for a snapshot (before MAX_LINES is applied)."""
    head = Text(f"Ray {snap.address}", style="bold")
    if snap.error:
        head.append(f" · cannot ask the cluster: {snap.error}", style="red")
        return [head]
    alive = sum(1 for n in snap.nodes if n.alive)
    lost = len(snap.nodes) - alive
    head.append(f" · {_plural(alive, 'node')} alive")
    if lost:
        head.append(f", {lost} lost", style="red")
    head.append(f" · {_plural(len(snap.trials), 'trial')} running")
    lines = [head]
    for node in snap.nodes:
        line = Text("● " if node.alive else "✖ ", style="green" if node.alive else "bold red")
        line.append(node.label)
        line.append("  alive  " if node.alive else "  LOST   ", style="green" if node.alive else "bold red")
        line.append(node.resources_words, style="dim")
        lines.append(line)
        lines += [_trial_line(t, "  ") for t in snap.trials_on(node)]
    for t in snap.unplaced():
        lines.append(_trial_line(t, "  ").append(f"  on {t.node}", style="dim"))
    return lines


class RayPanel(Static):
    """The cluster as the latest RayStatus message showed it."""

    DEFAULT_CSS = """
    RayPanel {
        height: auto;
        max-height: 9;
        padding: 0 1;
        border-top: solid $primary 30%;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, address: str = "", **kwargs) -> None:
        super().__init__(Text(f"Ray {address} · asking the cluster …", style="dim"), **kwargs)
        self.snapshot: RaySnapshot | None = None
        self._shown = ""

    def show(self, snap: RaySnapshot) -> None:
        self.snapshot = snap
        lines = snapshot_lines(snap)
        if len(lines) > MAX_LINES:
            more = len(lines) - (MAX_LINES - 1)
            lines = [*lines[:MAX_LINES - 1], Text(f"… {more} more lines (nodes and trials)", style="dim")]
        text = Text("\n").join(lines)
        if text.plain != self._shown:  # an unchanged cluster costs no repaint
            self._shown = text.plain
            self.update(text)
