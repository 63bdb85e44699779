"""The pieces of a report's HTML page that every section uses: figures as
inline SVG, tables, numbers, and what a run ran on. Escaped text only; no
script, no reference outside the page."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from ernie_tui.engine_ctl.report import figures as F


def fmt(v: Any, digits: int = 1) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.{digits}f}"
    return str(v)


def pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f}%"


def svg_inline(fig: Any, salt: str) -> str:
    """The figure as SVG markup to put inside the page (no XML prolog or DOCTYPE)."""
    text = F.render(fig, "svg", salt=salt).decode("utf-8")
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def table(headers: list[str], rows: list[list[str]], classes: list[str] | None = None,
          cell_classes: list[list[str]] | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in headers) + "</tr>"]
    for i, r in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = []
        for j, c in enumerate(r):
            cc = cell_classes[i][j] if cell_classes and cell_classes[i][j] else ""
            cells.append(f'<td class="{cc}">{escape(c)}</td>' if cc else f"<td>{escape(c)}</td>")
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def engine_args_text(args: dict[str, Any]) -> str:
    """The preset's engine arguments as vLLM's command line spells them."""
    parts = []
    for k, v in args.items():
        flag = "--" + str(k).replace("_", "-")
        if v is True:
            parts.append(flag)
        elif v is False or v is None:
            parts.append(f"{flag}=false" if v is False else flag)
        elif isinstance(v, (dict, list)):
            parts.append(f"{flag} '{json.dumps(v, separators=(',', ':'))}'")
        else:
            parts.append(f"{flag} {v}")
    return " \\\n  ".join(parts)


def nested_text(v: Any, indent: str = "") -> str:
    """A dict or list as indented `key: value` lines (JSON's braces help nobody here)."""
    if isinstance(v, dict):
        lines = []
        for k, x in v.items():
            if isinstance(x, (dict, list)) and x:
                lines.append(f"{indent}{k}:\n{nested_text(x, indent + '  ')}")
            else:
                lines.append(f"{indent}{k}: {json.dumps(x, ensure_ascii=False) if not isinstance(x, str) else x}")
        return "\n".join(lines)
    if isinstance(v, list):
        return "\n".join(f"{indent}- {json.dumps(x, ensure_ascii=False) if not isinstance(x, str) else x}"
                         for x in v)
    return f"{indent}{v}"


def info_html(info: dict[str, Any], engine_args: dict[str, Any]) -> str:
    """What a run ran on, as a table, and the preset's engine arguments."""
    rows = []
    for k, v in info.items():
        if isinstance(v, (dict, list)):
            cell = f"<pre>{escape(nested_text(v))}</pre>"
        else:
            cell = f"<code>{escape(fmt(v))}</code>"
        rows.append(f'<tr><th class="l">{escape(k)}</th><td class="l">{cell}</td></tr>')
    args = engine_args_text(engine_args) if engine_args else "(not recorded)"
    return ("<table>" + "".join(rows) + "</table>"
            f"<p><b>Engine arguments</b> (the preset's, as given to vLLM):</p><pre>{escape(args)}</pre>")
