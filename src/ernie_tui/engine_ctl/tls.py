"""One TLS context for every HTTP client of this process.

httpx builds a fresh SSL context for each client (it reads and parses the CA
bundle): about 55 ms of CPU on an idle core of the dev box, 130-190 ms on a
busy one. A capacity level opens several clients (its /metrics pollers, the
stream client), and the load generator's CPU is what a search must keep
small: a busy client reads the server as slow. A context is safe to share
between clients and threads once built, so it is built once, on first use.
A leaf, like units: every district may use it.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default context (certifi's CA bundle, or SSL_CERT_FILE /
    SSL_CERT_DIR from the environment), built once."""
    import httpx  # deferred: most commands never open an HTTPS connection

    return httpx.create_ssl_context()
