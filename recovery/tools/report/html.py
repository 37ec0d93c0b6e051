"""The report's page: one self-contained HTML file, every text escaped, no fetches.

:func:`page` lays out titled sections (the run report, :mod:`recovery.tools.report`, and
the drill's page, :mod:`recovery.tools.report.drill`, share it); :func:`table` and
:func:`esc` are how any text reaches the page. Contract: every string that comes from a
run directory (names, paths, journal fields, warning messages) goes through
:func:`html.escape` here, and charts arrive as SVG that matplotlib wrote (it escapes its
own text). The page forbids every fetch in its Content-Security-Policy, so a report
opened from a CI artifact or from disk loads nothing, whatever it contains.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# inline styles only: the policy allows nothing else (no scripts, fonts, images or fetches)
POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1d2330; background: #f5f6f8; }
header { background: #1d2330; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header p { margin: 2px 0; color: #c9cfdb; }
main { padding: 8px 28px 40px; max-width: 1400px; }
section { background: #fff; border: 1px solid #dde1e8; border-radius: 6px;
          margin: 16px 0; padding: 10px 18px 14px; }
h2 { font-size: 16px; margin: 6px 0 10px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0; }
th, td { border-bottom: 1px solid #e6e9ef; padding: 3px 10px 3px 0; text-align: left;
         vertical-align: top; }
th { color: #5b6475; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, monospace; }
.chart svg { max-width: 100%; height: auto; }
.ok { color: #1b7f3b; } .warn { color: #b26a00; } .bad { color: #c62828; font-weight: 600; }
.muted { color: #6b7385; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-weight: 600; }
.badge.ok { background: #e3f4e8; } .badge.warn { background: #fff1db; }
.badge.bad { background: #fde4e4; }
ul { margin: 4px 0; padding-left: 20px; }
"""


def esc(value: object) -> str:
    """Any value as escaped HTML text (``None``: an empty cell's dash)."""
    return "-" if value is None else html.escape(str(value), quote=True)


@dataclass(frozen=True)
class Cell:
    """A table cell: ``text`` is escaped; ``css`` is one of this module's classes."""

    text: object
    css: str = ""


@dataclass(frozen=True)
class Raw:
    """Markup this module's callers built from escaped parts (a list, a badge)."""

    markup: str


def _cell(value: object) -> str:
    if isinstance(value, Raw):
        return f"<td>{value.markup}</td>"
    if isinstance(value, Cell):
        return f'<td class="{esc(value.css)}">{esc(value.text)}</td>'
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td class="num">{esc(value)}</td>'
    return f"<td>{esc(value)}</td>"


def table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """An HTML table; every cell escaped (numbers right-aligned)."""
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def badge(text: str, css: str) -> Raw:
    """A coloured label: ``ok``, ``warn`` or ``bad``."""
    return Raw(f'<span class="badge {esc(css)}">{esc(text)}</span>')


def items(lines: Iterable[object]) -> str:
    """A bulleted list of escaped lines ("none" when empty)."""
    out = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f"<ul>{out}</ul>" if out else '<p class="muted">none</p>'


def para(text: object, css: str = "") -> str:
    """One escaped paragraph."""
    return f'<p class="{esc(css)}">{esc(text)}</p>' if css else f"<p>{esc(text)}</p>"


def chart(svg: str, caption: str = "") -> str:
    """An SVG matplotlib wrote, with an escaped caption; its XML prologue and its RDF
    metadata (which names the creator and the namespaces of Dublin Core) are dropped."""
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else ""
    meta, end = body.find("<metadata>"), body.find("</metadata>")
    if 0 <= meta < end:
        body = body[:meta] + body[end + len("</metadata>") :]
    cap = f'<p class="muted">{esc(caption)}</p>' if caption else ""
    return f'<div class="chart">{body}</div>{cap}'


def section(title: str, body: str, anchor: str) -> str:
    """A titled section; ``body`` is markup built by this module's functions."""
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, lines: Sequence[str], sections: Sequence[str]) -> str:
    """The whole document: a header (``title``, ``lines`` under it) and the sections."""
    sub = "".join(f"<p>{esc(line)}</p>" for line in lines)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(POLICY)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f"<body><header><h1>{esc(title)}</h1>{sub}</header>"
        f"<main>{''.join(sections)}</main></body></html>\n"
    )
