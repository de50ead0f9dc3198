"""The HTML around the plots comes from Jinja2 macros (``render/html/assets/chrome.html``) with
autoescape on: text from a file is cleaned and escaped, markup from another macro is kept."""

from __future__ import annotations

import re

from snapviz.render.html.page import card, chrome, html_table, warnings_html

HOSTILE = "<script>alert(1)</script> \"q\" 'a' & \x1b[31m\u202e\ud800"


def _text_only(html: str) -> bool:
    return "<script>" not in html and "\x1b" not in html and "\u202e" not in html and "\ud800" not in html


def test_every_value_is_cleaned_then_escaped() -> None:
    for html in (
        chrome("note", text=HOSTILE, ident=HOSTILE),
        chrome("hero", kicker=HOSTILE, title=HOSTILE, verdict=HOSTILE, lines=[HOSTILE]),
        html_table([HOSTILE], [[HOSTILE]], HOSTILE),
        warnings_html([HOSTILE]),
        chrome("rank_details", cells=[HOSTILE], meta=[(HOSTILE, HOSTILE)], notes=[HOSTILE], body=HOSTILE),
    ):
        assert _text_only(html), html
        assert "&lt;script&gt;" in html and "\\x1b" in html and "&amp;" in html
        assert '"q"' not in html  # quotes escaped, so a value cannot leave its attribute


def test_markup_from_a_macro_nests_unescaped() -> None:
    table = html_table(["a"], [["1"]], "t")
    page = card("Title", table, hint="h", ident="c")
    assert str(table) in page
    assert re.fullmatch(
        r'<section class="sv-card" id="c"><h2>Title</h2><p class="sv-hint">h</p><table.*</table></section>', page
    )
    # a plain string is text, not markup (passed deliberately where Markup is typed)
    assert card("T", "<b>x</b>").count("&lt;b&gt;") == 1  # type: ignore[arg-type]


def test_numbers_in_the_compare_runs_table() -> None:
    class R:
        color, label, peak, delta, reserved, reserved_delta, stage, events = (
            "#123456",
            "a<b",
            "1",
            "2",
            "3",
            "4",
            "s",
            1234567,
        )

    html = chrome("compare_runs", runs=[R()])
    assert "<td>1,234,567</td>" in html and "a&lt;b" in html and "background:#123456" in html
