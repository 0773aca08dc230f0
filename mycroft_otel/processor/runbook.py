"""docs/runbook.md as the plain HTML page the processor serves at /runbook (metrics.py), for the page's link.

Only what the runbook's markdown uses: headings, paragraphs, tables, lists, fenced code, `code` and
**bold**; anything else shows as its text. Every heading carries the id GitHub gives it, so the page's
``runbook_url`` (``…#<category>``) lands on the category's section here as it does on GitHub. All text is
escaped: the page shows the file, it never runs it.
"""

from __future__ import annotations

import html
import re

_HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*")
_TABLE_RULE = re.compile(r"\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*")  # the |---|---| line under a table's header
_STYLE = ("body{font:15px/1.5 sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
          "code,pre{background:#f4f4f4}")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _inline(text: str) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()]))
        out.append(f"<code>{html.escape(m[1])}</code>" if m[1] is not None else f"<strong>{_inline(m[2])}</strong>")
        pos = m.end()
    return "".join(out) + html.escape(text[pos:])


def _row(line: str, cell: str) -> str:
    cells = line.strip().strip("|").split("|")
    return "<tr>" + "".join(f"<{cell}>{_inline(c.strip())}</{cell}>" for c in cells) + "</tr>"


def _heading(level: int, words: str, seen: dict[str, int]) -> str:
    """A heading with its anchor; ``seen``: how often each anchor came before (a repeated heading gets -1,
    -2, ... as on GitHub)."""
    anchor = slug(_INLINE.sub(lambda m: m[1] or m[2], words))
    n = seen.get(anchor, 0)
    seen[anchor] = n + 1
    anchor = f"{anchor}-{n}" if n else anchor
    return f'<h{level} id="{html.escape(anchor)}">{_inline(words)}</h{level}>'


def render(markdown: str, title: str = "Runbook") -> str:
    """The whole HTML page of ``markdown``."""
    out: list[str] = []
    block: list[str] = []   # the lines of the paragraph, table, list or code being read
    kind = ""               # "p", "table", "ul", "pre"
    seen: dict[str, int] = {}

    def close() -> None:
        nonlocal kind
        if kind == "p":
            out.append(f"<p>{_inline(' '.join(block))}</p>")
        elif kind == "table":
            rows = [r for r in block if not _TABLE_RULE.fullmatch(r.strip())]
            out.append("<table>" + _row(rows[0], "th") + "".join(_row(r, "td") for r in rows[1:]) + "</table>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in block) + "</ul>")
        elif kind == "pre":
            out.append(f"<pre>{html.escape(chr(10).join(block))}</pre>")
        block.clear()
        kind = ""

    def start(new: str) -> None:
        nonlocal kind
        if kind != new:
            close()
            kind = new

    for line in markdown.splitlines():
        text = line.strip()
        if kind == "pre":
            if text.startswith("```"):
                close()
            else:
                block.append(line)
            continue
        heading = _HEADING.fullmatch(text)
        if heading or not text or text.startswith("```"):
            close()
            if text.startswith("```"):
                kind = "pre"
            elif heading:
                out.append(_heading(len(heading[1]), heading[2], seen))
            continue
        if text.startswith("|"):
            start("table")
            block.append(text)
        elif text.startswith(("- ", "* ")):
            start("ul")
            block.append(text[2:])
        elif kind == "ul":
            block[-1] += " " + text  # the item goes on
        else:
            start("p")
            block.append(text)
    close()
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style></head>\n<body>\n" + "\n".join(out) + "\n</body></html>\n")
