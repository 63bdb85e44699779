"""The paired sweep's turn gate (engine_ctl/control/turn_gate.py): searches'
levels one at a time, in strict rotation; an ended search leaves it; cancel
lets every waiting level through."""

from __future__ import annotations

import threading
import time

from ernie_tui.engine_ctl.control.turn_gate import TurnGate


def _searches(gate: TurnGate, levels: dict[str, int], ran: list[tuple[str, object, object]],
              start_delay: dict[str, float] | None = None) -> list[threading.Thread]:
    """One thread per search: `levels[name]` levels through the gate, then leave."""
    busy = threading.Lock()

    def level(name: str):
        def run(load, min_requests=None):
            assert busy.acquire(blocking=False), "two levels ran at once"
            try:
                ran.append((name, load, min_requests))
                time.sleep(0.01)  # a level takes time: the others must wait for it
            finally:
                busy.release()
            return load
        return run

    def search(name: str) -> None:
        time.sleep((start_delay or {}).get(name, 0.0))
        gated = gate.wrap(name, level(name))
        try:
            for k in range(levels[name]):
                gated(k) if k < levels[name] - 1 else gated(k, min_requests=8)  # the last: a confirmation
        finally:
            gate.leave(name)

    threads = [threading.Thread(target=search, args=(n,)) for n in levels]
    for t in threads:
        t.start()
    return threads


def test_levels_alternate_strictly_and_an_ended_search_leaves_the_rotation():
    gate = TurnGate(["A", "B", "C"])
    ran: list = []
    # C's thread starts first and A's last: the rotation still begins with A.
    threads = _searches(gate, {"A": 4, "B": 2, "C": 3}, ran, start_delay={"A": 0.05, "B": 0.02})
    for t in threads:
        t.join(10)
    assert [n for n, _, _ in ran] == ["A", "B", "C", "A", "B", "C", "A", "C", "A"]
    assert gate.order == [n for n, _, _ in ran]
    # each search's levels in its own order, the confirmation's min_requests passed through
    assert [(load, mr) for n, load, mr in ran if n == "A"] == [(0, None), (1, None), (2, None), (3, 8)]


def test_the_first_level_waits_for_every_search_to_arrive():
    # B's set-up takes a while: A's first level must not run beside it.
    gate = TurnGate(["A", "B"])
    ran: list = []
    arrived_b = threading.Event()
    first_a_saw_b: list[bool] = []

    def a() -> None:
        gate.wrap("A", lambda load: first_a_saw_b.append(arrived_b.is_set()))(1)
        gate.leave("A")

    def b() -> None:
        time.sleep(0.2)  # its set-up
        arrived_b.set()
        gate.wrap("B", lambda load: ran.append("B"))(1)
        gate.leave("B")

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert first_a_saw_b == [True] and ran == ["B"]


def test_a_search_that_ends_before_its_first_level_does_not_hold_the_others():
    gate = TurnGate(["A", "B"])
    ran: list = []
    threads = _searches(gate, {"A": 0, "B": 3}, ran)
    for t in threads:
        t.join(10)
    assert [n for n, _, _ in ran] == ["B", "B", "B"]


def test_cancel_lets_a_waiting_level_through():
    cancel = threading.Event()
    gate = TurnGate(["A", "B"], cancel)
    hold = threading.Event()
    b_ran = threading.Event()
    a = threading.Thread(target=gate.wrap("A", lambda load: hold.wait(10)), args=(1,))
    a.start()
    b = threading.Thread(target=gate.wrap("B", lambda load: b_ran.set()), args=(1,))
    b.start()
    assert not b_ran.wait(0.3)  # A's level holds the turn: B waits
    cancel.set()
    assert b_ran.wait(5)  # cancelled: B's level runs (a runner returns a cancelled level at once)
    hold.set()
    a.join(5)
    b.join(5)
