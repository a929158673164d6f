"""Text from hostile sources (GDELT files, news sites, submitters) shown in Dagster's Markdown
metadata and on the HTML leaderboards."""

from __future__ import annotations

import html
import re
import unicodedata

# Characters that change how the text around them looks without being seen themselves: bidi
# controls (U+202A-202E, U+2066-2069, U+200E/200F, U+061C) can show a name reversed or reordered
# ("Trojan Source", CVE-2021-42574; Unicode TR9's explicit formatting characters), zero-width and
# other format characters (Cf: U+200B-200D, U+2060, U+FEFF, U+00AD, tags) make two different names
# look alike (Unicode TR36, "Visual Security Issues"). Each is shown as <U+XXXX>, as are control
# characters, surrogates, line/paragraph separators and the invisible Hangul fillers and grapheme
# joiner (default-ignorable letters and marks, TR44); dropping them would hide the attempt.
_HIDDEN_CATEGORIES = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
_INVISIBLE_LETTERS = frozenset("\u034f\u115f\u1160\u3164\uffa0")
# Except where a script needs one, so ordinary names keep their look: a joiner after a virama
# (Indic half forms) or a non-joiner between letters of a joining script (Persian), as IDNA allows
# them (RFC 5892, A.1-A.2); a ZWJ inside an emoji sequence and the three RGI tag flags (UTS #51).
_RGI_TAG_FLAG = re.compile(
    "\U0001f3f4\U000e0067\U000e0062"
    "(?:\U000e0065\U000e006e\U000e0067|\U000e0073\U000e0063\U000e0074|\U000e0077\U000e006c\U000e0073)\U000e007f"
)
# Arabic, Syriac, N'Ko and their supplements; Mongolian; Arabic presentation forms.
_JOINING_SCRIPTS = ((0x0600, 0x08FF), (0x1800, 0x18AF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFC))


def _joining_letter(ch: str) -> bool:
    return unicodedata.category(ch) in ("Lo", "Mn") and any(lo <= ord(ch) <= hi for lo, hi in _JOINING_SCRIPTS)


def _joiner_needed(before: str, joiner: str, after: str) -> bool:
    if not before or not after:
        return False
    if unicodedata.combining(before) == 9:  # a virama
        return True
    if joiner == "\u200c":
        return _joining_letter(before) and _joining_letter(after)
    return (unicodedata.category(before) in ("So", "Sk") or before == "\ufe0f") and unicodedata.category(after) == "So"


def visible_text(text: str) -> str:
    """``text`` with each bidi control, invisible or control character shown as ``<U+XXXX>`` (tab,
    newline and carriage return kept); letters of every script, accents and emoji as they are."""
    flags = {i for m in _RGI_TAG_FLAG.finditer(text) for i in range(*m.span())} if "\U0001f3f4" in text else ()
    out = []
    for i, ch in enumerate(text):
        hidden = ch not in "\t\n\r" and (unicodedata.category(ch) in _HIDDEN_CATEGORIES or ch in _INVISIBLE_LETTERS)
        if (
            hidden
            and i not in flags
            and not (ch in "\u200c\u200d" and _joiner_needed(text[i - 1 : i], ch, text[i + 1 : i + 2]))
        ):
            ch = f"<U+{ord(ch):04X}>"
        out.append(ch)
    return "".join(out)


def html_text(text: str) -> str:
    """``text`` as HTML text: markup characters escaped, hidden characters shown (visible_text)."""
    return html.escape(visible_text(text))


# CommonMark lets a backslash escape any ASCII punctuation (spec 0.31, §2.4). These are the ones
# that open something: a link or image ("![", a request to any host from the viewer's browser),
# raw HTML or an autolink ("<"), an entity, code, emphasis, a heading or quote inside a list
# item, a table cell; escaped, a submitter's text stays text in the Dagster UI's Markdown metadata.
# "_" is left alone: it only emphasises between word boundaries (harmless if it does), and our own
# names (queries_sample, level2_f1) must read as they are.
_MARKDOWN_ACTIVE = re.compile(r"([\\`*\[\]<>!|~&#@])")
# GitHub-flavoured Markdown (remark-gfm in Dagster's UI) also links bare text: "www." + a domain,
# "scheme://..." and e-mail addresses. A backslash inside the mark ("www\.", "https\://", "a\@b")
# keeps each one text; checked with micromark-extension-gfm, the parser remark-gfm uses (no GFM
# renderer runs in our tests: markdown-it's linkify resolves escapes first and would differ).
_AUTOLINK_MARKS = re.compile(r"(?i)(?<=www)(\.)|(:)(?=//)")


# The longest text markdown_text keeps (a name is at most 200 characters, a refusal reason 300):
# a GDELT zip's member names run to 64 KiB each, quoted in a quarantine reason, and the Dagster
# event log keeps every byte of a description or Markdown value, which the UI loads with its page.
MAX_MARKDOWN_CHARS = 2000


def markdown_text(text: str) -> str:
    """``text`` as one line of inert Markdown: the active punctuation escaped, line breaks and
    runs of whitespace one space, hidden characters shown (visible_text), cut to
    MAX_MARKDOWN_CHARS (saying how long it was)."""
    shown = visible_text(" ".join(text.split()))
    if len(shown) > MAX_MARKDOWN_CHARS:
        shown = f"{shown[: MAX_MARKDOWN_CHARS - 1]}… ({len(shown):,} characters)"
    escaped = _MARKDOWN_ACTIVE.sub(r"\\\1", shown)
    return _AUTOLINK_MARKS.sub(lambda m: "\\" + (m.group(1) or m.group(2)), escaped)
