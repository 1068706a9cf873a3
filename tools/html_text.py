"""Readable text from an HTML page, for tools that hand web pages to a model.

Built on the standard library's ``html.parser`` so it copes with broken markup and needs
no extra dependency. It keeps what a reader sees (title, headings, paragraphs, list
items, link text) and drops what only a browser needs (scripts, styles, navigation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

# Content inside these elements never reaches the text.
# ``head`` is not listed: its end tag is optional, and the title is all it holds for us.
_SKIPPED = frozenset({"script", "style", "noscript", "nav", "template", "svg", "iframe", "object"})
# Elements that start a new paragraph (a blank line before and after).
_PARAGRAPHS = frozenset(
    {
        "p", "div", "section", "article", "main", "header", "footer", "aside", "blockquote",
        "table", "ul", "ol", "dl", "form", "fieldset", "figure", "figcaption", "details",
        "summary", "address", "hr", "body",
    }
)  # fmt: skip
# Elements that only start a new line.
_LINES = frozenset({"br", "li", "tr", "dt", "dd", "caption", "option"})
_HEADINGS = {f"h{level}": level for level in range(1, 7)}
_CELLS = frozenset({"td", "th"})
# Void elements never get an end tag, so they must not open a skipped region.
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "wbr"})

_SPACES = re.compile(r"\s+")
_PARAGRAPH_BREAK = "\x00"


@dataclass(frozen=True, slots=True)
class HtmlText:
    """The page title (may be empty) and its readable text."""

    title: str
    text: str


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title_parts: list[str] = []
        self.lines: list[str] = []
        self._line: list[str] = []
        self._skip_depth = 0
        self._in_title = False
        self._pre_depth = 0
        self._heading = 0

    # -- structure ----------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title" and not self._skip_depth:  # an <svg> has titles of its own
            self._in_title = True
            return
        if tag in _SKIPPED and tag not in _VOID:
            self._skip_depth += 1
            return
        if self._skip_depth:
            return
        self._break_for(tag)
        if tag in _HEADINGS:
            self._heading = _HEADINGS[tag]
        elif tag == "li":
            self._line.append("- ")
        elif tag == "pre":
            self._pre_depth += 1
        elif tag in _CELLS:
            self._line.append(" ")
        elif tag == "img":
            alt = dict(attrs).get("alt")
            if alt:
                self._line.append(f" {alt} ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # <br/> and friends: a start tag with no content and no end tag.
        if tag in _SKIPPED or self._skip_depth:
            return
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            return
        if tag in _SKIPPED and tag not in _VOID:
            self._skip_depth = max(self._skip_depth - 1, 0)
            return
        if self._skip_depth:
            return
        if tag in _HEADINGS:
            self._flush(prefix="#" * self._heading + " ")
            self._heading = 0
            self.lines.append(_PARAGRAPH_BREAK)
        elif tag == "pre":
            self._flush()
            self._pre_depth = max(self._pre_depth - 1, 0)
            self.lines.append(_PARAGRAPH_BREAK)
        else:
            self._break_for(tag)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title_parts.append(data)
        elif not self._skip_depth:
            self._line.append(data)

    # -- lines --------------------------------------------------------------------------

    def _break_for(self, tag: str) -> None:
        if tag in _PARAGRAPHS or tag in _HEADINGS or tag == "pre":
            self._flush()
            self.lines.append(_PARAGRAPH_BREAK)
        elif tag in _LINES:
            self._flush()

    def _flush(self, prefix: str = "") -> None:
        raw = "".join(self._line)
        self._line = []
        if self._pre_depth:
            # Preformatted text keeps its own line breaks and indentation.
            kept = raw.strip("\n")
            if kept.strip():
                self.lines.extend(kept.splitlines())
            return
        text = _SPACES.sub(" ", raw).strip()
        if text:
            self.lines.append(prefix + text)

    def finish(self) -> HtmlText:
        self.close()
        self._flush()
        title = _SPACES.sub(" ", "".join(self.title_parts)).strip()
        return HtmlText(title=title, text=_join(self.lines))


def _join(lines: list[str]) -> str:
    """Join lines, turning runs of paragraph breaks into exactly one blank line."""
    out: list[str] = []
    pending_break = False
    for line in lines:
        if line == _PARAGRAPH_BREAK:
            pending_break = bool(out)
            continue
        if pending_break:
            out.append("")
            pending_break = False
        out.append(line.rstrip())
    return "\n".join(out)


def html_to_text(html: str) -> HtmlText:
    """Convert an HTML document (or fragment) to its title and readable text."""
    parser = _TextExtractor()
    parser.feed(html)
    return parser.finish()
