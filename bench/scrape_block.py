"""Does a /metrics scrape hold up the vLLM API server's other requests?

Our bursts and capacity levels sample /metrics every 0.25 s while they load
the server; vLLM's bench client never does. If rendering /metrics holds the
API server's event loop (or its GIL), every request that arrives or streams
in that time waits with it, and the load we put on the server is not the
bench client's. This script measures that hold on an idle server, where
nothing else moves the figures: a pinger sends GET /health every
--ping-interval seconds on one keep-alive connection and times each answer;
in the "scraping" arm another process scrapes /metrics every
--scrape-interval seconds on its own connection, in the "quiet" arm nothing
does. Arms alternate for --rounds rounds of --seconds each. Prints, per arm,
the pings' latency p50/p99/max, the scrapes' own time, and the pings that
were in flight during a scrape beside those that were not.

    PYTHONPATH=src .venv/bin/python bench/scrape_block.py --url http://127.0.0.1:8000 [--rounds 3]

The scraper is a process of its own, so the pinger's time is its own and
the server's: the difference between arms is the server's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

import httpx


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _scrape_loop(url: str, interval: float, stop, out) -> None:
    """In its own process, so its parsing never takes the pinger's GIL: only
    the server can make a ping wait for a scrape."""
    got = []
    with httpx.Client(timeout=30.0) as c:
        nxt = time.perf_counter()
        while not stop.is_set():
            t = time.perf_counter()  # CLOCK_MONOTONIC: the pinger's clock too
            r = c.get(url + "/metrics")
            got.append((t, time.perf_counter(), len(r.content)))
            nxt += interval
            stop.wait(max(0.0, nxt - time.perf_counter()))
    out.put(got)


def one_arm(url: str, seconds: float, ping_interval: float, scrape_interval: float | None) -> dict:
    pings: list[tuple[float, float]] = []  # (start, end), perf_counter
    scrapes: list[tuple[float, float, int]] = []  # (start, end, bytes)
    ctx = mp.get_context("spawn")
    stop, box = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_scrape_loop, args=(url, scrape_interval, stop, box)) if scrape_interval else None
    with httpx.Client(timeout=30.0) as c:
        c.get(url + "/health")  # the connection is open before timing starts
        if proc is not None:
            proc.start()
            time.sleep(1.0)  # its interpreter is up and scraping
        t_end = time.perf_counter() + seconds
        nxt = time.perf_counter()
        while (t := time.perf_counter()) < t_end:
            c.get(url + "/health")
            pings.append((t, time.perf_counter()))
            nxt += ping_interval
            time.sleep(max(0.0, nxt - time.perf_counter()))
    if proc is not None:
        stop.set()
        scrapes = box.get(timeout=60)
        proc.join(30)
        t0 = pings[0][0] if pings else 0.0
        scrapes = [x for x in scrapes if x[1] >= t0]
    lat = [(e - s) * 1000 for s, e in pings]
    during = [(e - s) * 1000 for s, e in pings if any(s < se and e > ss for ss, se, _ in scrapes)]
    out = {"pings": len(lat), "ping_p50_ms": pct(lat, 0.5), "ping_p99_ms": pct(lat, 0.99),
           "ping_max_ms": max(lat) if lat else float("nan")}
    if scrapes:
        took = [(e - s) * 1000 for s, e, _ in scrapes]
        out.update({"scrapes": len(scrapes), "scrape_p50_ms": statistics.median(took), "scrape_max_ms": max(took),
                    "scrape_bytes": scrapes[-1][2], "pings_during_scrape": len(during),
                    "ping_during_scrape_p50_ms": pct(during, 0.5), "ping_during_scrape_max_ms":
                        max(during) if during else float("nan")})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ping-interval", type=float, default=0.005)
    p.add_argument("--scrape-interval", type=float, default=0.25)
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args()
    url = a.url.rstrip("/")
    rows = []
    for k in range(a.rounds):
        arms = [("quiet", None), ("scraping", a.scrape_interval)]
        if k % 2:
            arms.reverse()
        for name, interval in arms:
            r = one_arm(url, a.seconds, a.ping_interval, interval)
            r.update(arm=name, round=k)
            rows.append(r)
            extra = ""
            if "scrapes" in r:
                extra = (f" | {r['scrapes']} scrapes of {r['scrape_bytes'] / 1024:.0f} KiB, "
                         f"{r['scrape_p50_ms']:.1f} ms p50 / {r['scrape_max_ms']:.1f} max; "
                         f"pings during one: {r['pings_during_scrape']}, "
                         f"{r['ping_during_scrape_p50_ms']:.1f} ms p50 / {r['ping_during_scrape_max_ms']:.1f} max")
            print(f"round {k + 1} {name:8s}: {r['pings']} pings, {r['ping_p50_ms']:.2f} ms p50 / "
                  f"{r['ping_p99_ms']:.2f} p99 / {r['ping_max_ms']:.1f} max{extra}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
