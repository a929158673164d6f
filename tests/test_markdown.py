"""Text from hostile sources shown as Markdown in the Dagster UI (pipeline/markdown.py)."""

from __future__ import annotations

import re

import polars as pl
import pytest
from markdown_it import MarkdownIt

from pipeline.gdelt.ledger import to_markdown
from pipeline.markdown import markdown_text

ACTIVE_UNESCAPED = re.compile(r"(?<!\\)(?:\\\\)*[`*\[\]<>!|~&#]")
# CommonMark with raw HTML on: the strictest reading a Markdown viewer may give the text.
_COMMONMARK = MarkdownIt("commonmark", {"html": True}).enable("table")
_ACTIVE_TOKENS = {"image", "link_open", "html_inline", "html_block"}


def unescaped(markdown: str) -> str:
    """Markdown that went through markdown_text with its backslash escapes removed: the text as
    the Dagster UI shows it."""
    return re.sub(r"\\(.)", r"\1", markdown)


def active_markdown(text: str) -> list[str]:
    """What in ``text`` a CommonMark renderer would turn into an image, a link or raw HTML: the
    constructs that make a viewer's browser fetch or run something. Our own images (``data:``
    URLs of the dataset card's figures) are not counted."""
    found = []
    for token in _COMMONMARK.parse(text):
        for t in [token, *(token.children or [])]:
            if t.type in _ACTIVE_TOKENS and not str(t.attrGet("src") or "").startswith("data:image/png;base64,"):
                found.append(f"{t.type}: {t.content or t.attrs}")
    return found


@pytest.mark.parametrize(
    "hostile",
    [
        "![pixel](http://127.0.0.1:9/p.png)",
        "[click](javascript:alert(1))",
        "<img src=x onerror=alert(1)>",
        "<https://example.org>",
        "**bold** `code` ~~gone~~ &lt;",
        "# heading\n> quote | cell",
        "\\![escaped escape](http://127.0.0.1:9/)",
    ],
)
def test_submitter_text_is_inert_markdown_in_dagster_metadata(hostile):
    """Names, models and refusal reasons reach the Dagster UI as Markdown: every character that
    opens a construct is escaped (a backslash escape itself included), on one line."""
    text = markdown_text(hostile)
    assert "\n" not in text
    assert not ACTIVE_UNESCAPED.search(text)
    assert re.sub(r"\\(.)", r"\1", text) == " ".join(hostile.split())


def test_a_hostile_gdelt_code_is_inert_in_the_ledger_and_unmapped_code_tables():
    """Unmapped codes and ledger reasons come from GDELT files, which may be hostile."""
    codes = pl.DataFrame({"field": ["EventCode"], "code": ["![x](http://127.0.0.1:9/p.png)"], "rows": [3]})
    table = to_markdown(codes)
    assert "| EventCode | \\!\\[x\\](http\\://127.0.0.1:9/p.png) | 3 |" in table


@pytest.mark.parametrize(
    "hostile",
    [
        "![pixel](http://127.0.0.1:9/p.png)",
        "<img src=x onerror=alert(1)>",
        "[a](http://127.0.0.1:9/)",
        "<http://127.0.0.1:9/>",
    ],
)
def test_the_commonmark_check_sees_what_markdown_text_neutralises(hostile):
    """active_markdown (which the metadata walks use) finds each construct raw, and none escaped."""
    assert active_markdown(hostile) and active_markdown(f"| {hostile} |\n|---|")
    assert active_markdown(markdown_text(hostile)) == []


def test_values_a_gdelt_file_put_in_a_failed_expectation_are_inert():
    """A great-expectations failure quotes unexpected values from the data: from a hostile GDELT
    file, a link or an image in the asset check's Markdown table."""
    from quality.suites import SuiteResult

    hostile = "![pixel](http://127.0.0.1:9/p.png) <img src=x>"
    result = SuiteResult(
        "events",
        False,
        {},
        failures=[
            {"expectation": "in_set", "column": "EventCode", "unexpected_values": [hostile], "unexpected_count": 1},
            {"expectation": "regex", "column": "SOURCEURL", "exception": hostile},
        ],
    )
    table = result.failures_markdown()
    assert "127.0.0.1:9" in table and active_markdown(table) == []


@pytest.mark.parametrize(
    ("hostile", "inert"),
    [
        ("see www.evil.example now", "see www\\.evil.example now"),
        ("_WWW.evil.example", "_WWW\\.evil.example"),
        ("https://evil.example/p", "https\\://evil.example/p"),
        ("ftp://evil.example", "ftp\\://evil.example"),
        ("me@evil.example", "me\\@evil.example"),
    ],
)
def test_gfm_bare_links_are_broken_by_an_escape(hostile, inert):
    """Dagster's UI renders Markdown with remark-gfm, which also links bare www., scheme:// and
    e-mail text (found by a re-attack of issue 30: a model named https://… was a clickable link).
    Each rendered as plain text by micromark-extension-gfm, remark-gfm's parser, when escaped so
    (checked by hand with Node: no GFM renderer runs in this suite); CommonMark shows the same
    characters."""
    assert markdown_text(hostile) == inert
    assert unescaped(inert) == hostile
