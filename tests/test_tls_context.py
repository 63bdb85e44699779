"""Every HTTP client of the process shares one TLS context (engine_ctl/tls.py):
httpx would otherwise read and parse the CA bundle for each new client, about
55 ms of CPU each on the dev box, and a capacity level opens several."""

from __future__ import annotations

import ssl

from ernie_tui.engine_ctl.load.http_client import new_async_client
from ernie_tui.engine_ctl.load.metrics import MetricsClient
from ernie_tui.engine_ctl.tls import tls_context


def test_clients_share_one_tls_context_instead_of_reading_the_ca_bundle_each(monkeypatch):
    tls_context()  # built once, before counting
    reads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counting(self, *args, **kwargs):
        reads.append(args or kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    for _ in range(3):
        MetricsClient("http://127.0.0.1:9").close()
    import asyncio

    async def open_and_close() -> None:
        await new_async_client(transport="httpx").aclose()

    asyncio.run(open_and_close())
    assert reads == []
    assert tls_context() is tls_context()
    assert tls_context().verify_mode == ssl.CERT_REQUIRED  # still verifying, as httpx's default
