"""The server's side of a capacity level: vLLM's /metrics sampled while the
level runs (running/waiting peaks, the KV-cache peak, the mean waiting queue),
and vLLM's own figures for the level from its opening and closing scrapes.

Not exposed by probe/burst and so written here: the /metrics sampler with a
waiting-queue mean (burst keeps its own private).
"""

from __future__ import annotations

import threading

from ernie_tui.engine_ctl.load import metrics as M


class MetricsSampler(threading.Thread):
    """Polls running/waiting/KV usage while a level runs (a thread: the scrape
    is a blocking call that must not stall the loop timing the streams). It
    owns its client and closes it when it ends: a scrape under way when the
    level ends may outlast stop()'s wait."""

    def __init__(self, client: M.MetricsClient, interval: float, feed: M.MetricsFeed | None = None) -> None:
        super().__init__(name="capacity-sampler", daemon=True)
        self.scrapes = M.LoadScrapes(client, feed)  # the dashboard's scrapes, read instead of ours while fresh
        self.interval = interval
        self.halt = threading.Event()
        self.kv_peak: float | None = None
        self.running_peak: float | None = None
        self.waiting_peak: float | None = None
        self.waiting_sum = 0.0
        self.waiting_n = 0

    def run(self) -> None:
        try:
            self._poll()
        finally:
            self.scrapes.client.close()

    def _poll(self) -> None:
        while not self.halt.is_set():
            snap = self.scrapes.next()  # None: nothing new (a snapshot is counted once)
            if snap is not None:
                for attr, value in (("kv_peak", snap.kv_cache_usage_pct), ("running_peak", snap.running),
                                    ("waiting_peak", snap.waiting)):
                    if value is not None:
                        old = getattr(self, attr)
                        setattr(self, attr, value if old is None else max(old, value))
                if snap.waiting is not None:
                    self.waiting_sum += snap.waiting
                    self.waiting_n += 1
            self.halt.wait(self.interval)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)

    @property
    def waiting_mean(self) -> float | None:
        return self.waiting_sum / self.waiting_n if self.waiting_n else None


def vllm_window(before: M.MetricsSnapshot | None, after: M.MetricsSnapshot | None) -> dict[str, float | None] | None:
    """vLLM's own figures for the window between two scrapes, in ms."""
    if before is None or after is None:
        return None

    def q(h: M.Histogram | None, p: float) -> float | None:
        v = h.quantile(p) if h is not None else None
        return None if v is None else v * 1000.0

    ttft = M.histogram_delta(before, after, M.TTFT)
    itl = M.histogram_delta(before, after, M.ITL)
    e2e = M.histogram_delta(before, after, M.E2E)
    # Time in vLLM's waiting queue (a mean: its buckets are coarse at the
    # low end): whether the TTFT a client read was the server queueing. On
    # an H200 our 512-stream levels and the bench client's runs at 512 read
    # TTFT p99 0.2 and 1.4-2.1 s (eighteenth run), and nothing said which load queued.
    queue = M.histogram_delta(before, after, M.QUEUE)
    return {
        "ttft_p50_ms": q(ttft, 0.5), "ttft_p99_ms": q(ttft, 0.99),
        "ttft_mean_ms": None if ttft is None or ttft.mean is None else ttft.mean * 1000.0,
        "itl_p50_ms": q(itl, 0.5), "itl_p99_ms": q(itl, 0.99),
        "itl_mean_ms": None if itl is None or itl.mean is None else itl.mean * 1000.0,
        "e2e_p50_ms": q(e2e, 0.5), "e2e_p99_ms": q(e2e, 0.99),
        "queue_mean_ms": None if queue is None or queue.mean is None else queue.mean * 1000.0,
        "requests_finished": M.counter_delta(before, after, M.REQUEST_SUCCESS),
        "generation_tokens": M.counter_delta(before, after, M.GENERATION_TOKENS),
        "preemptions": M.counter_delta(before, after, M.PREEMPTIONS),
        # Prompt tokens served from vLLM's prefix cache: more than none with
        # built prompts would mean repeats made the level look faster.
        "prefix_cache_hit_tokens": M.counter_delta(before, after, M.PREFIX_HITS),
        "window_s": M.elapsed(before, after),
    }
