"""The one check every output option makes before anything runs.

`--out`, `--csv` and `--report` (report, sweep, probe) name files to write;
a folder that is not there is refused at once, in plain words and before a
sweep's hours, as `cp` refuses it (paths.out_file says why). Nothing makes
folders for them.
"""

from __future__ import annotations

from ernie_tui import paths
from ernie_tui.cli.errors import CliError


def check_out_files(option: str, files: list[str] | None) -> None:
    """CliError naming `option` when one of `files` cannot be written where it is named."""
    for f in files or []:
        try:
            paths.out_file(f)
        except paths.OutPathError as exc:
            raise CliError(f"{option} {exc}") from None
