"""The log pane: a live tail of llm.log that stays cheap under a flood.

A Line-API ScrollView: only the visible lines are rendered (and cached), so
appending thousands of lines a second costs a list extend and a refresh.
Levels are coloured, error lines stand out, the classified root-cause line
is marked, and `/` search highlights matches.

Following (auto-scroll) is a state only the user changes: scrolling up (keys,
wheel, scrollbar) or jumping to a line pauses it; End, `l` or scrolling back
down to the end resumes it. It is never inferred from scroll_y moving: pruning
past the line cap shrinks the virtual size, Textual clamps scroll_y, and that
clamp once read as "the user scrolled up" and froze a flooding pane.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual import events
from textual.actions import SkipAction
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollDown, ScrollTo, ScrollUp
from textual.strip import Strip

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_NEEDS_CLEAN = re.compile(r"[\x00-\x1f\x7f]").search
_PREFIX = re.compile(
    r"^(?P<proc>\((?P<pname>[A-Za-z_0-9-]+)(?: pid=\d+)?\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
    r"(?P<rest>\s+\d\d-\d\d (?P<time>\d\d:\d\d:\d\d)(?:\.\d+)?\s+\[[^\]]*\])?\s?"
)
_UVICORN = re.compile(r"^(?P<level>INFO|WARNING|ERROR):\s{2,}")
_ERRORISH = re.compile(r"Traceback \(most recent call last\)|^\S*(Error|Exception)\b|\bError: |\berror: ")

LEVEL_STYLES = {
    "DEBUG": Style(color="bright_black"),
    "INFO": Style(color="green"),
    "WARNING": Style(color="yellow", bold=True),
    "WARN": Style(color="yellow", bold=True),
    "ERROR": Style(color="bright_red", bold=True),
    "CRITICAL": Style(color="bright_red", bold=True, reverse=True),
}
DIM = Style(dim=True)
ERROR_LINE = Style(color="bright_red", bgcolor="#3a0d0d")
WARNING_LINE = Style(color="yellow")
ROOT_CAUSE = Style(color="white", bgcolor="#8b0000", bold=True)
MATCH = Style(color="black", bgcolor="yellow")
CURRENT_MATCH = Style(color="black", bgcolor="bright_yellow", bold=True, underline=True)
MAX_WIDTH = 1000  # virtual width cap: very long lines are cropped, not measured

# uvicorn's access line for a dashboard's own polling (its 1 s GET /metrics,
# /health while attached): '(APIServer pid=1) INFO:     127.0.0.1:45254 -
# "GET /metrics HTTP/1.1" 200 OK'. A server we start does not write them
# (presets/model.py: --disable-access-log-for-endpoints); one we attach to may.
_POLLING = re.compile(r'^(?:\([^)]*\)\s+)?INFO:\s+\S+ - "GET /(?:metrics|health)(?:\?[^" ]*)? HTTP/[\d.]+" \d{3}')


def is_polling_line(line: str) -> bool:
    return ('"GET /metrics' in line or '"GET /health' in line) and _POLLING.match(line) is not None


class _StripCache:
    """The last `size` lines drawn, least recently used dropped first.

    A plain dict, not Textual's LRUCache: that one links its entries in a
    ring, so each clear() (every prune under a flood, every `v`) left the
    ring and the up to 512 lines in it, with the strips derived from them,
    as one reference cycle for a full collection to free (130-225 ms on the
    UI thread, docs/lab/benchmarks/tui-overhead.md)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._strips: dict[tuple[int, int], Strip] = {}

    def get(self, key: tuple[int, int]) -> Strip | None:
        strip = self._strips.pop(key, None)
        if strip is not None:
            self._strips[key] = strip  # now the most recent
        return strip

    def __setitem__(self, key: tuple[int, int], strip: Strip) -> None:
        self._strips.pop(key, None)
        self._strips[key] = strip
        if len(self._strips) > self.size:
            del self._strips[next(iter(self._strips))]

    def clear(self) -> None:
        self._strips.clear()


