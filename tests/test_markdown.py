"""Text from hostile sources shown as Markdown in the Dagster UI (pipeline/markdown.py)."""

from __future__ import annotations

import re

import polars as pl
import pytest

from pipeline.gdelt.ledger import to_markdown
from pipeline.markdown import markdown_text

ACTIVE_UNESCAPED = re.compile(r"(?<!\\)(?:\\\\)*[`*\[\]<>!|~&#]")


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
    assert "| EventCode | \\!\\[x\\](http://127.0.0.1:9/p.png) | 3 |" in table
