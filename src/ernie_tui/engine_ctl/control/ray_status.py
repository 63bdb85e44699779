"""What a Ray cluster running trials looks like now: its nodes and the
trials' servers, as plain data for a screen (the tune screen, the fleet
view) or a test; no Ray here, no Textual.

RayTrials.snapshot() (ray_trials.py) asks the cluster: its nodes (ray.nodes(),
the dead ones too: a node lost mid-trial stays listed, as lost) and each
trial actor's own account (TrialActor.status(): the trial, its node, its
server's URL, what it does now, the nodes it lost before). `build_snapshot`
turns those answers into a RaySnapshot; it is the one place that reads
their shape.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# Actors of trials are named with this prefix in the "ernie-tui" namespace,
# so that any process joined to the cluster (the fleet view) finds them.
TRIAL_ACTOR_PREFIX = "ernie-tui-trial/"


def node_label(address: str | None, node_id: str) -> str:
    """How a node is named everywhere (rows, events, the screens): its
    address and the start of its id (several nodes may share one address)."""
    return f"{address or '?'} {node_id[:12]}"


def resources_text(res: dict[str, float]) -> str:
    """A node's resources in words, without Ray's per-node and memory entries."""
    return ", ".join(f"{k} {v:g}" for k, v in sorted(res.items()) if not k.startswith("node:")
                     and not k.endswith("memory")) or "nothing"


@dataclass(frozen=True)
class RayNodeView:
    """One node of the cluster."""

    id: str
    address: str
    resources: dict[str, float]
    alive: bool

    @property
    def label(self) -> str:
        return node_label(self.address, self.id)

    @property
    def resources_words(self) -> str:
        return resources_text(self.resources)


@dataclass(frozen=True)
class RayTrialView:
    """One trial running on the cluster now, as its actor tells it."""

    trial: str  # the preset it measures (BASE-tune-N, or a sweep's preset)
    repeat: int
    node: str  # node_label of the node it runs on
    url: str | None  # its server's URL on that node (None before its port is chosen)
    phase: str  # what it does now: preflight, starting, capacity: concurrency 2, ...
    lost: tuple[str, ...] = ()  # nodes it ran on before, lost mid-trial: it runs again here
    driver: str = ""  # the command that runs it (host:pid)

    @property
    def retried_after_node_loss(self) -> bool:
        return bool(self.lost)


@dataclass(frozen=True)
class RaySnapshot:
    """The cluster's nodes and its running trials at `taken_at` (wall clock)."""

    address: str
    nodes: tuple[RayNodeView, ...] = ()
    trials: tuple[RayTrialView, ...] = ()
    taken_at: float = field(default_factory=time.time)
    error: str | None = None  # the cluster could not be asked; the rest is empty

    def trials_on(self, node: RayNodeView) -> list[RayTrialView]:
        return [t for t in self.trials if t.node == node.label]

    def unplaced(self) -> list[RayTrialView]:
        """Trials whose node is not among the nodes listed (left the cluster's list)."""
        labels = {n.label for n in self.nodes}
        return [t for t in self.trials if t.node not in labels]


def build_snapshot(address: str, ray_nodes: list[dict[str, Any]], statuses: list[dict[str, Any]],
                   taken_at: float | None = None) -> RaySnapshot:
    """A RaySnapshot from ray.nodes()' entries (NodeID, NodeManagerAddress,
    Resources, Alive) and the trial actors' status() answers."""
    nodes = tuple(sorted((RayNodeView(str(n["NodeID"]), str(n.get("NodeManagerAddress") or "?"),
                                      {k: float(v) for k, v in (n.get("Resources") or {}).items()},
                                      bool(n.get("Alive")))
                          for n in ray_nodes), key=lambda n: (not n.alive, n.address, n.id)))
    trials = tuple(sorted((RayTrialView(str(s["trial"]), int(s.get("repeat", 0)), str(s["node"]), s.get("url"),
                                        str(s.get("phase") or "placed"), tuple(s.get("lost") or ()),
                                        str(s.get("driver") or ""))
                           for s in statuses), key=lambda t: (t.node, t.trial, t.repeat)))
    return RaySnapshot(address, nodes, trials, time.time() if taken_at is None else taken_at)


def phase_of(event: dict[str, Any]) -> str | None:
    """A trial's progress event in a few words (None: it says nothing new):
    its phase, and in a capacity search the concurrency or rate it measures."""
    phase = event.get("phase")
    if not phase:
        return None
    ce = event.get("capacity_event") or {}
    level = ce.get("level")
    rate = getattr(level, "rate", None) if level is not None else ce.get("rate")
    at = getattr(level, "concurrency", None) if level is not None else ce.get("concurrency")
    if phase == "capacity" and rate is not None:
        return f"capacity: rate {rate:g}/s"
    if phase == "capacity" and at is not None:
        return f"capacity: concurrency {at}"
    return str(phase)
