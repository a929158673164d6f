"""The API's data classes (MIRAI, arXiv:2407.01231, Appendix E, Table 11) and the date-gate error.

Frozen and validated on construction, so a malformed date, unknown ISO code or unknown CAMEO code
fails at the agent's call site with a message saying what is expected. Functions accept plain
strings wherever a class is expected: ``coerce_*`` turn them into the class.

Agents read these objects back as text, so each class has two renderings, one set of classes:

- ``NATIVE`` (the default): the observations of MIRAI's appendix F, ``repr`` and ``str`` alike:
  ``Event(date=Date("2023-11-02"), head_entity=ISOCode("AUS"), ...)``;
- ``MIRAI``: what MIRAI's code prints for the same value (the classes in ``APIs/api_implementation.py``
  of github.com/yecchen/MIRAI are dataclasses with their own ``__str__``): ``repr`` is the
  dataclass one, ``CAMEOCode(code='042')``, which lists and dicts show; ``str`` the short one,
  ``CAMEOCode('042')``, which ``print`` of the object itself shows.

The rendering is the context's (``rendering(MIRAI)``, ``set_rendering``; a sandbox child of a
mode-mirai Environment sets it for its process), or a subclass's own (``RENDERING``), as the
classes of pipeline/agent_api/mirai_api.py have.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from datetime import date as _date
from functools import cache
from typing import ClassVar

from pipeline.reference.tables import iso3_codes, level1_codes, level2_codes

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

NATIVE = "native"
MIRAI = "mirai"
RENDERINGS = (NATIVE, MIRAI)
_RENDERING: ContextVar[str] = ContextVar("agent_api_rendering", default=NATIVE)


def current_rendering() -> str:
    return _RENDERING.get()


def set_rendering(style: str) -> None:
    """Render every object without a rendering of its own as ``style`` in this context (a sandbox
    child sets it once for its process)."""
    if style not in RENDERINGS:
        raise ValueError(f"rendering must be one of {RENDERINGS}, got {style!r}")
    _RENDERING.set(style)


@contextmanager
def rendering(style: str) -> Iterator[None]:
    if style not in RENDERINGS:
        raise ValueError(f"rendering must be one of {RENDERINGS}, got {style!r}")
    token = _RENDERING.set(style)
    try:
        yield
    finally:
        _RENDERING.reset(token)


class DateGateError(ValueError):
    """A date or date range reaches past what the environment may see (its cutoff), or before the
    start of the database."""


@cache
def _known_codes() -> frozenset[str]:
    return level1_codes() | level2_codes()


def _show(value: object, style: str, short: bool) -> str:
    """A field's text inside its object's text. MIRAI's ``str`` puts a data class field's ``str``
    and a string between single quotes as it is; a ``repr`` (both renderings) puts each field's
    ``repr``, data classes in the object's rendering."""
    if isinstance(value, _Rendered):
        return value.render(style, short)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v, style, False) for v in value) + "]"
    return f"'{value}'" if short and isinstance(value, str) else repr(value)


class _Rendered:
    """The two renderings of a data class. ``RENDERING``: a subclass's own; None follows the
    context (``rendering``)."""

    RENDERING: ClassVar[str | None] = None
    # The field a one-field class shows bare (``Date("2024-01-05")``, MIRAI's ``Date('2024-01-05')``).
    _ONLY_FIELD: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        """Nothing to check here; a class with fields to check, or a subclass with checks of its own
        (mirai_api.py's), overrides it (a dataclass calls it only if the class has one)."""

    def render(self, style: str, short: bool) -> str:
        name = type(self).__name__
        if self._ONLY_FIELD and (style == NATIVE or short):
            quote = '"' if style == NATIVE else "'"
            return f"{name}({quote}{getattr(self, self._ONLY_FIELD)}{quote})"
        short = short and style == MIRAI  # native: str is repr
        shown = ", ".join(f"{f.name}={_show(getattr(self, f.name), style, short)}" for f in fields(self) if f.repr)
        return f"{name}({shown})"

    def __repr__(self) -> str:
        return self.render(self.RENDERING or _RENDERING.get(), short=False)

    def __str__(self) -> str:
        return self.render(self.RENDERING or _RENDERING.get(), short=True)


