"""Text from hostile sources (GDELT files, submitters) shown in Dagster's Markdown metadata."""

from __future__ import annotations

import re

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


def markdown_text(text: str) -> str:
    """``text`` as one line of inert Markdown: the active punctuation escaped, line breaks and
    runs of whitespace one space."""
    escaped = _MARKDOWN_ACTIVE.sub(r"\\\1", " ".join(text.split()))
    return _AUTOLINK_MARKS.sub(lambda m: "\\" + (m.group(1) or m.group(2)), escaped)
