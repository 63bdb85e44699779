"""TCP ports and bind addresses: is a port free the way vLLM will bind it,
which one is next, who can reach a server bound to a given host, and whether
the server holding a port is the one a dashboard left running (server.json)."""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

from ernie_tui import paths

# Where `q` -> leave records the server it leaves running (control/server.py
# writes it; the next dashboard adopts that server, `ernie-tui stop` stops it).
DETACHED_FILE = "server.json"


def read_detached(clear_stale: bool = True) -> dict | None:
    """The record of the server a dashboard left running, while that server
    still runs. A record naming a dead pid (or a pid since reused by another
    process: its start time differs) is stale and, with `clear_stale`, removed."""
    path = paths.state_dir() / DETACHED_FILE
    try:
        info = json.loads(path.read_text())
        pid = int(info["pid"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        info, pid = None, -1
    if info is not None and _leader_alive(pid, info.get("create_time")):
        return info
    if clear_stale:
        clear_detached(None)
    return None


def clear_detached(pid: int | None) -> None:
    """Remove server.json (only when it names `pid`, unless pid is None)."""
    path = paths.state_dir() / DETACHED_FILE
    if pid is not None:
        try:
            if int(json.loads(path.read_text()).get("pid", -1)) != pid:
                return
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _leader_alive(pid: int, create_time: object) -> bool:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if isinstance(create_time, (int, float)) and abs(proc.create_time() - create_time) > 1.0:
            return False  # the pid now names another process
        return True
    except psutil.Error:
        return False


def detached_port(info: dict) -> int | None:
    port = info.get("port")
    if isinstance(port, int):
        return port
    try:
        return urlsplit(str(info.get("url", ""))).port
    except ValueError:
        return None


def left_running_on(port: int) -> dict | None:
    """The record of our left-running server when it is the one on `port`."""
    info = read_detached()
    return info if info is not None and detached_port(info) == port else None


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


@dataclass(frozen=True)
class Exposure:
    """Who can reach a server that binds `host`.

    scope: "all" (an unspecified address: every interface), "interface" (a
    non-loopback address of this machine: whoever reaches that interface),
    "loopback" (this machine only), or "none" (the host resolves to nothing
    this machine has: the bind itself would fail)."""

    host: str
    scope: str
    addresses: tuple[str, ...] = ()
    interfaces: tuple[str, ...] = ()

    @property
    def exposed(self) -> bool:
        return self.scope in ("all", "interface")

    def describe(self) -> str:
        if self.scope == "all":
            return "listens on every interface"
        if self.scope == "interface":
            where = ", ".join(self.interfaces) or "a network interface"
            return f"listens on {where} ({', '.join(self.addresses)})"
        return "listens on this machine only" if self.scope == "loopback" else "binds nothing here"


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])  # fe80::1%eth0: drop the scope id
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return ip


def _local_interfaces() -> dict[ipaddress.IPv4Address | ipaddress.IPv6Address, str]:
    out: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, str] = {}
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                ip = _ip(a.address)
                if ip is not None:
                    out.setdefault(ip, name)
    return out


def bind_exposure(host: str | None) -> Exposure:
    """Decide exposure by what the address binds, not by how it is spelled:
    "0", "::0", "0:0:0:0:0:0:0:0" and "" all mean every interface; a name is
    resolved ("localhost" is loopback, a name of this machine's LAN address is
    not). When a name resolves to several addresses, the widest one counts."""
    text = (host or "").strip().strip("[]")
    if not text:
        return Exposure(host or "", "all")  # no host: vLLM binds every interface
    try:
        infos = socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
        ips = {ip for info in infos if (ip := _ip(str(info[4][0]))) is not None}
    except (OSError, UnicodeError):
        ips = set()
    if not ips:
        return Exposure(text, "none")
    shown = tuple(sorted(str(ip) for ip in ips))
    if any(ip.is_unspecified for ip in ips):
        return Exposure(text, "all", shown)
    exposed = [ip for ip in ips if not ip.is_loopback]
    if not exposed:
        return Exposure(text, "loopback", shown)
    local = _local_interfaces()
    names = tuple(sorted({local[ip] for ip in exposed if ip in local}))
    if not names:
        return Exposure(text, "none", shown)  # not an address of this machine
    return Exposure(text, "interface", tuple(sorted(str(ip) for ip in exposed if ip in local)), names)
