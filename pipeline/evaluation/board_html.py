"""The two leaderboard pages, the monthly one (board_files.py) and the live one
(pipeline/live/board.py), rendered from Jinja2 templates shipped in templates/: board_base.html
holds what both share (head, CSP, style), board_table.html their tables, and each page extends
the base. Every value a template prints is escaped; the markup a page module hands in (a chart,
a number with its interval) is markupsafe.Markup, made from escaped parts only."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from pipeline.markdown import html_text


def _shown(value: object) -> Markup:
    """A value as the pages print it (Jinja's finalize: it runs on every value a template prints):
    pipeline.markdown.html_text, so hidden characters in a submitter's text are shown (Trojan
    Source) wherever it is printed, and escaped with the stdlib's entities (&quot;, &#x27;), as the
    pages always were; Markup is printed as it is."""
    return value if isinstance(value, Markup) else Markup(html_text(str(value)))


_TEMPLATES = Environment(
    loader=PackageLoader("pipeline.evaluation", "templates"),
    # Autoescape marks what a template makes itself (a macro's table, a block's title) as Markup,
    # which _shown prints as it is; every other value _shown escapes.
    autoescape=select_autoescape(("html",)),
    finalize=_shown,
    undefined=StrictUndefined,  # a misspelt name fails the page instead of printing nothing
    # A line holding only a tag leaves no line behind: the pages keep one element per line.
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


def render(template: str, **context: object) -> bytes:
    """The page ``template`` (a file in templates/) filled from ``context``, as UTF-8."""
    return _TEMPLATES.get_template(template).render(context).encode()
