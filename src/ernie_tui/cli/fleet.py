"""`ernie-tui --attach URL --attach URL ...` or `--fleet FILE`: the fleet view
(with `--ray [ADDRESS]`, a Ray cluster's nodes and trials too).

Not a subcommand module (those are cmd_*.py): run_dashboard hands over here
when more than one server is named.
"""

from __future__ import annotations

from pathlib import Path

from ernie_tui.cli.errors import CliError
from ernie_tui.cli.urls import server_url


def fleet_servers(fleet_file: str | None, urls: list[str], ray: bool = False) -> list:
    """The fleet file's servers, then each --attach URL (named host:port).
    A URL the previous session left running (quit: leave) gets its log and
    preset from the record it left."""
    from dataclasses import replace

    from ernie_tui.engine_ctl.control import FleetError, load_fleet, servers_from_urls  # lazy: --help start-up

    servers = []
    if fleet_file:
        try:
            servers = load_fleet(fleet_file)
        except FleetError as exc:
            raise CliError(str(exc)) from exc
    servers += servers_from_urls([server_url(u, "--attach") for u in urls], taken=[s.name for s in servers])
    if not servers and not ray:
        raise CliError("the fleet view needs servers: --attach URL (repeated) or --fleet FILE (or --ray: a Ray "
                       "cluster's trials)")
    record = _detached_record()
    if record:
        url = str(record.get("url", "")).rstrip("/")
        log = record.get("log_path")
        servers = [replace(s, log=s.log or (log if log and Path(log).exists() else None),
                           preset=s.preset or record.get("preset"))
                   if s.url.rstrip("/") == url else s for s in servers]
    return servers


def _detached_record() -> dict | None:
    try:
        from ernie_tui.engine_ctl.control import find_detached  # lazy: --help start-up
    except ImportError:
        return None
    return find_detached()


def _ray(address: str) -> object:
    """A RayTrials joined to the cluster (only asked for its snapshot)."""
    from ernie_tui.cli.ray_args import AUTO
    from ernie_tui.engine_ctl.control import RayTrials, RayTrialsError  # lazy: Ray only with --ray

    try:
        return RayTrials(None if address == AUTO else address).connect()
    except RayTrialsError as exc:
        raise CliError(str(exc)) from None


def run_fleet(args, urls: list[str]) -> int:
    from ernie_tui.tui.fleet_app import make_fleet_app  # lazy: --help start-up

    if getattr(args, "replay", None):
        raise CliError("--replay opens one log; it does not go with the fleet view")
    if getattr(args, "log", None):
        raise CliError("--log goes with a single --attach; give each server's log in a fleet file (log = PATH)")
    if getattr(args, "start", False):
        raise CliError("--start is for control mode; the fleet view only watches")
    ray_address = getattr(args, "ray", None)
    servers = fleet_servers(getattr(args, "fleet", None), urls, ray=ray_address is not None)
    app = make_fleet_app(servers, preset_files=getattr(args, "presets", None) or [],
                         ray=None if ray_address is None else _ray(ray_address))
    try:
        app.run()
    finally:
        if app.server is not None:  # a dashboard was open at quit: let go of it (it never stops a server)
            try:
                app.server.close()
            except OSError:
                pass
    return int(app.return_code or 0)
