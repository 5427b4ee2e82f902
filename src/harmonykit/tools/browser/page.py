"""A web page as gpt-oss's browser shows it: text with numbered links, wrapped lines, windows.

The text is what gpt-oss's reference browser (``SimpleBrowserTool``, PyPI ``gpt-oss``)
makes of the same HTML — links become ``【id†text】`` (``【id†text†domain】`` off the
page's domain), images ``[Image N: alt]``, sub/superscripts ``_{x}`` / ``^{x}``, the
tool's own brackets in page text ``〖〗``, then html2text — so the model reads pages as
it was trained to. shared/reference/gpt-oss-browser/ holds the goldens the tests compare.

>>> page = from_html("<title>T</title><p>Hi <a href='/x'>there</a></p>", "http://a.example/")
>>> page.title, page.text, page.links
('T', '\\nURL: http://a.example/\\nHi 【0†there】', {'0': 'http://a.example/x'})
"""

from __future__ import annotations

import html as _html
import re
import textwrap
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

_SUP = re.compile(r"<sup( [^>]*)?>([\w\-]+)</sup>")
_SUB = re.compile(r"<sub( [^>]*)?>([\w\-]+)</sub>")
_TAGS_BETWEEN_WORDS = re.compile(r"(?<=\w)((<[^>]*>)+)(?=\w)")  # a space keeps table cells apart
_ANCHOR_THEN_SPACE = re.compile(r"(【\@[^】]+】)(\s+)")
_BLANK_LINE = re.compile(r"^\s+$", flags=re.MULTILINE)
_EXTRA_NEWLINES = re.compile(r"\n(\s*\n)+")
_SMP = re.compile(r"[\U00010000-\U0001FFFF]")  # lxml's HTML parser cannot take these
_SPECIAL = {"【": "〖", "】": "〗", "◼": "◾", "\u200b": ""}
_SPECIAL_RE = re.compile("|".join(map(re.escape, _SPECIAL)))
_IMAGE_ONLY = re.compile(r"【\@([^】]+)】")


@dataclass
class Page:
    """One page of the browser: ``text`` (lines not wrapped yet), its ``links`` by id, and,
    on a search or find page, the line each result starts on (``snippets``)."""

    url: str
    title: str
    text: str
    links: dict[str, str] = field(default_factory=dict)
    snippets: dict[str, int] | None = None

    def lines(self) -> list[str]:
        return wrap_lines(self.text)


def domain_of(url: str) -> str:
    """The host[:port] of a URL (a bare domain is its own domain)."""
    return urlsplit(url if "http" in url else "http://" + url).netloc


def wrap_lines(text: str, width: int = 80) -> list[str]:
    """Lines of at most ``width`` characters, white space kept (empty lines stay)."""
    out: list[str] = []
    for line in text.split("\n"):
        out += textwrap.wrap(line, width=width, replace_whitespace=False, drop_whitespace=False) \
            if line else [""]
    return out


def from_html(html: str, url: str, title: str | None = None) -> Page:
    """A page from its HTML: the given ``title``, else the page's ``<title>``, else its domain."""
    import lxml.etree
    import lxml.html

    html = _SPECIAL_RE.sub(lambda m: _SPECIAL[m.group(0)], _SMP.sub("", html))
    try:
        root = lxml.html.fromstring(html) if html.strip() else lxml.html.fromstring("<html></html>")
    except (lxml.etree.ParserError, ValueError):
        root = lxml.html.fromstring("<html></html>")
    found = root.find(".//title")
    if title:
        shown = title
    elif found is not None:
        shown = found.text or ""
    else:
        shown = domain_of(url) if url else ""
    links = _number_links(root, url)
    _number_images(root)
    for node in root.findall(".//math"):
        _drop(node)
    text = _to_text(lxml.etree.tostring(root, encoding="UTF-8").decode())
    text = _ANCHOR_THEN_SPACE.sub(lambda m: m.group(2) + m.group(1), text)
    text = _EXTRA_NEWLINES.sub("\n\n", _BLANK_LINE.sub("", text))
    return Page(url=url, title=shown, text=f"\nURL: {url}\n" + text, links=links)


def search_page(query: str, results: list[tuple[str, str, str]]) -> Page:
    """The page of a search's (title, url, summary) rows, as the reference builds it from its
    backend's results (each escaped: a result's text is never markup)."""
    rows = "".join(f"<li><a href='{_html.escape(url, quote=True)}'>{_html.escape(title)}</a> "
                   f"{_html.escape(summary)}</li>" for title, url, summary in results)
    return from_html(f"\n<html><body>\n<h1>Search Results</h1>\n<ul>\n{rows}\n</ul>\n</body></html>\n",
                     "", query)


def _text_of(node: object) -> str:
    return re.sub(r"\s+", " ", " ".join(node.itertext()).replace("\n", " "))  # type: ignore[attr-defined]


def _replace(node: object, text: str) -> None:
    """Put ``text`` where ``node`` was, keeping the text around it."""
    previous = node.getprevious()  # type: ignore[attr-defined]
    parent = node.getparent()  # type: ignore[attr-defined]
    tail = node.tail or ""  # type: ignore[attr-defined]
    if previous is None:
        parent.text = (parent.text or "") + text + tail
    else:
        previous.tail = (previous.tail or "") + text + tail
    parent.remove(node)


def _drop(node: object) -> None:
    node.getparent().remove(node)  # type: ignore[attr-defined]


def _number_links(root: object, url: str) -> dict[str, str]:
    here = domain_of(url)
    links: dict[str, str] = {}
    ids: dict[str, str] = {}
    for a in root.findall(".//a[@href]"):  # type: ignore[attr-defined]
        href = a.attrib["href"]
        if href.startswith(("mailto:", "javascript:")):
            continue
        text = _text_of(a).replace("†", "‡")
        if not _IMAGE_ONLY.sub("", text):
            continue
        if href.startswith("#"):
            _replace(a, text)
            continue
        try:
            target = urljoin(url, href)
            domain = domain_of(target)
        except ValueError:
            domain = ""
        if not domain:
            continue
        target = target.replace("arxiv.org", "ar5iv.org")
        link_id = ids.get(target)
        if link_id is None:
            link_id = ids[target] = str(len(links))
            links[link_id] = target
        _replace(a, f"【{link_id}†{text}】" if domain == here else f"【{link_id}†{text}†{domain}】")
    return links


def _number_images(root: object) -> None:
    for n, img in enumerate(root.findall(".//img")):  # type: ignore[attr-defined]
        name = img.get("alt", img.get("title"))
        _replace(img, f"[Image {n}: {name}]" if name else f"[Image {n}]")


def _to_text(html: str) -> str:
    import html2text

    html = _TAGS_BETWEEN_WORDS.sub(r" \1", _SUB.sub(r"_{\2}", _SUP.sub(r"^{\2}", html)))
    h = html2text.HTML2Text()
    h.ignore_links = True
    h.ignore_images = True
    h.body_width = 0
    h.ignore_tables = True
    h.unicode_snob = True
    h.ignore_emphasis = True
    return str(h.handle(html)).strip()
