"""Modal dialogs: confirm, quit (stop or leave running), the exact command line."""

from __future__ import annotations

import shlex

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from ernie_tui.engine_ctl.logs import Severity


class ConfirmScreen(ModalScreen[bool]):
    """Yes / no. `y`/Enter confirm, `n`/Escape cancel."""

    # The first button takes the focus through Textual's AUTO_FOCUS (applied as
    # the screen resumes, by a query that may match nothing), not a query_one in
    # on_mount: a key the app handles can dismiss a dialog before the dialog's
    # own Mount is handled, and its buttons are gone by then (CI: NoMatches '#fix').
    AUTO_FOCUS = "#yes"

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, title: str, body: str | Content, yes: str = "Yes", no: str = "Cancel"):
        super().__init__(classes="dialog-screen")
        self._title, self._body, self._yes, self._no = title, body, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._title, classes="dialog-title")
            yield Static(self._body, classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self._yes} (y)", variant="warning", id="yes")
                yield Button(f"{self._no} (n)", id="no")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class QuitScreen(ModalScreen[str]):
    """Quit in control mode with a server running: stop it, leave it, or cancel."""

    AUTO_FOCUS = "#stop"

    BINDINGS = [
        Binding("s", "choose('stop')", "Stop server"),
        Binding("l", "choose('leave')", "Leave running"),
        Binding("escape,c", "choose('cancel')", "Cancel"),
    ]

    def __init__(self, preset: str | None, url: str, pid: int | None):
        super().__init__(classes="dialog-screen")
        self._preset, self._url, self._pid = preset, url, pid

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Quit ernie-tui", classes="dialog-title")
            yield Static(Content.assemble(
                "The server ", (self._preset or "?", "bold"), f" is running at {self._url}",
                f" (pid {self._pid}).\n" if self._pid else ".\n",
                "Stop it, or leave it running? Plain ", ("ernie-tui", "bold"), " takes it back later; ",
                ("ernie-tui stop", "bold"), " stops it from the shell."), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Stop server (s)", variant="error", id="stop")
                yield Button("Leave running (l)", variant="primary", id="leave")
                yield Button("Cancel (esc)", id="cancel")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")


class PreflightScreen(ModalScreen[str]):
    """Preflight found errors before launch: apply the fix, launch anyway, or not."""

    AUTO_FOCUS = "#fix, #cancel"  # the first in DOM order: Apply fix when offered, else Cancel

    BINDINGS = [
        Binding("f", "choose('fix')", "Apply fix"),
        Binding("y", "choose('anyway')", "Launch anyway"),
        Binding("n,escape", "choose('cancel')", "Cancel"),
    ]

    def __init__(self, preset: str, problems: list, fix_summary: str | None, *, stops: str | None = None):
        super().__init__(classes="dialog-screen")
        self._preset, self._problems, self._fix = preset, problems, fix_summary
        self._stops = stops  # what is serving now, which either launch stops

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide"):
            yield Label(f"Preflight: vLLM would refuse {self._preset}", classes="dialog-title")
            rows = []
            for p in self._problems:
                kind = getattr(p.kind, "value", str(p.kind))
                rows.append(Content.assemble(("✖ " if p.severity == Severity.ERROR else "! ",
                                              "bold $error" if p.severity == Severity.ERROR else "bold $warning"),
                                             (kind, "bold"), f"  {p.message}"))
            yield Static(Content("\n").join(rows), classes="dialog-body")
            if self._fix:
                yield Static(Content.assemble(("fix  ", "dim"), (self._fix, "bold"),
                                              (f"  → saved as {self._preset.removesuffix('-fixed')}-fixed", "dim")),
                             classes="dialog-body")
            if self._stops:
                yield Static(Content.assemble(("Launching either way stops ", "dim"), (self._stops, "bold")),
                             classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                if self._fix:
                    yield Button("Apply fix and launch (f)", variant="success", id="fix")
                yield Button("Launch anyway (y)", variant="warning", id="anyway")
                yield Button("Cancel (n)", id="cancel")

    def action_choose(self, choice: str) -> None:
        if choice == "fix" and not self._fix:
            return
        self.dismiss(choice)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")


class CommandLineScreen(ModalScreen[None]):
    """The exact argv and environment of a preset, to read or copy."""

    BINDINGS = [
        Binding("escape,q,c", "dismiss_screen", "Close"),
        Binding("y", "copy", "Copy"),
    ]

    def __init__(self, preset_name: str, argv: list[str], env: dict[str, str]):
        super().__init__(classes="dialog-screen")
        self._name = preset_name
        env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        self.command = (env_part + " " if env_part else "") + shlex.join(argv)
        self._argv = argv
        self._env = env

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide"):
            yield Label(f"Command line of preset {self._name}", classes="dialog-title")
            yield Static(self.command, id="cmdline", classes="dialog-code")
            env = ", ".join(f"{k}={v}" for k, v in self._env.items()) or "none"
            yield Static(Content.assemble(("argv ", "dim"), f"{len(self._argv)} items, run without a shell",
                                          ("   env additions ", "dim"), env), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Copy (y)", variant="primary", id="copy")
                yield Button("Close (esc)", id="close")

    def action_dismiss_screen(self) -> None:
        self.dismiss(None)

    def action_copy(self) -> None:
        # OSC 52: works over SSH in terminals that allow it; the text is also
        # selectable on screen.
        self.app.copy_to_clipboard(self.command)
        self.notify("command line copied to the clipboard (OSC 52)", timeout=3)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "copy":
            self.action_copy()
        else:
            self.dismiss(None)


class BusyScreen(ModalScreen[None]):
    """Shown while quitting stops the server (can take seconds)."""

    def __init__(self, message: str):
        super().__init__(classes="dialog-screen")
        self._message = message

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._message, classes="dialog-title")
            yield Static("SIGINT, then SIGTERM, then SIGKILL to the whole process group; "
                         "done when no engine process is left.", classes="dialog-body")
