"""Fixed ports for tests whose presets name one, apart per pytest-xdist worker.

A preset's port is part of what a sweep or a tune is tested on (a trial that
finds it taken moves to the next free one, a sequential trial is skipped as
port_in_use), so those tests write fixed ports into their presets. Under
`-n 4 --dist loadgroup` the tests of one file run side by side on several
workers: ciZ6 skipped a sequential trial of
test_parallel_trials_own_their_gpus_side_by_side as port_in_use because
another test of its file had a stand-in on the same 18140. Each worker gets
a block of its own, 1000 ports above the last one's; within a worker tests
run one at a time, and the numbers written in the tests stay apart as before.
"""

from __future__ import annotations

import os

BLOCK = 1000


def worker_index() -> int:
    """0 for gw0 or without xdist, 1 for gw1, ..."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def own_port(port: int) -> int:
    """`port` moved into this worker's block (unchanged on gw0 and without xdist)."""
    # TEST_PORT_OFFSET moves a whole run's ports, so that two checkouts tested
    # side by side on one box (two developers' worktrees) keep apart too.
    moved = port + BLOCK * worker_index() + int(os.environ.get("TEST_PORT_OFFSET", "0") or 0)
    if moved > 32767:  # below Linux's ephemeral range, where free_port() and clients' own ports live
        raise ValueError(f"port {port} moved to {moved}, into the ephemeral range: use a lower one")
    return moved