@dataclass(frozen=True, order=True, repr=False)
class Date(_Rendered):
    """A day, written 'YYYY-MM-DD'."""

    date: str
    _ONLY_FIELD: ClassVar[str] = "date"

    def __post_init__(self) -> None:
        if not isinstance(self.date, str) or not _DATE.match(self.date):
            raise ValueError(f"Date must be a 'YYYY-MM-DD' string, got {self.date!r}")
        try:
            _date.fromisoformat(self.date)
        except ValueError as exc:
            raise ValueError(f"Date {self.date!r} is not a calendar day") from exc

    def to_date(self) -> _date:
        return _date.fromisoformat(self.date)


@dataclass(frozen=True, repr=False)
class DateRange(_Rendered):
    """Days from start_date to end_date, both inclusive; None leaves that side open."""

    start_date: Date | None = None
    end_date: Date | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_date", None if self.start_date is None else coerce_date(self.start_date))
        object.__setattr__(self, "end_date", None if self.end_date is None else coerce_date(self.end_date))
        if self.start_date and self.end_date and self.start_date > self.end_date:
            raise ValueError(f"DateRange start {self.start_date.date} is after its end {self.end_date.date}")


@dataclass(frozen=True, order=True, repr=False)
class ISOCode(_Rendered):
    """An ISO 3166-1 alpha-3 country code (plus XKX for Kosovo), e.g. 'AUS'."""

    code: str
    _ONLY_FIELD: ClassVar[str] = "code"

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or self.code.upper() not in iso3_codes():
            raise ValueError(
                f"ISOCode {self.code!r} is not a known ISO 3166-1 alpha-3 code; "
                "map_country_name_to_iso(name) finds the code of a country name"
            )
        object.__setattr__(self, "code", self.code.upper())


@dataclass(frozen=True, repr=False)
class Country(_Rendered):
    iso_code: ISOCode
    name: str


@dataclass(frozen=True, order=True, repr=False)
class CAMEOCode(_Rendered):
    """A CAMEO relation code: two digits for a first-level relation ('04'), three for a
    second-level one ('042')."""

    code: str
    _ONLY_FIELD: ClassVar[str] = "code"

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or self.code not in _known_codes():
            raise ValueError(
                f"CAMEOCode {self.code!r} is not a known 2- or 3-digit CAMEO code; "
                "map_relation_description_to_cameo(text) finds codes for a description"
            )

    @property
    def is_first_level(self) -> bool:
        return len(self.code) == 2


@dataclass(frozen=True, repr=False)
class Relation(_Rendered):
    cameo_code: CAMEOCode
    name: str
    description: str


@dataclass(frozen=True, repr=False)
class Event(_Rendered):
    """One (date, subject country, relation, object country) quad."""

    date: Date
    head_entity: ISOCode
    relation: CAMEOCode
    tail_entity: ISOCode


@dataclass(frozen=True, repr=False)
class NewsArticle(_Rendered):
    date: Date
    title: str
    content: str
    events: list[Event] = field(default_factory=list)

    def render(self, style: str, short: bool) -> str:
        # MIRAI's str of an article is its date, title and text, one per line.
        if style == MIRAI and short:
            return f"{self.date.render(style, True)}:\n{self.title}\n{self.content}"
        return super().render(style, short)


def date_header(day: str, style: str) -> str:
    """The first line of browse_news_article's text: the day (native), or MIRAI's ``str`` of its
    Date (``Date('2024-01-05')``, as MIRAI's ``browse_news_article`` prints it), then a colon."""
    return f"{day}:" if style == NATIVE else f"Date('{day}'):"


def coerce_date(value: Date | str | _date) -> Date:
    if isinstance(value, Date):
        return value
    if isinstance(value, _date):
        return Date(value.isoformat())
    return Date(value)


def coerce_date_range(value: DateRange | None) -> DateRange | None:
    if value is None or isinstance(value, DateRange):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return DateRange(*value)
    raise ValueError(f"date_range must be a DateRange(start_date, end_date), got {value!r}")


def coerce_iso(value: ISOCode | str) -> ISOCode:
    return value if isinstance(value, ISOCode) else ISOCode(value)


def coerce_cameo(value: CAMEOCode | str) -> CAMEOCode:
    return value if isinstance(value, CAMEOCode) else CAMEOCode(value)


def coerce_list(values, coerce) -> list | None:
    """None stays None (no filter); a single value becomes a one-element list."""
    if values is None:
        return None
    if isinstance(values, (str, ISOCode, CAMEOCode)):
        values = [values]
    return [coerce(v) for v in values]
