"""Before and at launch: what the machine has (machine), free ports and bind
addresses (ports), a model dir's shape (modelinfo), the KV-cache estimate
(estimate), how TP/PP/DP spread over GPUs (parallel_layout), the checks
before a start (preflight, preflight_parallel) and the plain-words diagnosis
of a failure with its fix as a preset change (diagnose).

May read logs (a diagnosis reads a report); never load or control.
"""
