"""A malformed server URL is refused in one line, before anything starts
(issue #59, item 12): `probe --url htp:/bad-url` reached "Cannot connect to
host htp:80", and `--attach notaurl` opened a dashboard showing UNREACHABLE.
Every option that names a server is checked: probe --url, --attach (one or
several) and a fleet file's url."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ernie_tui.cli import main
from ernie_tui.cli.errors import CliError
from ernie_tui.cli.fleet import fleet_servers
from ernie_tui.engine_ctl.control import FleetError, load_fleet
from ernie_tui.engine_ctl.load import url_problem

GOOD = ["http://127.0.0.1:8000", "https://host.example/vllm/v1/", "127.0.0.1:8000", "localhost:8000/v1",
        "http://[::1]:8000", "[::1]:8000", "http://x:1", "  http://10.0.0.5:8000/  "]
BAD = {
    "htp:/bad-url": "neither http:// nor a :PORT",
    "notaurl": "neither http:// nor a :PORT",
    "ftp://h:21": "the scheme is 'ftp'",
    "htp://h:8000": "the scheme is 'htp'",
    "http://": "names no host",
    "http://:8000": "names no host",
    "http://h:99999": "port is not a number",
    "http://h:0": "port is not a number",
    "h:abc": "port is not a number",
    "http://a b:1": "holds a space",
    "": "is empty",
    "http://-bad-:1": "is not a host name",
    "http://h:1/?x=1": "query or fragment",
    "http://user:pw@h:1": "user name",
}


@pytest.mark.parametrize("url", GOOD)
def test_a_server_url_passes(url):
    assert url_problem(url) is None


@pytest.mark.parametrize("url,why", BAD.items(), ids=list(BAD))
def test_a_malformed_url_says_why(url, why):
    problem = url_problem(url)
    assert problem is not None and why in problem


@pytest.mark.parametrize("mode", [[], ["--burst", "3"], ["--capacity", "--slo", "ttft_p99=1s"]])
def test_probe_refuses_a_malformed_url_in_one_line(mode, capsys):
    # (nothing listens anywhere here: a check that came after the first
    # request would say "Cannot connect", not this)
    assert main(["probe", "--url", "htp:/bad-url", *mode, "--no-save"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == ("ernie-tui: error: --url 'htp:/bad-url' is not a server URL: it has neither "
                           "http:// nor a :PORT (give http://HOST:PORT, e.g. http://127.0.0.1:8000)")


def _cli(*argv: str) -> subprocess.CompletedProcess:
    # A subprocess: were the URL let through, a dashboard would open (and the
    # timeout end the test) instead of the one line.
    return subprocess.run([sys.executable, "-m", "ernie_tui", *argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)


@pytest.mark.parametrize("argv,bad", [
    (["--attach", "notaurl"], "notaurl"),
    (["--attach", "http://127.0.0.1:8000", "--attach", "ftp://x:1"], "ftp://x:1"),
])
def test_attach_refuses_a_malformed_url_before_the_dashboard_opens(argv, bad):
    done = _cli(*argv)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ernie-tui: error: --attach {bad!r} is not a server URL: ")


def test_a_fleet_file_url_is_checked(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text('[servers.a]\nurl = "http://10.0.0.1:8000"\n[servers.b]\nurl = "notaurl"\n')
    with pytest.raises(FleetError, match=r"fleet\.toml: servers\.b\.url 'notaurl' is not a server URL"):
        load_fleet(path)
    with pytest.raises(CliError, match="servers.b.url 'notaurl'"):
        fleet_servers(str(path), [])
    with pytest.raises(CliError, match="--attach 'htp:/x'"):
        fleet_servers(None, ["http://10.0.0.1:8000", "htp:/x"])
