"""`ernie-tui` with no command: the dashboard.

    ernie-tui [--preset NAME] [--presets FILE] [--model DIR] [--start]   control mode
                                          (takes back a server a previous session left running)
    ernie-tui --attach URL [--log PATH]                                   monitor only
    ernie-tui --attach URL --attach URL ... | --fleet FILE                the fleet view
    ernie-tui [--attach URL ... | --fleet FILE] --ray [ADDRESS]           the fleet view with a Ray cluster
    ernie-tui --replay LOG                                                offline

After the app exits this finishes what it left to do: stop the server (quit
chose stop, or the terminal hung up with --on-exit ask/stop) or say how to
re-attach to the one left running.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from ernie_tui.cli.errors import CliError
from ernie_tui.cli.fleet import run_fleet
from ernie_tui.cli.urls import server_url


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # the terminal is gone (SIGHUP)


def run_dashboard(args) -> int:
    from ernie_tui.tui.app import make_app  # lazy: --help start-up

    attach = getattr(args, "attach", None)
    replay = getattr(args, "replay", None)
    log = getattr(args, "log", None)
    attach_all = [attach] if isinstance(attach, str) else list(attach or [])
    attach_all = [server_url(u, "--attach") for u in attach_all]
    if getattr(args, "fleet", None) or len(attach_all) > 1 or getattr(args, "ray", None) is not None:
        return run_fleet(args, attach_all)
    attach = attach_all[0] if attach_all else None
    if attach and replay:
        raise CliError("--attach and --replay exclude each other")
    if log and not attach:
        raise CliError("--log goes with --attach (use --replay LOG to open a captured log)")
    if replay:
        if not Path(replay).is_file():
            raise CliError(f"{replay}: no such log file")
        mode = "replay"
    elif attach:
        mode = "attach"
        if not log:
            log = _detached_log_for(attach)
    else:
        mode = "control"

    app = make_app(
        mode=mode,
        preset=getattr(args, "preset", None),
        preset_files=getattr(args, "presets", None) or [],
        model=getattr(args, "model", None),
        attach_url=attach,
        log_path=log,
        replay_path=replay,
        start=bool(getattr(args, "start", False)) and mode == "control",
        on_exit=getattr(args, "on_exit", "ask") or "ask",
        api_key=os.environ.get("VLLM_API_KEY"),
    )
    app.finisher = _finish
    try:
        app.run()
    finally:
        code = _finish(app)
    if app.return_code not in (None, 0):
        return int(app.return_code)
    return code


_finish_lock = threading.Lock()


def _finish(app) -> int:
    """Stop or detach the server as the session decided; runs once (the
    normal exit path and a hangup's thread may both get here)."""
    with _finish_lock:
        if getattr(app, "_finished", None) is not None:
            return app._finished
        app._finished = code = _finish_once(app)
        return code


def _finish_once(app) -> int:
    server = app.server
    if app.mode != "control" or server is None:
        if server is not None:
            try:
                server.close()
            except Exception as exc:  # noqa: BLE001  the exit (and SIGHUP) path must finish; said, not raised
                _say(f"ernie-tui: closing the watcher failed: {exc}")
        return 0
    status = server.status
    if app.exit_action == "leave":
        if status.running and getattr(app, "detach_record", None) is None:
            try:
                app.detach_record = server.detach()  # a hangup with --on-exit leave: record it here
            except Exception as exc:  # noqa: BLE001  the exit (and SIGHUP) path must finish; said, not raised
                _say(f"ernie-tui: could not record the detached server: {exc}")
        if status.running:
            _say(f"ernie-tui: left {status.preset_name} running at {status.url} (pid {status.pid}); "
                 "take it back with plain `ernie-tui` (x stops it there), or stop it with `ernie-tui stop`")
        return 0
    if status.running or app.exit_action == "stop":
        # Quit chose stop and the in-app stop failed, the terminal hung up,
        # or the app died: never leave an engine behind by accident.
        if status.running:
            _say(f"ernie-tui: stopping {status.preset_name} (pid {status.pid}) ...")
        try:
            server.stop()
        except Exception as exc:  # noqa: BLE001  the exit (and SIGHUP) path must finish; said, not raised
            _say(f"ernie-tui: stopping the server failed: {exc}")
            return 1
    return 0


def _detached_log_for(url: str) -> str | None:
    """--attach to the server a previous session left running: find its log."""
    try:
        from ernie_tui.engine_ctl.control import find_detached  # lazy: --help start-up
    except ImportError:
        return None
    info = find_detached()
    if info and str(info.get("url", "")).rstrip("/") == url.rstrip("/"):
        log = info.get("log_path")
        return log if log and Path(log).exists() else None
    return None
