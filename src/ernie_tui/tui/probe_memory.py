"""What the probe pane (`p`) had when it closed, kept for the session.

The pane is a new screen each time `p` opens it; it used to come back with
N=100 and no result. The app keeps one ProbeMemory (as it keeps the charts'
data outside their widgets) and hands it to each pane: the pane fills it as
it closes and reads it back as it opens. Fields come back always; the last
probe, burst and capacity search come back only for the same server (a
figure of another server beside this one's fields would mislead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from textual.widgets import Checkbox, Input, Select, TabbedContent, TextArea

if TYPE_CHECKING:
    from textual.css.query import DOMQuery
    from textual.widget import Widget

    from ernie_tui.tui.widgets.burst_tab import BurstTab
    from ernie_tui.tui.widgets.probe_tab import ProbeTab

# Set apart: switching the mode has its own method (BurstTab.set_mode).
CAPACITY_BOX = "pf-b-capacity"


def _value(widget: Any) -> Any:
    return widget.text if isinstance(widget, TextArea) else widget.value


class ProbePane(Protocol):
    """What keep/restore use of the probe pane (screens/probe.py's
    ProbeScreen). Named here, not imported: the screen imports this module,
    and an import back, even a type-only one, made the tree's one circle."""

    url: str

    @property
    def probe_tab(self) -> ProbeTab: ...

    @property
    def burst_tab(self) -> BurstTab: ...

    def query(self, selector: str) -> DOMQuery[Widget]: ...

    def query_one(self, selector: type[TabbedContent]) -> TabbedContent: ...


@dataclass
class ProbeMemory:
    fields: dict[str, Any] = field(default_factory=dict)  # widget id -> value
    tab: str | None = None  # the tab in view
    url: str | None = None  # the server the results below came from
    probe: Any = None  # ProbeResult
    burst: Any = None  # burst_tab.Shown
    capacity: Any = None  # burst_tab.Shown
    folded: bool = False  # the capacity search's fields folded away

    def keep(self, screen: ProbePane) -> None:
        """Take the pane's fields and results as it closes."""
        self.fields = {w.id: _value(w) for w in screen.query("Input, Checkbox, Select, TextArea")
                       if w.id and not (isinstance(w, Select) and w.value is Select.BLANK)}
        self.tab = screen.query_one(TabbedContent).active
        burst_tab = screen.burst_tab
        self.url = screen.url
        self.probe = screen.probe_tab.last_probe
        self.burst, self.capacity = burst_tab.shown_burst, burst_tab.shown_capacity
        self.folded = burst_tab.folded

    def restore(self, screen: ProbePane) -> None:
        """Give a new pane the fields (and, for the same server, the results) kept."""
        for wid, value in self.fields.items():
            found = screen.query(f"#{wid}")
            if not found:
                continue
            widget = found.first()
            if isinstance(widget, TextArea):
                widget.load_text(value)
            elif isinstance(widget, Checkbox) and wid == CAPACITY_BOX:
                with widget.prevent(Checkbox.Changed):
                    widget.value = value
                screen.burst_tab.set_mode(bool(value))
            elif isinstance(widget, (Input, Checkbox, Select)):
                widget.value = value
        # (the tab: the pane opens on it, ProbeScreen.compose; set here too it raced with `k`'s)
        if self.url != screen.url:
            return
        if self.probe is not None:
            screen.probe_tab.show_result(self.probe)
        burst_tab = screen.burst_tab
        if self.burst is not None:
            burst_tab.show_burst(self.burst.result, self.burst.record, self.burst.record_path, self.burst.error)
        if self.capacity is not None:
            c = self.capacity
            burst_tab.show_capacity(c.result, c.record, c.record_path, c.error)
        burst_tab.fold(self.folded)
