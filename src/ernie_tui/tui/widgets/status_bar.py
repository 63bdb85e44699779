"""The top line: what the server is doing, at a glance.

    ● READY  cpu-demo  http://127.0.0.1:8011  pid 4242  up 0:03:12  vLLM 0.32.0  cpu   CONTROL

The state badge is coloured by state (the one thing you must read from across
the room); the rest is plain facts. Uptime is computed from the app's clock,
which tests freeze.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label

from ernie_tui.tui.format import duration

STATE_GLYPH = {
    "stopped": "○",
    "starting": "◐",
    "ready": "●",
    "stopping": "◑",
    "crashed": "✖",
    "replay": "▤",
}

PHASE_WORDS = {
    "launching": "launching",
    "connecting": "connecting",
    "load_weights": "loading weights",
    "compile": "torch.compile",
    "kv_profiling": "KV profiling",
    "cuda_graphs": "CUDA graphs",
    "ready": "ready",
    "unreachable": "unreachable",
}


def fit_facts(facts: list[tuple[str, int]], width: int | None) -> str:
    """The facts joined by two spaces, leaving out the highest-ranked ones
    (the platform, vLLM's version, the pid, the URL's scheme, the URL) until
    the line fits `width` (None: all). At 80 columns the line used to run
    off the edge in the middle of "ready in" and its value."""
    shown = list(facts)

    def line() -> str:
        return "  ".join(text for text, _ in shown)

    while width is not None and len(line()) > width and shown:
        worst = max(rank for _, rank in shown)
        if worst == 0:
            break
        i = max(i for i, (_, rank) in enumerate(shown) if rank == worst)
        text, rank = shown[i]
        if text.startswith(("http://", "https://")):  # the address without its scheme first
            shown[i] = (text.split("://", 1)[1], rank - 1)
        else:
            del shown[i]
    return line()


class StatusBar(Horizontal):
    """State badge + preset, URL, PID, uptime, vLLM version, platform, mode."""

    def __init__(self, mode: str, *, id: str | None = None):
        super().__init__(id=id)
        self._composed = False
        self.mode = mode
        self._status = None
        self._report = None
        self._now: float | None = None
        self._replay_name: str | None = None
        self._alert: str | None = None

    def compose(self) -> ComposeResult:
        yield Label("", id="sb-state", classes="-stopped")
        yield Label("", id="sb-facts")
        yield Label(self.mode.upper(), id="sb-mode", classes=f"-{self.mode}")

    def on_mount(self) -> None:
        self._composed = True
        self._redraw()

    def set_status(self, status) -> None:
        self._status = status
        self._redraw()

    def set_report(self, report) -> None:
        self._report = report
        self._redraw()

    def set_replay(self, name: str) -> None:
        self._replay_name = name
        self._redraw()

    def set_alert(self, text: str | None) -> None:
        """A problem to read first, beside the state ('/metrics: HTTP 500 since ...')."""
        if text != self._alert:
            self._alert = text
            self._redraw()

    def tick(self, now: float) -> None:
        self._now = now
        self._redraw()

    def _state_word(self) -> tuple[str, str]:
        st = self._status
        if st is None:
            return ("replay", "REPLAY") if self.mode == "replay" else ("stopped", "STOPPED")
        state = st.state.value
        word = state.upper()
        if state == "starting" and st.phase:
            word = f"STARTING: {PHASE_WORDS.get(st.phase, st.phase)}"
        elif state == "crashed" and st.exit_code is not None:
            word = f"CRASHED (exit {st.exit_code})"
        elif state == "stopped" and st.phase == "unreachable":
            word = "UNREACHABLE"
        elif state == "stopped" and st.phase == "shutdown":
            word = "STOPPED (shut down)"
        if self.mode == "replay":
            word = {"ready": "REPLAY: reached ready", "crashed": "REPLAY: failed",
                    "stopped": "REPLAY: shut down" if st.phase == "shutdown" else "REPLAY: never ready",
                    }.get(state, f"REPLAY: {state}")
        return state, word

    def _facts(self) -> list[tuple[str, int]]:
        """The facts in the order they stand, each with its rank: the
        highest rank is left out first where the line is too narrow."""
        facts: list[tuple[str, int]] = []
        st, rp = self._status, self._report
        if self._replay_name:
            facts.append((self._replay_name.rsplit("/", 1)[-1], 0))
        if st is not None and st.preset_name:
            facts.append((st.preset_name, 0))
        url = (st.url if st is not None and st.url else None) or (rp.server_url if rp is not None else None)
        if url:
            facts.append((url, 3))
        pid = st.pid if st is not None else None
        if pid is None and rp is not None:
            pid = rp.pids.get("APIServer")
        if pid:
            facts.append((f"pid {pid}", 4))
        if st is not None and st.running and st.started_at and self._now is not None:
            facts.append((f"up {duration(self._now - st.started_at)}", 1))
            if st.ready_at and st.state.value == "ready":
                facts.append((f"ready in {duration(st.ready_at - st.started_at, precise=True)}", 0))
        if rp is not None and rp.vllm_version:
            facts.append((f"vLLM {rp.vllm_version}", 5))
        if rp is not None and rp.platform:
            facts.append((rp.platform, 6))
        return facts

    def on_resize(self) -> None:
        self._redraw()

    def _redraw(self) -> None:
        if not self._composed:
            return
        state, word = self._state_word()
        badge = self.query_one("#sb-state", Label)
        text = f" {STATE_GLYPH.get(state, '?')} {word} "
        if text != getattr(self, "_badge_text", None):  # width auto: a new word needs layout
            self._badge_text = text
            badge.update(text)
        if not badge.has_class(f"-{state}"):
            for cls in list(badge.classes):
                if cls.startswith("-"):
                    badge.remove_class(cls)
            badge.add_class(f"-{state}")
        width = self.query_one("#sb-facts", Label).size.width
        line = fit_facts(self._facts(), width - (len(self._alert) + 2 if self._alert else 0) if width else None)
        key = (self._alert, line)
        if key != getattr(self, "_facts_text", None):
            # 1fr wide, one row: the uptime ticking never needs a layout pass.
            self._facts_text = key
            shown = Content.assemble((self._alert, "bold $error"), "  ", line) if self._alert else line
            self.query_one("#sb-facts", Label).update(shown, layout=False)
