"""The API's data classes (MIRAI, arXiv:2407.01231, Appendix E, Table 11) and the date-gate error.

Frozen and validated on construction, so a malformed date, unknown ISO code or unknown CAMEO code
fails at the agent's call site with a message saying what is expected. Their reprs follow the
observations in MIRAI's appendix F (``Event(date=Date("2023-11-02"), head_entity=ISOCode("AUS"),
...)``), because agents read them back as text. Functions accept plain strings wherever a class is
expected: ``coerce_*`` turn them into the class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date as _date
from functools import cache

from pipeline.reference.tables import iso3_codes, level1_codes, level2_codes

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class DateGateError(ValueError):
    """A date or date range reaches past what the environment may see (its cutoff), or before the
    start of the database."""


@cache
def _known_codes() -> frozenset[str]:
    return level1_codes() | level2_codes()


@dataclass(frozen=True, order=True)
class Date:
    """A day, written 'YYYY-MM-DD'."""

    date: str

    def __post_init__(self) -> None:
        if not isinstance(self.date, str) or not _DATE.match(self.date):
            raise ValueError(f"Date must be a 'YYYY-MM-DD' string, got {self.date!r}")
        try:
            _date.fromisoformat(self.date)
        except ValueError as exc:
            raise ValueError(f"Date {self.date!r} is not a calendar day") from exc

    def to_date(self) -> _date:
        return _date.fromisoformat(self.date)

    def __repr__(self) -> str:
        return f'Date("{self.date}")'


@dataclass(frozen=True)
class DateRange:
    """Days from start_date to end_date, both inclusive; None leaves that side open."""

    start_date: Date | None = None
    end_date: Date | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_date", None if self.start_date is None else coerce_date(self.start_date))
        object.__setattr__(self, "end_date", None if self.end_date is None else coerce_date(self.end_date))
        if self.start_date and self.end_date and self.start_date > self.end_date:
            raise ValueError(f"DateRange start {self.start_date.date} is after its end {self.end_date.date}")

    def __repr__(self) -> str:
        return f"DateRange(start_date={self.start_date!r}, end_date={self.end_date!r})"


@dataclass(frozen=True, order=True)
class ISOCode:
    """An ISO 3166-1 alpha-3 country code (plus XKX for Kosovo), e.g. 'AUS'."""

    code: str

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or self.code.upper() not in iso3_codes():
            raise ValueError(
                f"ISOCode {self.code!r} is not a known ISO 3166-1 alpha-3 code; "
                "map_country_name_to_iso(name) finds the code of a country name"
            )
        object.__setattr__(self, "code", self.code.upper())

    def __repr__(self) -> str:
        return f'ISOCode("{self.code}")'


@dataclass(frozen=True)
class Country:
    iso_code: ISOCode
    name: str


@dataclass(frozen=True, order=True)
class CAMEOCode:
    """A CAMEO relation code: two digits for a first-level relation ('04'), three for a
    second-level one ('042')."""

    code: str

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or self.code not in _known_codes():
            raise ValueError(
                f"CAMEOCode {self.code!r} is not a known 2- or 3-digit CAMEO code; "
                "map_relation_description_to_cameo(text) finds codes for a description"
            )

    @property
    def is_first_level(self) -> bool:
        return len(self.code) == 2

    def __repr__(self) -> str:
        return f'CAMEOCode("{self.code}")'


@dataclass(frozen=True)
class Relation:
    cameo_code: CAMEOCode
    name: str
    description: str


@dataclass(frozen=True)
class Event:
    """One (date, subject country, relation, object country) quad."""

    date: Date
    head_entity: ISOCode
    relation: CAMEOCode
    tail_entity: ISOCode


@dataclass(frozen=True)
class NewsArticle:
    date: Date
    title: str
    content: str
    events: list[Event] = field(default_factory=list)


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
