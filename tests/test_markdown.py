"""Text from hostile sources shown as Markdown in the Dagster UI (pipeline/markdown.py)."""

from __future__ import annotations

import json
import re
import unicodedata

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
    file, a link or an image, shown in the asset check's table as the plain text it is."""
    from assets.metadata import frame_table
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
    # A table cell, which the UI shows as plain text: the value as it was, no markup to escape.
    cells = [cell for record in frame_table(result.failures_frame()).records for cell in record.data.values()]
    assert hostile in cells and json.dumps([hostile]) in cells


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


@pytest.mark.parametrize(
    ("hostile", "shown"),
    [
        ("gpt\u202eevil", "gpt<U+202E>evil"),  # RIGHT-TO-LEFT OVERRIDE: displayed as "gptlive"
        ("a\u200bb", "a<U+200B>b"),  # ZERO WIDTH SPACE: displayed as "ab"
        ("\u2066x\u2069 \u200ey\u200f z\u061c", "<U+2066>x<U+2069> <U+200E>y<U+200F> z<U+061C>"),
        ("soft\u00adhy\u2060ph\ufeffen", "soft<U+00AD>hy<U+2060>ph<U+FEFF>en"),
        ("a\u200cb\u200dc \u3164", "a<U+200C>b<U+200D>c <U+3164>"),
        ("nul\x00esc\x1b[31m", "nul<U+0000>esc<U+001B>[31m"),
    ],
)
def test_bidi_controls_and_invisible_characters_are_shown_not_kept(hostile, shown):
    """A submitter's name with a bidi override or a zero-width character looked like another name
    (Trojan Source, CVE-2021-42574; Unicode TR36): each such character is shown as <U+XXXX>."""
    text = markdown_text(hostile)
    assert unescaped(text) == shown
    assert [c for c in text if unicodedata.category(c) in ("Cc", "Cf")] == []
    assert active_markdown(text) == []


@pytest.mark.parametrize(
    "name",
    [
        "模型-7b 中文",
        "نموذج عربي",
        "می\u200cخواهم",  # Persian: a zero-width non-joiner between joining letters
        "क्\u200dष",  # Devanagari: a joiner after a virama
        "Café Zürich Ñandú",
        "🤖 👩🏽\u200d💻 ❤️\u200d🔥 👨\u200d👩\u200d👧",  # emoji, with their zero-width joiner sequences
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # Scotland's tag flag
    ],
)
def test_names_in_other_scripts_and_emoji_are_shown_as_they_are(name):
    assert unescaped(markdown_text(name)) == name


def rendered(markdown: str) -> tuple[str, list[str]]:
    """What a CommonMark viewer shows of ``markdown``: its text (code spans' content included), and
    the constructs that change how it reads (emphasis, raw HTML, links, images)."""
    text, constructs = [], []
    for token in _COMMONMARK.parse(markdown):
        for t in token.children or []:
            if t.type in ("text", "code_inline"):
                text.append(t.content)
            elif t.type in ("softbreak", "hardbreak"):
                text.append(" ")
            elif t.type in ("em_open", "strong_open", *_ACTIVE_TOKENS):
                constructs.append(f"{t.type}: {t.content or t.markup}")
        if token.type == "paragraph_close":
            text.append("\n")
    return "".join(text), constructs


def test_every_description_of_the_code_location_renders_as_written():
    """The UI renders the descriptions of assets, checks, jobs, schedules and sensors as Markdown:
    a placeholder such as submissions/<name>/ must not vanish as an HTML tag, nor a pair of * or _
    turn the text between them italic (before: evaluation's `<agent>/<query_set>` were lost)."""
    from definitions import defs

    described = {
        **{
            f"asset {spec.key.to_user_string()}": spec.description
            for a in defs.assets
            for spec in getattr(a, "specs", [a])
        },
        **{f"check {spec.name}": spec.description for c in defs.asset_checks for spec in c.check_specs},
        **{f"job {job.name}": job.description for job in defs.jobs},
        **{f"schedule {s.name}": s.description for s in defs.schedules},
        **{f"sensor {s.name}": s.description for s in defs.sensors},
    }
    changed = {where: found for where, text in described.items() if text and (found := rendered(text)[1])}
    assert changed == {}


def test_a_hostile_gdelt_file_s_codes_reach_a_metadata_table_bounded():
    """A GDELT export may be hostile, and the parser holds no field to a length: actor country
    codes of 2,000 characters on 10,000 rows, and one of a million on two, reached the events asset's
    unmapped-codes table whole (21 MB in the Dagster event log, which the UI loads with the asset's
    page). frame_table keeps MAX_TABLE_ROWS rows and cuts each text to MAX_CELL_CHARS, saying how
    long it was; the count of rows is dagster/row_count's, the codes themselves the asset's file."""
    from assets.metadata import frame_table
    from pipeline.events.normalize import unmapped_codes

    codes = [f"{i:06d}" + "A" * 2000 for i in range(10_000)]
    rows = pl.DataFrame({"Actor1CountryCode": codes, "Actor2CountryCode": ["B" * 10**6] * 2 + [None] * 9_998})
    table = frame_table(unmapped_codes(rows))
    cells = [value for record in table.records for value in record.data.values() if isinstance(value, str)]
    assert len(table.records) == 500  # the most frequent codes first (unmapped_codes' order)
    assert max(map(len, cells)) <= 1000 + 40
    assert cells[0].startswith("B" * 100) and cells[0].endswith("… (1,000,000 characters)")
    assert sum(map(len, cells)) < 2**20
    # A short text is as it was.
    assert frame_table(pl.DataFrame({"code": ["XYZ"]})).records[0].data == {"code": "XYZ"}


def test_a_quarantine_reason_quoting_long_member_names_is_bounded_markdown():
    """A hostile GDELT zip of five members named with 60,000 characters each was refused with a
    reason that quotes the names (300,000 characters), which the gdelt_files check's description
    (Markdown in the UI) repeated for each quarantined file of the day. markdown_text cuts a text
    to MAX_MARKDOWN_CHARS, saying how long it was, and the cut stays inert."""
    import io
    import zipfile

    from pipeline.gdelt.archive import CorruptArchiveError, open_gdelt_zip

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(5):
            archive.writestr(f"{i}![p](http://evil.invalid/p.png)" + "N" * 60_000, b"x")
    with pytest.raises(CorruptArchiveError) as refused:
        open_gdelt_zip(buffer.getvalue())
    reason = str(refused.value)
    assert len(reason) > 300_000
    text = markdown_text(reason)
    assert len(text) < 2_200 and text.endswith(f"… ({len(reason):,} characters)")
    assert active_markdown(text) == [] and not ACTIVE_UNESCAPED.search(
        text.removesuffix(f"… ({len(reason):,} characters)")
    )
