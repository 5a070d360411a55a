"""HTML to readable text, and paging."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from treegym.envs.web.pages import html_to_text, paginate, split_page_ref

PAGE = """<!DOCTYPE html><html><head><title>Hamlet - Wiki</title><style>p{color:red}</style>
<script>var tracking = "secret";</script></head><body>
<header><a href="/">Home</a> Log in</header>
<nav><ul><li><a href="/random">Random article</a></li></ul></nav>
<main><h1>Hamlet</h1><p>A tragedy by <a href="/wiki/William_Shakespeare#life">William Shakespeare</a>,
set in   Denmark.</p><ul><li>Act one</li><li>Act two</li></ul></main>
<aside>Donate now</aside><footer>Copyright notice</footer></body></html>"""


def test_boilerplate_scripts_and_styles_are_stripped():
    page = html_to_text(PAGE, "http://site/wiki/Hamlet")
    assert page.title == "Hamlet - Wiki"
    assert "A tragedy by William Shakespeare, set in Denmark." in page.text
    for junk in ("secret", "color:red", "Random article", "Log in", "Donate", "Copyright"):
        assert junk not in page.text


def test_links_are_absolute_deduplicated_and_only_from_content():
    page = html_to_text(PAGE, "http://site/wiki/Hamlet")
    assert [(link.text, link.url) for link in page.links] == [("William Shakespeare", "http://site/wiki/William_Shakespeare")]


def test_list_items_and_blocks_become_lines():
    assert "- Act one\n- Act two" in html_to_text(PAGE).text


def test_broken_markup_still_yields_text():
    assert "kept" in html_to_text("<div><p>kept<script>lost").text


def test_paginate_cuts_at_paragraphs_within_budget():
    text = "\n\n".join(f"Paragraph {i} " + "word " * 30 for i in range(10))
    pages = paginate(text, 400)
    assert all(len(p) <= 400 for p in pages) and len(pages) > 1
    assert all(p.startswith("Paragraph") for p in pages)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=1500), st.integers(min_value=20, max_value=500))
def test_paginate_keeps_every_character_in_order(text, budget):
    pages = paginate(text, budget)
    assert all(len(p) <= budget for p in pages)
    # Only white space at the cuts may go (a word longer than a page is cut inside).
    assert "".join("".join(pages).split()) == "".join(text.split())


def test_page_refs_name_a_part():
    assert split_page_ref("http://x/a#page=3") == ("http://x/a", 3)
    assert split_page_ref(" http://x/a ") == ("http://x/a", 1)
    assert split_page_ref("http://x/a#section") == ("http://x/a", 1)
