"""A server URL given on the command line, checked before anything starts.

Every option that names a server (probe --url, --attach, a fleet file's
url) goes through here, so a slip (`htp:/x`, `notaurl`) is refused in one
line with status 1 instead of surfacing later as a connection error to a
host the client made up, or a dashboard showing UNREACHABLE.
"""

from __future__ import annotations

from ernie_tui.cli.errors import CliError
from ernie_tui.engine_ctl.load import check_server_url


def server_url(url: str, option: str) -> str:
    """`url` stripped, or CliError naming the option and the form expected."""
    try:
        return check_server_url(url, option)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