def line_level(line: str) -> str | None:
    m = _PREFIX.match(line) or _UVICORN.match(line)
    return m.group("level") if m else None


@dataclass
class _Search:
    term: str
    pattern: re.Pattern
    matches: list[int]  # absolute line numbers (1-based)
    current: int = -1  # index into matches


class LogView(ScrollView, can_focus=True):
    """A tail-follow log with level colours, error marks and search."""

    DEFAULT_CSS = """
    LogView { background: $surface; overflow-x: auto; overflow-y: scroll; }
    """

    follow: reactive[bool] = reactive(True)
    compact: reactive[bool] = reactive(True)
    """Shorten vLLM's 60-character prefix '(Worker pid=7948) ERROR 11-30 03:03:21
    [multiproc_executor.py:1063]' to 'Worker    E 03:03:21'; `v` shows it whole."""

    class StateChanged(Message):
        """Follow/search/pending state changed (for the pane's title)."""

    class NeedEarlier(Message):
        """The user scrolled up to the first line held, and the log has lines
        before it (a big log opens on its end): whoever reads the log may
        answer with prepend()."""

        def __init__(self, line_no: int):
            super().__init__()
            self.line_no = line_no

    def __init__(self, max_lines: int = 20_000, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.max_lines = max_lines
        self._lines: list[str] = []
        self._first_no = 1  # absolute (1-based) number of self._lines[0]
        self._width = 0
        self._cache = _StripCache(512)
        self._generation = 0  # bumps when styling inputs change (search, root cause)
        self._search: _Search | None = None
        self.root_cause_no: int | None = None
        self.pending = 0  # lines that arrived while paused
        self.dropped = 0
        # Folding the polling access lines (issue #18, 1): every line stays
        # held, under the file's number; `_rows` lists the numbers of the
        # lines shown (None until a polling line arrives), and the pane's
        # rows are those while `fold_polling` is on.
        self.fold_polling = True
        self._rows: list[int] | None = None

    # -- rows: the lines shown (all, or all but the folded polling lines) ----------
    @property
    def _folding(self) -> bool:
        return self.fold_polling and self._rows is not None

    @property
    def _row_count(self) -> int:
        return len(self._rows) if self._folding and self._rows is not None else len(self._lines)

    def _row_line_no(self, row: int) -> int:
        return self._rows[row] if self._folding and self._rows is not None else row + self._first_no

    def _line_row(self, line_no: int) -> int:
        """The row showing line `line_no`, or the next shown one when it is folded."""
        if self._folding and self._rows is not None:
            return bisect_left(self._rows, line_no)
        return line_no - self._first_no

    @property
    def polling_folded(self) -> int:
        """Polling access lines held (folded while fold_polling is on)."""
        return len(self._lines) - len(self._rows) if self._rows is not None else 0

    def set_fold_polling(self, fold: bool) -> None:
        """Show or fold the polling access lines, keeping the line at the top in view."""
        self.flush()
        if fold == self.fold_polling:
            return
        top = self._row_line_no(int(self.scroll_y)) if self._row_count else self._first_no
        self.fold_polling = fold
        self._cache.clear()
        self._set_virtual_size(Size(self._width + 1, self._row_count))
        if self.follow:
            self._scroll_to_end()
        else:
            self.scroll_to(y=max(0, min(self._line_row(top), self._row_count - 1)), animate=False, immediate=True)
        self.refresh()
        self.post_message(self.StateChanged())

    def _note_rows(self, first_no: int, clean: list[str], front: bool = False) -> None:
        """Lines numbered from `first_no` joined `_lines` (at its end, or at
        its front): keep `_rows` in step. Costs a substring test per line."""
        rows = self._rows
        if rows is None:
            if not any(is_polling_line(ln) for ln in clean):
                return
            # The first polling line: every line held before it is shown.
            if front:
                rows = list(range(first_no + len(clean), first_no + len(self._lines)))
            else:
                rows = list(range(self._first_no, first_no))
            self._rows = rows
        shown = [first_no + i for i, ln in enumerate(clean) if not is_polling_line(ln)]
        if front:
            rows[:0] = shown
        else:
            rows.extend(shown)

    # -- content ------------------------------------------------------------
    @property
    def line_count(self) -> int:
        pending = getattr(self, "_pending", None)
        return len(self._lines) + (len(pending[0]) if pending else 0)

    @property
    def last_line_no(self) -> int:
        return self._first_no + len(self._lines) - 1

    def lines(self) -> list[str]:
        pending = getattr(self, "_pending", None)
        return list(self._lines) + (list(pending[0]) if pending else [])

    def clear(self) -> None:
        self._pending = None
        self._rows = None
        self._lines.clear()
        self._first_no = 1
        self._width = 0
        self._cache.clear()
        self._generation += 1
        self._search = None
        self.root_cause_no = None
        self.pending = 0
        self.dropped = 0
        self.virtual_size = Size(0, 0)
        self.scroll_to(0, 0, animate=False)
        self.refresh()
        self.post_message(self.StateChanged())

    FLUSH_INTERVAL = 0.2  # repaint a flooding log at most 5 times a second

    def append(self, lines: list[str], dropped: int = 0, first_line_no: int | None = None) -> None:
        """Queue lines; they reach the screen within FLUSH_INTERVAL. A flood of
        batches then costs one repaint per interval, not one per batch.
        `first_line_no` (the file's number of lines[0]) numbers an empty pane:
        a big log opens on its end, not on line 1."""
        if not lines and not dropped:
            return
        pending = getattr(self, "_pending", None)
        if first_line_no is not None and pending is None and not self._lines:
            self._first_no = max(1, first_line_no)
            if self._first_no > 1:
                self.post_message(self.StateChanged())  # the title says where the pane begins
        if pending is None:
            self._pending = pending = ([], [0])
        pending[0].extend(lines)
        pending[1][0] += dropped
        if not getattr(self, "_flush_scheduled", False):
            self._flush_scheduled = True
            self.set_timer(self.FLUSH_INTERVAL, self.flush)

    def flush(self) -> None:
        """Put queued lines on screen now."""
        self._flush_scheduled = False
        pending = getattr(self, "_pending", None)
        if not pending or (not pending[0] and not pending[1][0]):
            return
        self._pending = None
        self._append_now(pending[0], pending[1][0])
        self._try_reveal()

    def _append_now(self, lines: list[str], dropped: int = 0) -> None:
        if dropped:
            self.dropped += dropped
            self._first_no += dropped  # numbering continues past the skipped lines
        start_y = len(self._lines)
        folded = self.polling_folded
        clean = [_CONTROL.sub("", ln.expandtabs()) if _NEEDS_CLEAN(ln) else ln for ln in lines]
        self._lines.extend(clean)
        self._note_rows(self._first_no + start_y, clean)
        if self.polling_folded != folded:
            self.post_message(self.StateChanged())  # the title counts them
        if clean:
            widest = max(map(len, clean))
            if widest > self._width:
                self._width = min(MAX_WIDTH, widest)
        if self._search is not None:
            base = self._first_no
            pat = self._search.pattern
            self._search.matches.extend(base + start_y + i for i, ln in enumerate(clean) if pat.search(ln))
        overflow = len(self._lines) - self.max_lines
        cut = rows_cut = 0
        if overflow > 0:
            # Prune in chunks so steady-state appends stay O(batch).
            cut = overflow + self.max_lines // 10
            rows_cut = cut
            del self._lines[:cut]
            self._first_no += cut
            if self._rows is not None:
                gone = bisect_left(self._rows, self._first_no)
                del self._rows[:gone]
                if self._folding:
                    rows_cut = gone
            self._cache.clear()
            if self._search is not None:
                self._search.matches = [n for n in self._search.matches if n >= self._first_no]
                self._search.current = min(self._search.current, len(self._search.matches) - 1)
        self._set_virtual_size(Size(self._width + 1, self._row_count))
        if cut and not self.follow:
            # Paused: the lines being read moved up by the rows cut; keep them in view.
            self.scroll_to(y=max(0, self.scroll_y - rows_cut), animate=False, immediate=True)
        if self.follow:
            self._scroll_to_end()
        else:
            self.pending += len(clean)
            self.post_message(self.StateChanged())
        self.refresh()

    def prepend(self, lines: list[str], first_line_no: int) -> int:
        """Put earlier lines (numbered from `first_line_no`, ending just
        before the first line held) above the others, keeping the view on
        the lines it shows; at most up to max_lines in all. Returns how many."""
        self.flush()
        if not lines or first_line_no + len(lines) != self._first_no:
            return 0
        room = self.max_lines - len(self._lines)
        if room <= 0:
            return 0
        if len(lines) > room:
            lines = lines[-room:]
            first_line_no = self._first_no - room
        clean = [_CONTROL.sub("", ln.expandtabs()) if _NEEDS_CLEAN(ln) else ln for ln in lines]
        rows_before = self._row_count
        self._lines[:0] = clean
        self._first_no = first_line_no
        self._note_rows(first_line_no, clean, front=True)
        widest = max(map(len, clean))
        if widest > self._width:
            self._width = min(MAX_WIDTH, widest)
        if self._search is not None:
            pat = self._search.pattern
            found = [first_line_no + i for i, ln in enumerate(clean) if pat.search(ln)]
            self._search.matches[:0] = found
            self._search.current += len(found)
        self._set_virtual_size(Size(self._width + 1, self._row_count))
        self.scroll_to(y=self.scroll_y + self._row_count - rows_before, animate=False, immediate=True)
        self.refresh()
        self.post_message(self.StateChanged())
        return len(clean)

    def _set_virtual_size(self, size: Size) -> None:
        """Grow the scrollable area without a screen-wide layout pass.

        `virtual_size` is a layout reactive: assigning it reflows and repaints
        every widget on the screen, which under a 5,000 lines/s flood was most
        of the dashboard's CPU. Our scrollbars never appear or disappear on
        growth (overflow-y: scroll, no horizontal bar), so only this widget
        and its scrollbar need to know: set the value without the layout
        refresh and update the scrollbars the way Textual's own resize path
        (`Widget._size_updated(layout=False)`) does."""
        from textual.widget import Widget

        update = getattr(self, "_scroll_update", None)
        if update is None or not self.is_mounted or self.virtual_size.height == 0:
            self.virtual_size = size  # first fill, or a Textual without the hook: the normal path
            return
        if size == self.virtual_size:
            return
        self.set_reactive(Widget.virtual_size, size)
        update(size)

    def _scroll_to_end(self) -> None:
        self.scroll_to(y=max(0, self._row_count - self.scrollable_content_region.height),
                       animate=False, immediate=True)

    # -- follow: changed by the user only ------------------------------------------
    def watch_follow(self, follow: bool) -> None:
        if follow:
            self.pending = 0
            self._scroll_to_end()
        self.post_message(self.StateChanged())

    def _user_scroll(self, dy: float | None = None, *, to: float | None = None) -> bool:
        """Scroll as the user asked (by `dy` rows, or to row `to`): up from
        where we are pauses following, landing on the end resumes it.
        Returns whether the view moved or the follow state changed."""
        before = self.scroll_y
        target = to if to is not None else before + (dy or 0)
        target = max(0.0, min(float(target), float(self.max_scroll_y)))
        self.scroll_to(y=target, animate=False, immediate=True)
        if target <= 0 and (to is not None or (dy or 0) < 0) and self._first_no > 1:
            self.post_message(self.NeedEarlier(self._first_no))
        if target >= self.max_scroll_y:
            if not self.follow:
                self.follow = True
                return True
        elif target < before and self.follow:
            self.follow = False
            return True
        return target != before

    def _vertical_only(self) -> None:
        if not self.allow_vertical_scroll:
            raise SkipAction()  # let the key reach the screen

    def action_scroll_up(self) -> None:
        self._vertical_only()
        self._user_scroll(-1)

    def action_scroll_down(self) -> None:
        self._vertical_only()
        self._user_scroll(1)

    def action_page_up(self) -> None:
        self._vertical_only()
        self._user_scroll(-self.scrollable_content_region.height)

    def action_page_down(self) -> None:
        self._vertical_only()
        self._user_scroll(self.scrollable_content_region.height)

    def action_scroll_home(self) -> None:
        self._vertical_only()
        self._user_scroll(to=0)

    def action_scroll_end(self) -> None:
        self.follow = True

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        if event.ctrl or event.shift or not self.allow_vertical_scroll:
            super()._on_mouse_scroll_up(event)  # sideways: Textual's own
        elif self._user_scroll(-self.app.scroll_sensitivity_y):
            event.stop()

    def _on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        if event.ctrl or event.shift or not self.allow_vertical_scroll:
            super()._on_mouse_scroll_down(event)
        elif self._user_scroll(self.app.scroll_sensitivity_y):
            event.stop()

    def _on_scroll_up(self, event: ScrollUp) -> None:  # a click on the scrollbar above its thumb
        if self.allow_vertical_scroll:
            self._user_scroll(-self.scrollable_content_region.height)
            event.stop()

    def _on_scroll_down(self, event: ScrollDown) -> None:
        if self.allow_vertical_scroll:
            self._user_scroll(self.scrollable_content_region.height)
            event.stop()

    def _on_scroll_to(self, message: ScrollTo) -> None:  # the scrollbar's thumb dragged
        if message.x is not None:
            self.scroll_to(x=message.x, animate=False, immediate=True)
        if message.y is not None:
            self._user_scroll(to=message.y)
        message.stop()

    def on_resize(self) -> None:
        if self.size == getattr(self, "_last_size", None):
            return  # a screen resumed (a dialog closed): nothing to redo
        self._last_size = self.size
        self._cache.clear()
        if self.follow:
            self.call_after_refresh(self._scroll_to_end_if_following)

    def _scroll_to_end_if_following(self) -> None:
        # Deferred: a jump (a crash revealing its root cause) may have paused
        # following between the resize and this call; that jump wins.
        if self.follow:
            self._scroll_to_end()

    def watch_compact(self, compact: bool) -> None:
        self._generation += 1
        self._cache.clear()
        self.refresh()

    # -- root cause -----------------------------------------------------------
    def mark_root_cause(self, line_no: int | None, reveal: bool = False) -> None:
        """Mark the classified root-cause line; with `reveal`, scroll to it as
        soon as it is in the pane (a crash's status can overtake its lines)."""
        if line_no != self.root_cause_no:
            self.root_cause_no = line_no
            self._generation += 1
            self.refresh()
        self._reveal = reveal and line_no is not None
        if self._reveal:
            self._try_reveal()

    def _try_reveal(self) -> None:
        if getattr(self, "_reveal", False) and self.root_cause_no is not None:
            if self._first_no <= self.root_cause_no <= self.last_line_no:
                self._reveal = False
                self.jump_to_line(self.root_cause_no)

    def jump_to_line(self, line_no: int) -> bool:
        self.flush()
        if not 0 <= line_no - self._first_no < len(self._lines):
            return False
        if self._folding and self._rows is not None and self._rows[min(self._line_row(line_no),
                                                                         len(self._rows) - 1)] != line_no:
            self.set_fold_polling(False)  # the line asked for is a folded one: show them
        y = self._line_row(line_no)
        self.follow = False  # the user asked for this line (search, root cause): stay on it
        self.scroll_to(y=max(0, y - self.scrollable_content_region.height // 2), animate=False, immediate=True)
        return True

    # -- search ---------------------------------------------------------------
    @property
    def search_term(self) -> str | None:
        return self._search.term if self._search else None

    def search_info(self) -> tuple[int, int] | None:
        """(current 1-based index, number of matches), or None without a search."""
        if self._search is None:
            return None
        return self._search.current + 1, len(self._search.matches)

    def search(self, term: str) -> int:
        self.flush()
        term = term.strip()
        self._generation += 1
        if not term:
            self._search = None
            self.refresh()
            self.post_message(self.StateChanged())
            return 0
        pattern = re.compile(re.escape(term), re.IGNORECASE)
        base = self._first_no
        matches = [base + i for i, ln in enumerate(self._lines) if pattern.search(ln)]
        self._search = _Search(term, pattern, matches, len(matches) - 1)
        if matches:
            self.jump_to_line(matches[-1])  # newest match first: logs are read bottom-up
        self.refresh()
        self.post_message(self.StateChanged())
        return len(matches)

    def next_match(self, step: int = 1) -> None:
        s = self._search
        if s is None or not s.matches:
            return
        s.current = (s.current + step) % len(s.matches)
        self._generation += 1
        self.jump_to_line(s.matches[s.current])
        self.refresh()
        self.post_message(self.StateChanged())

    # -- rendering --------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.scrollable_content_region.width
        base_style = self.rich_style
        if row >= self._row_count:
            return Strip.blank(width, base_style)
        number = self._row_line_no(row)
        key = (number, self._generation)
        strip = self._cache.get(key)
        if strip is None:
            text = self._styled(number - self._first_no)
            text.stylize_before(base_style)
            strip = Strip(text.render(self.app.console), text.cell_len)
            self._cache[key] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, base_style).apply_offsets(scroll_x, row)

    def _styled(self, index: int) -> Text:
        raw = self._lines[index]
        number = index + self._first_no
        m = _PREFIX.match(raw)
        level = m.group("level") if m else None
        text = Text(no_wrap=True, end="")
        if m and self.compact and m.group("rest"):
            # '(Worker pid=7948) ERROR 11-30 03:03:21 [file.py:12] msg' -> 'Worker    E 03:03:21 msg'
            text.append(f"{(m.group('pname') or ''):<11.11}", DIM)
            text.append(f"{level[0]} ", LEVEL_STYLES.get(level, DIM))
            text.append(f"{m.group('time')} ", DIM)
            body_start = len(text.plain)
            text.append(raw[m.end():])
        else:
            text.append(raw)
            body_start = m.end() if m else 0
            if m:
                if m.group("proc"):
                    text.stylize(DIM, 0, m.end("proc"))
                text.stylize(LEVEL_STYLES.get(level, DIM), m.start("level"), m.end("level"))
                if m.group("rest"):
                    text.stylize(DIM, m.start("rest"), m.end("rest"))
            else:
                u = _UVICORN.match(raw)
                if u:
                    level = u.group("level")
                    text.stylize(LEVEL_STYLES.get(level, DIM), 0, u.end("level"))
        if len(text.plain) > MAX_WIDTH:
            text.truncate(MAX_WIDTH, overflow="ellipsis")
        if number == self.root_cause_no:
            text.stylize(ROOT_CAUSE)
        elif level in ("ERROR", "CRITICAL") or (level is None and _ERRORISH.search(raw)):
            text.stylize(ERROR_LINE, body_start)
        elif level in ("WARNING", "WARN"):
            text.stylize(WARNING_LINE, body_start)
        s = self._search
        if s is not None:
            current = s.matches[s.current] if 0 <= s.current < len(s.matches) else None
            style = CURRENT_MATCH if number == current else MATCH
            for mm in s.pattern.finditer(text.plain):
                text.stylize(style, mm.start(), mm.end())
        return text
