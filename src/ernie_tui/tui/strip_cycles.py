"""Keep Textual's drawn lines out of the cyclic garbage collector.

Textual (8.x) memoises `Strip.divide` and `Strip.crop_extend` on the strip
itself, and when the answer is the strip unchanged (a line cut exactly at
its own width, which the compositor does for almost every line it draws) it
stores the strip in its own cache: a reference cycle. Every line drawn then
outlives its last use until a collection finds it; a line kept 0.2 s or more
(the log pane redraws five times a second under a flood) reaches the oldest
generation first, and a full collection had 4,400-10,600 such strips (plus
their seven memo caches each) to free: 130-225 ms on the UI thread, which a
key press then waited out (docs/lab/benchmarks/tui-overhead.md, "Dashboard overhead").

Answering those two cases without memoising them returns the same strip, so
nothing drawn changes; the strip is then freed by its reference count.
"""

from __future__ import annotations

from textual.strip import Strip

_PATCHED = "_ernie_no_self_cycles"


def stop_strip_self_cycles() -> None:
    """Patch Strip once per process (idempotent)."""
    if getattr(Strip, _PATCHED, False):
        return
    divide = Strip.divide
    crop_extend = Strip.crop_extend

    def divide_no_cycle(self: Strip, cuts):
        cuts = list(cuts)
        length = self.cell_length
        if [cut for cut in cuts if cut <= length] == [length]:
            return [self]  # what Textual answers, minus caching [self] on self
        return divide(self, cuts)

    def crop_extend_no_cycle(self: Strip, start: int, end: int, style):
        if start == 0 and end == self.cell_length:
            return self  # extend and crop both leave it as it is
        return crop_extend(self, start, end, style)

    Strip.divide = divide_no_cycle  # type: ignore[method-assign]
    Strip.crop_extend = crop_extend_no_cycle  # type: ignore[method-assign]
    setattr(Strip, _PATCHED, True)
