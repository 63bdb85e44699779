"""Everything that talks to vLLM: process control, log tailing and parsing,
/metrics, GPU sampling, probes, preflight and diagnosis.

This package must never import Textual or Rich (tests/test_import_contract.py
checks it in a fresh interpreter), so that it can run headless in scripts,
benchmarks and CI.
"""
