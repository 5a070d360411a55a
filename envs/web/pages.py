"""HTML to readable text, and paging of long text, for the ``browse`` tool.

Pure functions: ``html_to_text`` keeps a page's title, its readable body and its links,
dropping scripts, styles and the boilerplate around content (nav, header, footer, aside,
forms); ``paginate`` cuts text into pages of at most ``budget`` characters, at paragraph or
sentence boundaries where it can, so that an agent reads a page part by part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin

# Content inside these tags is dropped whole: code, and the chrome around the article.
SKIP_TAGS = frozenset({"script", "style", "noscript", "template", "svg", "iframe", "canvas", "nav", "header",
                       "footer", "aside", "form", "button", "select", "menu", "head"})
# Blocks are paragraphs (a blank line around them); line tags only start a new line.
BLOCK_TAGS = frozenset({"p", "div", "section", "article", "main", "ul", "ol", "table", "h1", "h2", "h3", "h4", "h5",
                        "h6", "blockquote", "pre", "dl", "figure", "figcaption", "hr"})
LINE_TAGS = frozenset({"br", "li", "tr", "dt", "dd"})
_SPACE = re.compile(r"\s+")
VOID_TAGS = frozenset({"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source", "wbr"})


@dataclass(frozen=True)
class Link:
    text: str
    url: str


@dataclass(frozen=True)
class PageText:
    """A page reduced to what an agent reads."""

    title: str
    text: str
    links: tuple[Link, ...] = ()


class _Reader(HTMLParser):
    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.skip_depth = 0
        self.skip_stack: list[str] = []
        self.parts: list[str] = []
        self.title: list[str] = []
        self.in_title = False
        self.links: list[Link] = []
        self.href: str | None = None
        self.anchor: list[str] = []
        self.in_pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
            return
        if tag in SKIP_TAGS and tag not in VOID_TAGS:
            self.skip_stack.append(tag)
            return
        if self.skip_stack:
            return
        if tag in BLOCK_TAGS:
            self.parts.append("\n\n")
        elif tag in LINE_TAGS:
            self.parts.append("\n- " if tag == "li" else "\n")
        elif tag in ("td", "th"):
            self.parts.append(" ")
        if tag == "pre":
            self.in_pre += 1
        if tag == "a":
            href = dict(attrs).get("href")
            if href and not href.startswith(("javascript:", "mailto:", "#")):
                self.href = urldefrag(urljoin(self.base_url, href))[0]
                self.anchor = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
            return
        if self.skip_stack:
            if tag == self.skip_stack[-1]:
                self.skip_stack.pop()
            elif tag in self.skip_stack:  # sloppy HTML: close up to the matching tag
                del self.skip_stack[self.skip_stack.index(tag):]
            return
        if tag in BLOCK_TAGS:
            self.parts.append("\n\n")
        if tag == "pre" and self.in_pre:
            self.in_pre -= 1
        if tag == "a" and self.href is not None:
            text = " ".join("".join(self.anchor).split())
            if text:
                self.links.append(Link(text, self.href))
            self.href = None

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
            return
        if self.skip_stack:
            return
        if not self.in_pre:
            data = _SPACE.sub(" ", data)  # a line break in HTML source is just a space
        self.parts.append(data)
        if self.href is not None:
            self.anchor.append(data)


def html_to_text(html: str, base_url: str = "") -> PageText:
    """Readable text of an HTML page: title, body paragraphs, and its links (absolute URLs)."""
    reader = _Reader(base_url)
    try:
        reader.feed(html)
        reader.close()
    except (AssertionError, ValueError):  # html.parser gives up on some broken markup; keep what it read
        pass
    raw = "".join(reader.parts)
    lines = [line.strip(" \t\r\f\v") for line in raw.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(line if line.strip() else "" for line in lines)).strip()
    seen: set[str] = set()
    links = []
    for link in reader.links:
        if link.url not in seen:
            seen.add(link.url)
            links.append(link)
    return PageText(" ".join("".join(reader.title).split()), text, tuple(links))


def plain_text(text: str) -> PageText:
    """A text/plain body as a page: white space folded per paragraph."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return PageText("", "\n\n".join(p for p in paragraphs if p))


def _cut(text: str, budget: int) -> int:
    """Where to end a page of at most ``budget`` chars: a paragraph, line, sentence or word end."""
    if len(text) <= budget:
        return len(text)
    window = text[:budget]
    for sep in ("\n\n", "\n", ". ", " "):
        at = window.rfind(sep)
        if at >= budget // 2:
            return at + len(sep)
    return budget


def paginate(text: str, budget: int) -> tuple[str, ...]:
    """Split ``text`` into pages of at most ``budget`` characters (at least one page)."""
    if budget <= 0:
        raise ValueError("page budget must be positive")
    pages = []
    rest = text
    while rest:
        end = _cut(rest, budget)
        pages.append(rest[:end].strip())
        rest = rest[end:].lstrip()
    return tuple(p for p in pages if p) or ("",)


_PAGE_FRAGMENT = re.compile(r"#(?:page=|p)(\d+)$")


def split_page_ref(ref: str) -> tuple[str, int]:
    """``"https://x/y#page=2"`` -> (``"https://x/y"``, 2); no fragment means page 1."""
    ref = ref.strip()
    m = _PAGE_FRAGMENT.search(ref)
    if m:
        digits = m.group(1).lstrip("0") or "0"
        # A page number past any page (even past Python's int-digit limit) is "no such part".
        page = int(digits) if len(digits) <= 12 else 10**12
        return ref[: m.start()], max(1, page)
    return urldefrag(ref)[0], 1
