"""Small form pieces shared by the probe pane's tabs and the sweep screen."""

from __future__ import annotations

from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Input, Label


def labelled(label: str, widget: Widget, classes: str = "pf-field") -> Vertical:
    """A field: its label above the widget."""
    return Vertical(Label(label), widget, classes=classes)


def read_int(field: Input, what: str) -> int:
    """A whole number from a field, or ValueError in plain words."""
    raw = field.value.strip()
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{what} must be a whole number, got {raw!r}") from None


def read_float(field: Input, what: str) -> float:
    """A number from a field, or ValueError in plain words."""
    raw = field.value.strip()
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {raw!r}") from None
