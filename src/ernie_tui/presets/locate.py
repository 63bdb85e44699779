"""Where in a presets file a key is written: its line number.

tomllib gives values without positions and tomlkit keeps no line numbers, so
this scans the text once: table headers (`[presets.NAME]`, `[presets.NAME.env]`)
and `key = ...` lines, each key parsed by tomllib itself so that quoted and
dotted keys (`"weird.name"`, `presets.a.port = 1`) mean what TOML says they
mean. A key inside a multi-line string or array can fool the scan; then the
answer is the nearest line the scan can vouch for, or None.
"""

from __future__ import annotations

import re
import tomllib

# `[a.b]` but not `[[a.b]]`; the header ends at the last `]` before a comment.
_HEADER = re.compile(r"^\s*\[(?!\[)(.+?)\]\s*(#.*)?$")
# `key = value`, key being bare, quoted or dotted: everything up to the first `=`
# that is outside quotes.
_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""  # a bare, "basic" or 'literal' key
_KEY = re.compile(rf"^\s*({_PART}(?:\s*\.\s*{_PART})*)\s*=")


def _key_path(dotted: str) -> tuple[str, ...] | None:
    """'presets."a.b".env' -> ('presets', 'a.b', 'env'), as TOML reads it."""
    try:
        doc = tomllib.loads(f"{dotted} = 0")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    node = doc
    while isinstance(node, dict) and len(node) == 1:
        (key, node), = node.items()
        path.append(key)
    return tuple(path)


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Every table and key path in the file -> the 1-based line that first
    names it (a table's header line; a key's `key =` line)."""
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            table = _key_path(header.group(1).strip()) or ()
            _record(found, table, number)
            continue
        key = _KEY.match(line)
        if key:
            path = _key_path(key.group(1))
            if path:
                _record(found, table + path, number)
    return found


def _record(found: dict[tuple[str, ...], int], path: tuple[str, ...], number: int) -> None:
    # Every prefix too: `[presets.a.env]` is where preset 'a' starts when the
    # file has no `[presets.a]` header.
    for end in range(1, len(path) + 1):
        found.setdefault(path[:end], number)


def line_of(text: str, *path: str) -> int | None:
    """The line of `path` (e.g. 'presets', 'a', 'block_size'); failing that,
    of its nearest enclosing table or key that the file names."""
    lines = key_lines(text)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None


def preset_at(text: str, line: int) -> str | None:
    """The preset whose table holds `line` (for syntax errors): the last
    `[presets.NAME...]` header at or above it."""
    name = None
    for number, row in enumerate(text.splitlines(), start=1):
        if number > line:
            break
        header = _HEADER.match(row)
        if header or row.lstrip().startswith("["):  # a broken header belongs to no preset
            path = (_key_path(header.group(1).strip()) or ()) if header else ()
            name = path[1] if len(path) >= 2 and path[0] == "presets" else None
    return name
