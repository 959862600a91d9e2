"""A report's text as data: sections of paragraphs, tables and figures, written once and rendered
twice — as Markdown (summary.md) and as HTML in the viewer's style (index.html of a corpus report).

    sec = Section("units scaled_sum", units="scaled_sum")
    sec.text.append("Column sums scaled so the average key scores 1.")
    sec.tables.append(Table(["layer", "sink rate"], [["0", "0.42"]]))
    sec.figures.append("fig05_layer_head")
    markdown([sec]); html_sections([sec], pngs)

Inline `code` in text and cells is the only markup; everything else is escaped.
"""
from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    caption: str = ""                   # one line above the table
    numeric: bool = True                # right-align every column but the first


@dataclass
class Section:
    title: str
    level: int = 2                      # 2: a card on the page; 3: a block inside the card before it
    units: str | None = None            # the units view it belongs to (the page's units picker); None: always shown
    text: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    beside: int = 0                     # tables side by side on the page in this many columns (a run, its control)
    figures: list[str] = field(default_factory=list)     # figure names: name.png in the report folder
    html: str = ""                      # extra HTML for the page only (an interactive panel)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table_markdown(t: Table) -> str:
    lines = [t.caption, ""] if t.caption else []
    lines += ["| " + " | ".join(map(_md_cell, t.header)) + " |",
              "|" + "|".join("---" if k == 0 or not t.numeric else "---:" for k in range(len(t.header))) + "|"]
    lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in t.rows]
    return "\n".join(lines) + "\n"


def markdown(sections: list[Section]) -> str:
    out = []
    for s in sections:
        out += [f"{'#' * s.level} {s.title}", ""]
        for p in s.text:
            out += [p, ""]
        for t in s.tables:
            out += [table_markdown(t)]
        out += [f"Figure: `{name}.png`\n" for name in s.figures]
    return "\n".join(out)


def inline(text: str) -> str:
    """Escaped text with `code` spans as <code>."""
    parts = re.split(r"`([^`]*)`", str(text))
    return "".join(f"<code>{html.escape(p)}</code>" if k % 2 else html.escape(p) for k, p in enumerate(parts))


def table_html(t: Table) -> str:
    cls = "sl-table num" if t.numeric else "sl-table"
    head = "".join(f"<th>{inline(h)}</th>" for h in t.header)
    body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in t.rows) or \
        f"<tr><td colspan='{len(t.header)}'>(none)</td></tr>"
    cap = f"<p class='note'>{inline(t.caption)}</p>" if t.caption else ""
    return f"<div class='sl-table-box'>{cap}<table class='{cls}'><tr>{head}</tr>{body}</table></div>"


def figure_html(name: str, png: bytes) -> str:
    # alt='name' (single quotes) is what the tests and scripts look for
    return (f"<figure><img alt='{html.escape(name)}' loading='lazy' src='data:image/png;base64,"
            f"{base64.b64encode(png).decode('ascii')}'><figcaption>{html.escape(name)}.png</figcaption></figure>")


def html_sections(sections: list[Section], pngs: dict[str, bytes]) -> str:
    """Level-2 sections as cards (.sl-viewer), level-3 ones inside the card before them."""
    cards: list[list[str]] = []
    for s in sections:
        inner = [f"<h{s.level}>{inline(s.title)}</h{s.level}>"]
        inner += [f"<p class='sl-text'>{inline(p)}</p>" for p in s.text]
        inner.append(s.html)                # an interactive panel first, its tables under it
        tables = "".join(table_html(t) for t in s.tables)
        inner.append(f"<div class='sl-beside' style='--k:{s.beside}'>{tables}</div>" if s.beside > 1 else tables)
        figs = "".join(figure_html(n, pngs[n]) for n in s.figures if n in pngs)
        if figs:
            inner.append(f"<div class='sl-figs'>{figs}</div>")
        units = f" data-units='{html.escape(s.units)}'" if s.units else ""
        if s.level <= 2 or not cards:
            cards.append([f"<section class='sl-viewer sl-card'{units}>", *inner])
        else:
            cards[-1].append(f"<div class='sl-block'{units}>" + "".join(inner) + "</div>")
    return "\n".join("".join(c) + "</section>" for c in cards)
