"""The key footer, rebuilt only when the keys it shows change.

Textual's Footer recomposes (drops every FooterKey widget and makes new ones,
then a layout pass of the whole screen) each time its screen publishes
"bindings updated": on every focus change, on every return to the screen
(closing `?`), on every status update the dashboard refreshes bindings for.
Nearly always the keys are the same as before. Under a log flood each
rebuild cost a screen-wide layout and left the old widgets as reference
cycles for a full collection (docs/benchmarks.md, the `?` key's tail).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.widgets import Footer

if TYPE_CHECKING:
    from textual.screen import Screen


def shown_keys(screen: Screen) -> tuple:
    """What the footer draws from the screen's bindings: those with show set,
    and the command palette's, each with whether it is enabled and its
    tooltip (Binding is a frozen dataclass, so key, action, description and
    group all compare). Hidden bindings (a focused widget's scroll keys) can
    come and go without a rebuild."""
    palette = screen.app.COMMAND_PALETTE_BINDING
    return tuple((key, active.binding, active.enabled, active.tooltip)
                 for key, active in screen.active_bindings.items() if active.binding.show or key == palette)


class KeyFooter(Footer):
    """A Footer that skips the rebuild when the shown keys did not change."""

    _composed_keys: tuple | None = None

    def compose(self) -> ComposeResult:
        if self._bindings_ready:
            self._composed_keys = shown_keys(self.screen)
        yield from super().compose()

    def bindings_changed(self, screen: Screen) -> None:
        if (self._bindings_ready and self._composed_keys is not None and screen is self.screen
                and shown_keys(screen) == self._composed_keys):
            return
        super().bindings_changed(screen)
