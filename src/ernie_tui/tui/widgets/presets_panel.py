"""The presets panel: every preset, numbered for the 1-9 keys, the active one
marked, and the highlighted one's description underneath."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

ACTIVE_MARK = {"ready": "●", "starting": "◐", "stopping": "◑", "crashed": "✖", "stopped": "○"}


class PresetsPanel(Vertical):
    @dataclass
    class Chosen(Message):
        """Enter (or a click) on a preset: switch to it."""

        name: str

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._composed = False
        self._names: list[str] = []
        self._book = None
        self._active: str | None = None
        self._active_state = "stopped"
        self._room = 0  # columns an option has (0: not laid out yet)

    def compose(self) -> ComposeResult:
        yield OptionList(id="preset-list")
        yield Static("", id="preset-desc")

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def highlighted_name(self) -> str | None:
        ol = self.query_one(OptionList)
        if ol.highlighted is None or not self._names:
            return None
        return self._names[ol.highlighted]

    def set_book(self, book, highlight: str | None = None) -> None:
        """In the book's key order (presets/loader.py, PresetBook.key_order):
        --presets files, the built-ins, then the user's file, so that a preset
        `tune` or the fix writes goes last and no key an operator has learned
        moves (the user's file once came first: a tuned preset took key 1 and
        pushed every built-in down one)."""
        self._book = book
        self._names = book.key_order()
        self._rebuild(highlight)

    def set_active(self, name: str | None, state: str) -> None:
        if (name, state) != (self._active, self._active_state):
            self._active, self._active_state = name, state
            self._rebuild()

    def highlight(self, name: str) -> None:
        if name in self._names:
            self.query_one(OptionList).highlighted = self._names.index(name)

    def _prompt(self, index: int, name: str) -> Content:
        preset = self._book.get(name)
        key = str(index + 1) if index < 9 else " "
        active = name == self._active
        mark = ACTIVE_MARK.get(self._active_state, "●") if active else " "
        summary = preset.key_args()
        parts = [
            (f"{key} ", "bold $accent"),
            (f"{mark} ", "bold $success" if active and self._active_state == "ready"
             else "bold $error" if active and self._active_state == "crashed"
             else "bold $warning" if active else ""),
            (name, "bold" if active else ""),
        ]
        if summary:
            one_line = len(key) + 3 + len(name) + 2 + len(summary)
            # Too narrow for one line (an 80-column terminal): the arguments,
            # which tell presets apart, go whole on a line of their own.
            sep = "\n    " if self._room and one_line > self._room else "  "
            parts.append((sep + summary, "dim"))
        return Content.assemble(*parts)

    def _rebuild(self, highlight: str | None = None) -> None:
        if self._book is None or not self._composed:
            return
        ol = self.query_one(OptionList)
        keep = highlight or self.highlighted_name or self._active
        ol.set_options([Option(self._prompt(i, n), id=n) for i, n in enumerate(self._names)])
        if keep in self._names:
            ol.highlighted = self._names.index(keep)
        elif self._names:
            ol.highlighted = 0
        self._describe()

    def on_mount(self) -> None:
        self._composed = True
        self._rebuild()

    def on_resize(self) -> None:
        room = self.size.width - 1  # the option list's scrollbar gutter aside
        if room != self._room:
            self._room = room
            self._rebuild()

    @on(OptionList.OptionHighlighted)
    def _describe(self, event: OptionList.OptionHighlighted | None = None) -> None:
        name = self.highlighted_name
        desc = self.query_one("#preset-desc", Static)
        if name is None or self._book is None:
            desc.update("")
            return
        preset = self._book.get(name)
        source = "" if preset.source == "built-in" else f" ({preset.source})"
        desc.update(Content.assemble((preset.description or "no description", "italic"), (source, "dim")))

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.post_message(self.Chosen(event.option.id))
