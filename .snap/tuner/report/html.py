"""The report's HTML: one self-contained page (inline CSS, images as data: URIs, no script, no
link to anything outside the file), built from small escaped pieces.

Every function returns a string of HTML; every text that comes from data goes through `esc`.
"""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone

__all__ = ["esc", "figure", "markdown_table", "note", "num", "page", "pill", "section", "table"]

CSS = """
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
       margin: 0; background: #f4f5f7; color: #1d2330; font-size: 14px; line-height: 1.45; }
main { max-width: 1340px; margin: 0 auto; padding: 22px 28px 60px; }
h1 { font-size: 24px; margin: 6px 0 2px; }
h2 { font-size: 19px; margin: 34px 0 8px; padding-top: 8px; border-top: 2px solid #d5d9e0; }
h3 { font-size: 15px; margin: 20px 0 6px; }
p.sub { color: #5a6273; margin: 0 0 14px; }
.cards { display: grid; grid-template-columns: repeat(4, 1fr); gap: 12px; margin: 14px 0 4px; }
.card { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 10px 14px; }
.card b { display: block; font-size: 12px; color: #5a6273; font-weight: 600;
          text-transform: uppercase; letter-spacing: .04em; }
.card span { font-size: 15px; }
figure { margin: 10px 0 14px; background: #fff; border: 1px solid #dde1e7; border-radius: 8px;
         padding: 8px; }
figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { color: #5a6273; font-size: 12.5px; padding: 4px 6px 0; }
.note { background: #fff8e6; border: 1px solid #f0d890; border-radius: 6px; padding: 8px 12px;
        margin: 8px 0; }
.note b { color: #7a5a00; }
.tablewrap { overflow-x: auto; margin: 6px 0 12px; }
table { border-collapse: collapse; background: #fff; font-size: 12.5px; width: 100%; }
th, td { border: 1px solid #dde1e7; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eef0f4; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr:nth-child(even) td { background: #fafbfc; }
code { font-size: 11.5px; background: #f0f2f5; padding: 0 3px; border-radius: 3px; }
td code { white-space: nowrap; }
details { margin: 6px 0 12px; }
summary { cursor: pointer; font-weight: 600; margin: 4px 0; }
.pill { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px;
        font-weight: 600; white-space: nowrap; }
.good { background: #d7f2dd; color: #17612b; }
.bad { background: #fadcdc; color: #8a1c1c; }
.meh { background: #e8eaee; color: #465063; }
.warn { background: #fdecc8; color: #7a5200; }
footer { color: #7a8294; font-size: 12px; margin-top: 40px; }
"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def num(value, fmt: str = ".2f", empty: str = "–") -> str:
    """A number as text; None / NaN / not a number as `empty`."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return empty
    return empty if math.isnan(x) else format(x, fmt)


def pill(text: str, kind: str) -> str:
    """A coloured label: kind is good, bad, meh or warn."""
    return f'<span class="pill {kind}">{esc(text)}</span>'


def note(what: str, why: str) -> str:
    """'<what>: <why>' in a yellow box (a section whose data are missing)."""
    return f'<div class="note"><b>{esc(what)}:</b> {esc(why)}</div>'


def figure(png_b64: str, caption: str, alt: str) -> str:
    return (f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{png_b64}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def table(header: list[str], rows: list[list], numeric: set[int] | None = None,
          raw: set[int] | None = None) -> str:
    """A table; columns in `numeric` are right-aligned, cells of columns in `raw` are HTML
    already (pills, code), every other cell is escaped."""
    numeric, raw = numeric or set(), raw or set()
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if i in raw else esc(cell)
            cells.append(f'<td class="n">{text}</td>' if i in numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first pipe table of a markdown text: (header, rows); ([], []) when there is none."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    if len(lines) < 2:
        return [], []

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip("|").split("|")]

    return cells(lines[0]), [cells(line) for line in lines[2:]]


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, subtitle: str, cards: list[tuple[str, str]], sections: list[str]) -> str:
    """The whole document."""
    card_html = "".join(f'<div class="card"><b>{esc(k)}</b><span>{esc(v)}</span></div>'
                        for k, v in cards)
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{esc(title)}</h1><p class=\"sub\">{esc(subtitle)}</p>"
            f"<div class=\"cards\">{card_html}</div>{''.join(sections)}"
            f"<footer>written by tuner report, {made}; re-render with "
            f"<code>tuner report DIR</code></footer></main></body></html>\n")
