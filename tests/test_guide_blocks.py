"""Every `sh` block in docs/guide/ runs as written, against the paced stand-in.

The guide promises its examples run. This test takes each fenced ```sh block
from docs/guide/*.md and runs it with bash (-e, -o pipefail: any command that
fails fails the block) in a scratch directory per page, with:
- `$URL`: a paced stand-in (tests/paced_server.py) whose capacity under
  itl_p99=50ms is 4: 20 ms to the first token, 20 ms between tokens, and
  40 ms more per gap for each request in flight beyond 4;
- `$MODEL`: the tiny stand-in model;
- `$PRESETS`: a presets file with `standin-2` and `standin-4`, the stand-in
  with 2 and 4 slots launched as a preset's server;
- `llm.log` and `failed.log` in the page's directory: real H200 logs from
  tests/fixtures/vllm-logs (one start that served, one that failed);
- ERNIE_TUI_HOME in a temp dir, and this Python's bin dir first on PATH.

An info string marks what cannot run here: ```sh {tui} (the interactive
dashboard), {vllm} (needs vLLM), {gpu} (needs a GPU server), {cluster} (a Ray
cluster): skipped, with the
reason. ```sh {exit=N} expects exit status N instead of 0. Blocks of a page
run in order in one directory, so a block may use what an earlier one wrote;
selecting one block alone runs the page's earlier blocks first. Shell
variables a block sets are set in the page's later blocks, as in a terminal.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guide"
LOGS = ROOT / "tests" / "fixtures" / "vllm-logs" / "gpu-h200-vllm0.26.0"
SKIPS = {"tui": "opens the interactive dashboard", "vllm": "needs vLLM installed",
         "gpu": "needs a GPU server", "cluster": "needs a Ray cluster (tests/test_ray_trials.py starts one)"}
BLOCK_TIMEOUT_S = 300  # the slowest block, a capacity sweep of two presets, takes ~2 min on a loaded box

OPEN = re.compile(r"^(\s*)```sh(?:\s+\{([^}]*)\})?\s*$")


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    code: str
    tags: set[str] = field(default_factory=set)

    @property
    def expected_exit(self) -> int:
        for t in self.tags:
            if t.startswith("exit="):
                return int(t.split("=", 1)[1])
        return 0

    @property
    def skip_reason(self) -> str | None:
        hit = sorted(t for t in self.tags if t in SKIPS)
        return f"{{{hit[0]}}}: {SKIPS[hit[0]]}" if hit else None


def guide_blocks(page: Path) -> list[Block]:
    """The ```sh blocks of one page, dedented to their fence (list items indent theirs)."""
    blocks, lines = [], page.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page.name}:{start + 1}: a ```sh block is never closed")
        tags = set((m.group(2) or "").replace(",", " ").split())
        blocks.append(Block(page.name, start + 1, textwrap.dedent("\n".join(body)) + "\n", tags))
        i += 1
    return blocks


ALL = [b for p in sorted(GUIDE.glob("*.md")) for b in guide_blocks(p)]


def test_the_guide_has_blocks_that_run_and_blocks_marked_to_skip():
    # A guard on the parser: if the fences were not recognised, every
    # parametrised case below would vanish and the suite would stay green.
    assert sum(b.skip_reason is None for b in ALL) >= 10
    assert any(b.skip_reason for b in ALL)
    unknown = {t for b in ALL for t in b.tags if t not in SKIPS and not t.startswith("exit=")}
    assert not unknown, f"unknown info-string tags: {unknown}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stand_in(out: Path) -> tuple[subprocess.Popen, str]:
    """The paced stand-in on a free port; its URL once it accepts connections."""
    log = out.open("w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                             "--slots", "64", "--ttft-ms", "20", "--itl-ms", "20",
                             "--itl-knee", "4", "--itl-slope-ms", "40"],
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"listening on (http://\S+)", out.read_text())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the stand-in did not start: {out.read_text()}")


