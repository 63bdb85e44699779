"""Kill what a process leaves behind when it dies without stopping it.

A Ray trial's actor starts a vLLM server in a process group of its own. When
the actor's node is lost (its raylet killed) the worker exits with no Python
cleanup; Ray kills the worker's children, but not theirs: vLLM's engine core
(a child of its API server) would serve on for nobody. So the actor starts
this guard, as a script by its path (`python orphan_guard.py --detach PID`:
no package import, it starts in a blink), in a session of its own and no
child of the actor (see main). It notes PID's descendants every half second; once
PID is gone it terminates, then kills, the ones it saw that are still alive,
with their own children, and exits. When the actor ended normally its server
is stopped already, and the guard finds nothing to do.

Only psutil: it runs outside the package.
"""

from __future__ import annotations

import os
import sys
import time

import psutil

POLL_S = 0.5
TERM_GRACE_S = 5.0


def _descendants(proc: psutil.Process) -> dict[int, float]:
    """pid -> create time of PID's descendants (the guard itself left out)."""
    out = {}
    for child in proc.children(recursive=True):
        if child.pid == os.getpid():
            continue
        try:
            out[child.pid] = child.create_time()
        except psutil.Error:
            pass
    return out


def _still_ours(seen: dict[int, float]) -> list[psutil.Process]:
    """The noted processes still alive (same pid and create time: not a
    reused pid), with whatever they started since the last look."""
    alive: dict[int, psutil.Process] = {}
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != created:
                continue
            for p in [proc, *proc.children(recursive=True)]:
                alive[p.pid] = p
        except psutil.Error:
            continue
    return list(alive.values())


def reap(seen: dict[int, float]) -> int:
    """SIGTERM the noted processes still alive, SIGKILL what is left after
    the grace; how many there were."""
    procs = _still_ours(seen)
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=TERM_GRACE_S)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=2.0)
    return len(procs)


def guard(pid: int) -> None:
    try:
        watched = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    seen: dict[int, float] = {}
    while True:
        try:
            if watched.is_running() and watched.status() != psutil.STATUS_ZOMBIE:
                # Those that ended on their own are dropped (their pid may be
                # reused); a server that went out of the tree (re-parented
                # after its parent died) stays noted.
                seen = {**{p: c for p, c in seen.items() if psutil.pid_exists(p)}, **_descendants(watched)}
                time.sleep(POLL_S)
                continue
        except psutil.Error:
            pass
        reap(seen)
        return


def main(argv: list[str]) -> None:
    """`orphan_guard.py --detach PID`: start the guard of PID as a process
    that is no child of the caller, and return at once. Ray kills a dead
    worker's children, the guard with them if it were one; started from
    this short-lived middle process, it is re-parented away from the worker."""
    if argv[0] == "--detach":
        import subprocess

        subprocess.Popen([sys.executable, __file__, argv[1]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        return
    guard(int(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
