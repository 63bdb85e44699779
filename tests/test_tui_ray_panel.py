"""The Ray panel of the tune screen and the fleet view (`--ray`), at 80x24
and 120x40: the nodes (address, resources, alive or lost), each running
trial's node and server URL, a trial run again after a node loss marked so.

Fed RayStatus messages (what their thread worker posts) holding snapshots
made by engine_ctl's build_snapshot from what Ray and the trial actors
answer, in the shape they answer it (test_ray_trials.py checks that shape
and the panel on a real cluster). No Ray needed here: nothing runs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.widgets import DataTable

from ernie_tui.cli import build_parser
from ernie_tui.cli.cmd_tune import _setup
from ernie_tui.engine_ctl.control import RayTrials, build_snapshot
from ernie_tui.engine_ctl.control.fleet import FleetServer
from ernie_tui.tui.fleet_app import make_fleet_app
from ernie_tui.tui.messages import RayStatus
from ernie_tui.tui.tune_app import TuneApp
from ernie_tui.tui.widgets.ray_panel import MAX_LINES, RayPanel
from test_tune import FAST, _standin
from worker_ports import own_port

LIVE_ID = "5f3a9c0e1b2d" + "a" * 44
LOST_ID = "9a8b7c6d5e4f" + "b" * 44
HEAD_ID = "0123456789ab" + "c" * 44


def _node(node_id: str, alive: bool, slot: bool = True) -> dict:
    """A node as ray.nodes() lists it."""
    res = {"CPU": 1.0, "memory": 2.0e9, "object_store_memory": 8.0e7, "node:127.0.0.1": 1.0}
    if slot:
        res["trial_slot"] = 1.0
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "127.0.0.1", "Resources": res}


def _status(trial: str, node_id: str, port: int, phase: str, lost: list[str]) -> dict:
    """A trial as its actor's status() tells it."""
    return {"trial": trial, "repeat": 0, "lost": lost, "driver": "box:4242",
            "node": f"127.0.0.1 {node_id[:12]}", "url": f"http://127.0.0.1:{port}", "phase": phase}


def _snapshot(extra_nodes: int = 0):
    nodes = [_node(HEAD_ID, True, slot=False), _node(LIVE_ID, True), _node(LOST_ID, False)]
    nodes += [_node(f"{i:012x}" + "d" * 44, True) for i in range(extra_nodes)]
    trials = [_status("shaped-tune-3", LIVE_ID, 18601, "capacity: concurrency 2", [f"127.0.0.1 {LOST_ID[:12]}"])]
    return build_snapshot("127.0.0.1:6379", nodes, trials)


def _panel_text(panel: RayPanel) -> str:
    return str(panel.render())


def _tune_app(tmp_path, tiny_model, ray: bool = True) -> TuneApp:
    presets, space = _standin(tmp_path, tiny_model, own_port(18491), "max_num_seqs = [1, 2, 3]\n")
    args = build_parser().parse_args(["tune", "shaped", "--presets", str(presets), "--space", str(space),
                                      "--trials", "2", "--no-preset", *FAST])
    setup = _setup(args)
    if ray:  # a RayTrials never connected: live=False asks it nothing, the test posts the snapshots
        setup = replace(setup, options=replace(setup.options, ray=RayTrials("127.0.0.1:6379")))
    return TuneApp(setup, live=False)


def _fits(panel: RayPanel, table: DataTable, lines: int) -> None:
    """Every line of the panel on a line of its own (none wrapped or cut
    off), and the table beside it keeps room for rows."""
    assert panel.region.height == lines + 1  # its lines, and the rule above them
    assert table.region.height >= 3, table.region


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_tune_screen_shows_the_nodes_and_the_trials_servers(tmp_path, tiny_model, size):
    app = _tune_app(tmp_path, tiny_model)
    async with app.run_test(size=size) as pilot:
        screen = app.tune_screen
        panel = screen.query_one("#tn-ray", RayPanel)
        assert "asking the cluster" in _panel_text(panel)
        screen.post_message(RayStatus(_snapshot()))
        await pilot.pause()
        text = _panel_text(panel).splitlines()
        assert text[0].startswith("Ray 127.0.0.1:6379 · 2 nodes alive, 1 lost · 1 trial running"), text
        # Alive nodes first, each with its resources (Ray's memory and node: entries left out); the lost one last.
        assert text[1].startswith("● 127.0.0.1 0123456789ab  alive  CPU 1") and "memory" not in text[1]
        assert text[2].startswith("● 127.0.0.1 5f3a9c0e1b2d  alive  CPU 1, trial_slot 1")
        # The trial under its node: its server's URL, what it does, and that it runs again after a loss.
        assert text[3].startswith("  └ shaped-tune-3 r0  http://127.0.0.1:18601  capacity: concurrency 2")
        if size[0] >= 120:
            assert text[3].endswith("again: lost 127.0.0.1 9a8b7c6d5e4f")
        assert text[4].startswith("✖ 127.0.0.1 9a8b7c6d5e4f  LOST")
        _fits(panel, screen.query_one("#tn-trials", DataTable), len(text))


async def test_a_tune_without_ray_has_no_ray_panel(tmp_path, tiny_model):
    app = _tune_app(tmp_path, tiny_model, ray=False)
    async with app.run_test(size=(80, 24)):
        assert not app.tune_screen.query(RayPanel)


async def test_a_big_cluster_keeps_the_panel_short_and_says_how_much_more(tmp_path, tiny_model):
    app = _tune_app(tmp_path, tiny_model)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.tune_screen
        screen.post_message(RayStatus(_snapshot(extra_nodes=12)))
        await pilot.pause()
        panel = screen.query_one("#tn-ray", RayPanel)
        text = _panel_text(panel).splitlines()
        assert len(text) == MAX_LINES and text[-1] == "… 10 more lines (nodes and trials)", text
        _fits(panel, screen.query_one("#tn-trials", DataTable), MAX_LINES)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_fleet_view_shows_the_cluster_under_its_servers(size):
    servers = [FleetServer("alpha", "http://10.0.0.1:8000"), FleetServer("beta", "http://10.0.0.2:8000")]
    app = make_fleet_app(servers, live=False, include_user_presets=False, ray=RayTrials("127.0.0.1:6379"))
    async with app.run_test(size=size) as pilot:
        app.fleet.post_message(RayStatus(_snapshot()))
        await pilot.pause()
        panel = app.fleet.query_one("#fleet-ray", RayPanel)
        text = _panel_text(panel).splitlines()
        assert "1 lost" in text[0] and "✖ 127.0.0.1 9a8b7c6d5e4f  LOST" in text[4]
        assert text[3].startswith("  └ shaped-tune-3 r0  http://127.0.0.1:18601")
        table = app.fleet.query_one("#fleet-table", DataTable)
        _fits(panel, table, len(text))
        assert table.row_count == 2


async def test_a_cluster_that_cannot_be_asked_says_so_in_one_line():
    from ernie_tui.engine_ctl.control import RaySnapshot

    app = make_fleet_app([], live=False, include_user_presets=False, ray=RayTrials("127.0.0.1:6379"))
    async with app.run_test(size=(80, 24)) as pilot:
        app.fleet.post_message(RayStatus(RaySnapshot("127.0.0.1:6379", error="ConnectionError: GCS gone")))
        await pilot.pause()
        text = _panel_text(app.fleet.query_one("#fleet-ray", RayPanel))
        assert text == "Ray 127.0.0.1:6379 · cannot ask the cluster: ConnectionError: GCS gone"
