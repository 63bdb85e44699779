"""Talking to a serving engine over HTTP: the client and its errors
(http_client, http_errors), server-sent events and their timing (sse,
stream_chunk, stream_timing), /metrics (metrics), prompts of exact length
(prompts, workload), one probe (probe), a burst (burst), objectives (slo),
the capacity search (capacity, capacity_run), plain statistics (stats), the
Pareto front (pareto) and the run records on disk (runstore).

Never imports launch, logs or control: a load can be aimed at any URL.
"""