def write_presets(path: Path, model: Path) -> None:
    """Two stand-in presets, served by tests/paced_server.py as a preset's launcher."""
    body = ""
    for name, slots in (("standin-2", 2), ("standin-4", 4)):
        body += textwrap.dedent(f"""
            [presets.{name}]
            description = "the paced stand-in with {slots} slots"
            extends = "cpu-demo"
            model = "{model}"
            port = {free_port()}
            launcher = ["{sys.executable}", "{ROOT / 'tests' / 'paced_server.py'}"]
            env = {{ PACED_SLOTS = "{slots}", PACED_TTFT_MS = "20", PACED_ITL_MS = "10" }}
            """)
    path.write_text(body)


class GuideRun:
    """Runs blocks page by page, each page in its own directory, in order."""

    def __init__(self, base: Path, env: dict[str, str]):
        self.base, self.env = base, env
        self.done: dict[tuple[str, int], None] = {}

    def page_dir(self, page: str) -> Path:
        d = self.base / "pages" / page.removesuffix(".md")
        if not d.exists():
            d.mkdir(parents=True)
            shutil.copy(LOGS / "ok_block16_len4096.log", d / "llm.log")
            shutil.copy(LOGS / "fail_block8_len2048.log", d / "failed.log")
        return d

    def run(self, block: Block) -> None:
        for earlier in ALL:
            if earlier.page == block.page and earlier.line < block.line and earlier.skip_reason is None:
                if (earlier.page, earlier.line) not in self.done:
                    self._run_one(earlier)
        self._run_one(block)

    def script(self, block: Block) -> str:
        """The block as a reader runs it in one terminal: the shell variables
        earlier blocks of the page set (`ID=...`) are still set."""
        state = self.page_dir(block.page) / ".guide-shell-vars"
        return (f'__guide_before=" $(compgen -v | tr "\\n" " ") "\n'
                f'if [ -f "{state}" ]; then source "{state}"; fi\n'
                f"{block.code}"
                "for __guide_v in $(compgen -v); do\n"
                '  case "$__guide_before" in *" $__guide_v "*) continue;; esac\n'
                '  case "$__guide_v" in __guide*) continue;; esac\n'
                '  declare -p "$__guide_v"\n'
                f'done > "{state}"\n')

    def _run_one(self, block: Block) -> None:
        started = time.monotonic()
        try:
            proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", self.script(block)],
                                  cwd=self.page_dir(block.page), env=self.env, capture_output=True,
                                  text=True, timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{block.page}:{block.line} ran past {BLOCK_TIMEOUT_S} s:\n{block.code}\n{e.stdout}")
        took = time.monotonic() - started
        self.done[(block.page, block.line)] = None
        print(f"{block.page}:{block.line} exit {proc.returncode} in {took:.1f} s")
        if proc.returncode != block.expected_exit:
            pytest.fail(f"{block.page}:{block.line} exited {proc.returncode}, expected {block.expected_exit}:\n"
                        f"{block.code}\n--- stdout (tail)\n{proc.stdout[-3000:]}\n"
                        f"--- stderr (tail)\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="module")
def guide_run(tmp_path_factory):
    from ernie_tui.demo_model import write_demo_model

    base = tmp_path_factory.mktemp("guide")
    model = base / "model"
    write_demo_model(model, "tiny", seed=0)
    presets = base / "presets.toml"
    write_presets(presets, model)
    proc, url = start_stand_in(base / "stand-in.out")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERNIE_TUI_")}
    src = str(ROOT / "src")
    env.update(URL=url, MODEL=str(model), PRESETS=str(presets), ERNIE_TUI_HOME=str(base / "home"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
               COLUMNS="200")
    try:
        yield GuideRun(base, env)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("block", ALL, ids=[f"{b.page}:{b.line}" for b in ALL])
def test_guide_block_runs_as_written(block: Block, guide_run: GuideRun):
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    guide_run.run(block)
