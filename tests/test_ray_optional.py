"""Ray is an optional extra: nothing imports it unless --ray is given, and
--ray without it says how to install it (run in fresh interpreters: within
pytest another test may have imported ray)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_the_cli_the_app_and_every_control_module_load_without_importing_ray():
    out = _run("""
        import importlib, pkgutil, sys
        import ernie_tui.cli, ernie_tui.tui.app, ernie_tui.engine_ctl.control as control
        import ernie_tui.tui.tune_app, ernie_tui.tui.fleet_app, ernie_tui.tui.widgets.ray_panel  # the Ray panel's
        for m in pkgutil.iter_modules(control.__path__):
            importlib.import_module(f"ernie_tui.engine_ctl.control.{m.name}")
        from ernie_tui.cli import main
        for cmd in (["tune", "--help"], ["sweep", "--help"]):
            try:
                main(cmd)
            except SystemExit:
                pass
        print("RAY", sorted(m for m in sys.modules if m.split(".")[0] == "ray"))
    """)
    assert out.returncode == 0, out.stderr
    assert "RAY []" in out.stdout, out.stdout[-500:]
    assert "--ray [ADDRESS]" in out.stdout and "--storage URL" in out.stdout


def test_ray_asked_for_but_not_installed_says_how_to_install_it(tmp_path):
    # `import ray` fails here as it does where the extra is not installed.
    space = tmp_path / "space.toml"
    space.write_text("max_num_seqs = [1, 2]\n")
    for argv in (["sweep", "cpu-demo", "--out", str(tmp_path / "t.md"), "--ray"],
                 ["tune", "cpu-demo", "--space", str(space), "--ray", "h:6379"],
                 ["--ray", "h:6379"]):  # the fleet view of a cluster
        out = _run(f"""
            import sys
            sys.modules["ray"] = None  # as if not installed: import ray raises ImportError
            from ernie_tui.cli import main
            sys.exit(main({argv!r} + ["--model", {str(tmp_path)!r}]))
        """)
        assert out.returncode != 0, out.stdout
        assert "--ray needs Ray: pip install 'ernie-tui[ray]'" in out.stderr, out.stderr[-800:]
