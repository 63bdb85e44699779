"""What a capacity search sends: a Workload of prompts taken in order across
levels, so a later level does not send the prompts of an earlier one again
(vLLM's prefix cache would make them cheaper and the preset look faster).

Built prompts (burst_workload: exact token lengths with the served model's
tokenizer) never repeat: before each level the search asks for as many new
ones as the level can send at most (Workload.ensure), each batch with the
next seed, built outside the level's timed window. A JSONL file's prompts
are what the operator gave: when a search uses them up it starts over, and
the result says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ernie_tui.engine_ctl.load.burst import build_prompts, new_word_seed, plan_output_lengths
from ernie_tui.engine_ctl.load.traffic import TrafficProfile
from ernie_tui.engine_ctl.load.traffic_replay import describe


@dataclass(frozen=True)
class WorkItem:
    prompt: str
    max_tokens: int
    prompt_tokens: int | None = None  # when known (built prompts)


class Workload:
    """The prompts to send, taken in order across all levels. With `more`
    (built prompts) it grows instead of wrapping: more(n) gives n new items."""

    def __init__(self, items: list[WorkItem], source: str,
                 more: Callable[[int], list[WorkItem]] | None = None) -> None:
        if not items:
            raise ValueError("the workload has no prompts")
        self.items = items
        self.source = source
        self.more = more
        self.cursor = 0
        self.wraps = 0
        self.taken = 0
        self.built = len(items)
        self.built_when_dry = 0  # prompts take() had to build in a timed window
        # The later levels' warm-up prompt: one already sent, so the prefix
        # cache it fills is never one a measured request could hit.
        self.warm_item = items[0]
        self._lengths = _Span()
        self._lengths.add(items)

    @property
    def left(self) -> int:
        """Prompts built and not yet sent."""
        return len(self.items) - self.cursor

    def take(self) -> WorkItem:
        if self.cursor >= len(self.items):
            if self.more is not None:
                # Neither ensure() nor the runner's refill kept ahead: one
                # more now, in the timed window and on the caller's thread
                # (counted, the level says so), rather than a repeat the
                # prefix cache would flatter.
                self.built_when_dry += 1
                self._grow(1)
            else:
                self.cursor = 0
                self.wraps += 1
        item = self.items[self.cursor]
        self.cursor += 1
        self.taken += 1
        return item

    def ensure(self, n: int) -> None:
        """At least `n` prompts not yet sent, when the workload can build
        them (call it before the timed window)."""
        left = len(self.items) - self.cursor
        if self.more is not None and left < n:
            self._grow(n - left)

    def build(self, n: int) -> list[WorkItem]:
        """n new prompts, not yet added (extend() adds them). It changes
        nothing here, so a runner may call it in a worker thread while its
        loop goes on taking."""
        assert self.more is not None
        return self.more(n)

    def _grow(self, n: int) -> None:
        self.extend(self.build(n))

    def extend(self, new: list[WorkItem]) -> None:
        """Add built prompts after the unsent ones; the sent ones are dropped
        (they are never sent again)."""
        self._lengths.add(new)
        self.built += len(new)
        self.items = self.items[self.cursor:] + new
        self.cursor = 0

    def describe(self) -> dict[str, Any]:
        span = self._lengths
        return {"source": self.source, "prompts": self.built, "sent": self.taken,
                "max_tokens_min": span.max_tokens[0], "max_tokens_max": span.max_tokens[1],
                "prompt_tokens_min": span.prompt_tokens[0], "prompt_tokens_max": span.prompt_tokens[1],
                "wrapped": self.wraps, "built_when_dry": self.built_when_dry}


class _Span:
    """Smallest and largest max_tokens and prompt length over every item a
    workload ever held (it drops the ones it has sent)."""

    def __init__(self) -> None:
        self.max_tokens: tuple[int | None, int | None] = (None, None)
        self.prompt_tokens: tuple[int | None, int | None] = (None, None)

    @staticmethod
    def _widen(span: tuple[int | None, int | None], values: list[int]) -> tuple[int | None, int | None]:
        if not values:
            return span
        lo, hi = min(values), max(values)
        return (lo if span[0] is None else min(span[0], lo), hi if span[1] is None else max(span[1], hi))

    def add(self, items: list[WorkItem]) -> None:
        self.max_tokens = self._widen(self.max_tokens, [i.max_tokens for i in items])
        self.prompt_tokens = self._widen(self.prompt_tokens,
                                         [i.prompt_tokens for i in items if i.prompt_tokens is not None])


def jsonl_lines(p: Path, what: str, error: type[ValueError] = ValueError) -> list[tuple[int, str]]:
    """(line number, stripped line) of a JSONL file's lines that hold data:
    blank lines and lines starting with # are skipped. An unreadable file
    raises `error` naming `what` (the workload, the trace)."""
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from exc
    return [(n, s) for n, line in enumerate(text.splitlines(), 1)
            if (s := line.strip()) and not s.startswith("#")]


def load_jsonl(path: str | Path, default_max_tokens: int) -> Workload:
    """A JSONL file, one request a line: {"prompt": "...", "max_tokens": 128}
    (max_tokens optional). Blank lines and lines starting with # are skipped.
    ValueError names the line of the first bad one."""
    p = Path(path).expanduser()
    items = []
    for n, s in jsonl_lines(p, "the workload"):
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise ValueError(f'{p}:{n}: each line needs a non-empty "prompt" string')
        mt = obj.get("max_tokens", default_max_tokens)
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise ValueError(f"{p}:{n}: max_tokens must be a positive integer, got {mt!r}")
        items.append(WorkItem(obj["prompt"], mt))
    if not items:
        raise ValueError(f"{p} holds no prompts")
    return Workload(items, f"file {p.name}")


def _outputs(config: Any) -> str:
    lo = getattr(config, "min_output_tokens", None)
    return f", {lo}-{config.max_tokens} output tokens" if lo is not None else ""


def burst_workload(config: Any, tokenizer: Any, size: int) -> Workload:
    """`size` prompts of exact token lengths as a burst would build them
    (lengths uniform in [min_tokens, max_tokens_in] from config.seed; words
    from config.word_seed, new ones when it is None), and more on demand,
    each batch with the next seeds, so no prompt is ever sent twice."""
    from dataclasses import replace

    words = config.word_seed if config.word_seed is not None else new_word_seed()

    def build(n: int, k: int) -> list[WorkItem]:
        cfg = replace(config, n=n, seed=config.seed + k, word_seed=words + k)
        # Output lengths as a burst draws them (all max_tokens, or uniform in
        # [min_output_tokens, max_tokens], as vLLM's bench client draws them).
        outs = plan_output_lengths(cfg)
        built = build_prompts(cfg, tokenizer)
        return [WorkItem(p.text, m, p.tokens) for p, m in zip(built, outs, strict=True)]

    batches = iter(range(1, 1_000_000))
    if config.traffic is not None:
        what = describe(TrafficProfile.from_dict(config.traffic), config.traffic_outputs, config.traffic_arrivals)
        source = f"{what}, seed {config.seed}, word seed {words}"
        return Workload(build(size, 0), source, more=lambda n: build(n, next(batches)))
    return Workload(build(size, 0),
                    f"built prompts of {config.min_tokens}-{config.max_tokens_in} tokens{_outputs(config)}, "
                    f"seed {config.seed}, word seed {words}",
                    more=lambda n: build(n, next(batches)))
