"""TCP ports: is one free the way vLLM will bind it, and which one is next."""

from __future__ import annotations

import errno
import socket


def port_is_free(host: str, port: int) -> tuple[bool, str]:
    """Bind as vLLM's server does (SO_REUSEADDR), then let go at once.
    Returns (free, why-not)."""
    bind_host = "0.0.0.0" if host in ("", None) else host.strip("[]")
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((bind_host, port))
        return True, ""
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return False, "in use"
        return False, exc.strerror or str(exc)
    finally:
        s.close()


def next_free_port(host: str, port: int, tries: int = 200) -> int | None:
    for p in range(port + 1, min(65536, port + 1 + tries)):
        if port_is_free(host, p)[0]:
            return p
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free right now (for tests and benchmarks)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
