"""The key footer, rebuilt only when the keys it shows change.

Textual's Footer recomposes (drops every FooterKey widget and makes new ones,
then a layout pass of the whole screen) each time its screen publishes
"bindings updated": on every focus change, on every return to the screen
(closing `?`), on every status update the dashboard refreshes bindings for.
Nearly always the keys are the same as before. Under a log flood each
rebuild cost a screen-wide layout and left the old widgets as reference
cycles for a full collection (docs/lab/benchmarks/tui-overhead.md, the `?` key's tail).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

if TYPE_CHECKING:
    from textual.screen import Screen


def shown_keys(screen: Screen, footer: KeyFooter | None = None) -> tuple:
    """What the footer draws from the screen's bindings: those with show set,
    and the command palette's, each with whether it is enabled and its
    tooltip (Binding is a frozen dataclass, so key, action, description and
    group all compare). Hidden bindings (a focused widget's scroll keys) can
    come and go without a rebuild. With a footer: its narrow choice too."""
    palette = screen.app.COMMAND_PALETTE_BINDING
    keys = tuple((key, active.binding, active.enabled, active.tooltip)
                 for key, active in screen.active_bindings.items() if active.binding.show or key == palette
                 or (footer is not None and active.binding.action in footer.extra))
    if footer is None:
        return keys
    return keys + (footer.narrow, tuple(sorted(footer.extra)), tuple(sorted(footer.labels.items())),
                   tuple(sorted(footer.left_out)))


class KeyFooter(Footer):
    """A Footer that skips the rebuild when the shown keys did not change.

    Narrow (an 80-column terminal): compact spacing, no palette key, and the
    actions in `optional` left out (the help screen lists them), so that
    `? Help` and `q Quit` stay on screen. `extra` names actions of hidden
    bindings to show all the same (`g` when the charts swap with the log);
    `labels` gives an action another description ("Log" while charts show);
    `left_out` names actions to leave out at this width all the same (`w`
    between 120 and 132 columns, where with `f Fix` it pushed `q Quit` off)."""

    _composed_keys: tuple | None = None

    def __init__(self, *, optional: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.optional = frozenset(optional)
        self.narrow = False
        self.extra: frozenset[str] = frozenset()
        self.labels: dict[str, str] = {}
        self.left_out: frozenset[str] = frozenset()

    def set_layout(self, *, narrow: bool, extra: frozenset[str] = frozenset(),
                   labels: dict[str, str] | None = None, left_out: frozenset[str] = frozenset()) -> None:
        labels = labels or {}
        if (narrow, extra, labels, left_out) != (self.narrow, self.extra, self.labels, self.left_out):
            self.narrow, self.extra, self.labels, self.left_out = narrow, extra, labels, left_out
            self.compact = narrow
            self.show_command_palette = not narrow
            if self._bindings_ready:
                self.refresh(recompose=True)

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        screen = self.screen
        self._composed_keys = shown_keys(screen, self)
        palette = self.app.COMMAND_PALETTE_BINDING
        seen: set[str] = set()
        for key, active in screen.active_bindings.items():
            binding = active.binding
            if key == palette or binding.action in seen:
                continue
            if not (binding.show or binding.action in self.extra):
                continue
            if (self.narrow and binding.action in self.optional) or binding.action in self.left_out:
                continue
            seen.add(binding.action)
            yield FooterKey(binding.key, self.app.get_key_display(binding),
                            self.labels.get(binding.action, binding.description), binding.action,
                            disabled=not active.enabled, tooltip=active.tooltip).data_bind(compact=Footer.compact)
        if self.show_command_palette and self.app.ENABLE_COMMAND_PALETTE and palette in screen.active_bindings:
            active = screen.active_bindings[palette]
            yield FooterKey(active.binding.key, self.app.get_key_display(active.binding),
                            active.binding.description, active.binding.action, classes="-command-palette",
                            disabled=not active.enabled,
                            tooltip=active.binding.tooltip or active.binding.description)

    def bindings_changed(self, screen: Screen) -> None:
        if (self._bindings_ready and self._composed_keys is not None and screen is self.screen
                and shown_keys(screen, self) == self._composed_keys):
            return
        super().bindings_changed(screen)
