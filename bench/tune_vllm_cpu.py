"""`ernie-tui tune` on real vLLM on this CPU box, then the dashboard's one key
to the preset it wrote (#46's CPU goal).

BASE extends `cpu-demo` (the tiny ERNIE-4.5-shaped model of the tests) with
max_num_seqs 2: under a TTFT limit it queues what is past 2 requests. The
space is max_num_seqs x max_num_batched_tokens. The tune measures BASE, then
`--trials` settings Optuna picks (each its own vLLM start and capacity
search), then compares the best with BASE as the paired sweep does (both up
at once, `--confirm` duel rounds). It runs in a run store and presets file
of its own (ERNIE_TUI_HOME in a temporary folder), so nothing of yours moves.

Then, when the tune wrote the preset (it does only when the best beat BASE
beyond noise), the dashboard: `make_app()` in Textual's Pilot, the tuned
preset chosen once (its number key, or Enter on it in the presets panel: the
user file's presets come after the built-ins, past the ninth key), and the
server it starts must serve with the tuned settings (its argv) and come up
ready.

    .venv/bin/python bench/tune_vllm_cpu.py                 # 3 trials, --confirm 3
    .venv/bin/python bench/tune_vllm_cpu.py --trials 4 --keep /tmp/tunecpu

It prints the trials, the verdict against BASE, the preset written, the key
pressed and what the dashboard's server ran, and the wall times.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from rank_vllm_cpu import SWEEP_ARGS as LOAD_ARGS  # noqa: E402  (the ranking's load and SLO on this box)
from vllm_support import tiny_model_dir  # noqa: E402  (the tests' tiny ERNIE-4.5-shaped model)

SPACE = """\
max_num_seqs = [2, 8, 32]
max_num_batched_tokens = [2048, 8192]
"""


def write_inputs(work: Path, port: int) -> tuple[Path, Path]:
    presets = work / "presets.toml"
    presets.write_text(textwrap.dedent(f"""
        [presets.seqs2]
        description = "cpu-demo with at most 2 running sequences: the tune's BASE"
        extends = "cpu-demo"
        model = "{tiny_model_dir()}"
        port = {port}
        max_num_seqs = 2
    """))
    space = work / "space.toml"
    space.write_text(SPACE)
    return presets, space


def run_tune(work: Path, presets: Path, space: Path, trials: int, confirm: int, env: dict[str, str]) -> float:
    argv = [sys.executable, "-m", "ernie_tui", "tune", "seqs2", "--presets", str(presets), "--space", str(space),
            "--trials", str(trials), "--confirm", str(confirm), "--out-preset", "seqs2-tuned",
            "--log-dir", str(work / "logs"), *LOAD_ARGS]
    print("$", " ".join(argv[1:]), flush=True)
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        sys.exit(f"the tune exited {done.returncode} after {wall:.0f} s")
    return wall


def tune_record() -> dict:
    from ernie_tui.engine_ctl.load import runstore  # reads ERNIE_TUI_HOME, set in main()

    runs = runstore.list_runs(kind="tune")
    if not runs:
        sys.exit("no tune record in the run store")
    return runs[0].results


def summarise(res: dict) -> None:
    for t in res["trials"]:
        print(f"  trial {t['number']}: {t['params']} {t['outcome']} goodput {t.get('goodput')}")
    print("best:", res["best"]["preset"], res["best"]["params"], "goodput", res["best"].get("goodput"))
    print("verdict:", res["verdict"]["text"])
    print("stopped:", res["stopped"])


async def press_tuned_key(presets: Path, name: str, timeout_s: float) -> None:
    """The dashboard, its key (or Enter on it) for `name`, and the server that starts."""
    from ernie_tui.engine_ctl.control import ServerState
    from ernie_tui.tui.app import make_app
    from ernie_tui.tui.widgets.presets_panel import PresetsPanel

    app = make_app(preset_files=[str(presets)], on_exit="stop")
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        names = app.main.preset_names  # the presets panel's numbering, which the 1-9 keys follow
        number = names.index(name) + 1
        key = str(number) if number <= 9 else "enter"
        print(f"dashboard: {name} is preset {number} of {len(names)}; pressing {key}", flush=True)
        if key == "enter":  # past the ninth: highlighted in the panel, then Enter
            app.main.query_one(PresetsPanel).highlight(name)
            app.main.query_one("#preset-list").focus()
        t0 = time.monotonic()
        await pilot.press(key)
        while time.monotonic() - t0 < timeout_s:
            await pilot.pause(1.0)
            st = app.server.status if app.server is not None else None
            if st is not None and st.state in (ServerState.READY, ServerState.CRASHED):
                break
        st = app.server.status
        argv = app.server.spec.argv
        print(f"dashboard: active preset {app.active_preset}, server {st.state.value} after "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        print("dashboard: server argv:", " ".join(argv[argv.index("--model"):]), flush=True)
        assert app.active_preset == name and st.state == ServerState.READY, st
        await pilot.press("q")
        await pilot.pause(2.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--confirm", type=int, default=3)
    ap.add_argument("--port", type=int, default=28471)
    ap.add_argument("--keep", type=Path, help="work here (kept) instead of a temporary folder")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="tune-vllm-cpu-"))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    env = {**os.environ, "ERNIE_TUI_HOME": str(home), "PYTHONPATH": str(ROOT / "src")}
    os.environ["ERNIE_TUI_HOME"] = str(home)  # the dashboard below reads the same presets file and store
    presets, space = write_inputs(work, args.port)
    wall = run_tune(work, presets, space, args.trials, args.confirm, env)
    print(f"tune: {wall:.0f} s wall")
    res = tune_record()
    summarise(res)
    decided = res["extra"].get("preset", {})
    if not decided.get("write"):
        print(f"preset seqs2-tuned not written: {decided.get('why')}; no dashboard step")
        return
    asyncio.run(press_tuned_key(presets, "seqs2-tuned", 600))
    print("work folder:", work)


if __name__ == "__main__":
    main()
