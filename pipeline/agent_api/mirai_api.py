"""MIRAI's module-level API over our date-gated database, so an agent written for MIRAI runs here
by changing one import: ``from APIs.api_implementation import ...`` becomes
``from pipeline.agent_api.mirai_api import ...`` (the names MIRAI's ``agents/react_agents.py`` and
``agents/direct_agents.py`` import from github.com/yecchen/MIRAI: the data classes, the 14
functions, ``set_default_end_date``, ``get_default_end_date`` and ``use_end_date``).

MIRAI's module holds the whole database and filters every call against a module-global end date.
Here the end date selects a gated ``Environment`` (pipeline/agent_api/environment.py): moving it
opens a new environment whose tables stop at that day, so no call can return a row after it,
whatever the arguments; it counts entities and orders ties as MIRAI's code does (the Environment's
"mirai" dialect). The data classes are the API's own (types.py) in MIRAI's rendering, which agents
read back as text: ``repr`` is the dataclass one (``Date(date='2024-02-01')``, inside lists and
dicts) and ``str`` the short one (``Date('2024-02-01')``, what ``print`` shows); here they also
check their arguments as MIRAI's do (a Date within the visible days, upper-case ISO codes, data
classes where MIRAI wants them).

The data: ``open_database(path)`` (a data dir or a downloaded release month, both holding
``database/``), else the first call opens ``MIRAI_DATA_DIR``. Differences from MIRAI and why:
docs/mirai.md, "MIRAI's API module".

This module executes nothing an agent writes. MIRAI's agents ``exec`` their code blocks in their
own process, which can read this module's database object and move the end date; that is not a
sandbox. Leaderboard runs use pipeline/evaluation, whose code blocks run in the locked-down child
process of docs/agent_api.md.
"""

from __future__ import annotations

import sys
import types
from datetime import date as _date
from datetime import timedelta
from pathlib import Path

from pipeline.agent_api import lookup
from pipeline.agent_api import types as gated
from pipeline.agent_api.environment import Environment
from pipeline.agent_api.event_database import EventDatabase
from pipeline.reference.tables import iso3_codes, level1_codes, level2_codes

__all__ = [
    "CAMEOCode",
    "Country",
    "Date",
    "DateRange",
    "Event",
    "ISOCode",
    "NewsArticle",
    "Relation",
    "browse_news_article",
    "close_database",
    "count_events",
    "count_news_articles",
    "get_child_relations",
    "get_default_end_date",
    "get_default_start_date",
    "get_entity_distribution",
    "get_events",
    "get_news_articles",
    "get_parent_relation",
    "get_relation_distribution",
    "get_sibling_relations",
    "map_cameo_to_relation",
    "map_country_name_to_iso",
    "map_iso_to_country_name",
    "map_relation_description_to_cameo",
    "open_database",
    "set_default_end_date",
    "use_end_date",
]


class _State:
    """The module's one database and the environment of the current end date."""

    database: EventDatabase | None = None
    end_date: str | None = None
    environment: Environment | None = None


_state = _State()


# --- the database and the end date ----------------------------------------------------------------


def open_database(path: Path | str) -> None:
    """Use the event database under ``path``: a data dir (``$MIRAI_DATA_DIR``) or a release month
    downloaded by ``mirai download`` (``mirai-releases/2024-02``); both hold ``database/``. The
    end date is kept and re-applied to the new database."""
    path = Path(path)
    if not (path / "database" / "events").is_dir():
        raise FileNotFoundError(
            f"no event database under {path} (expected {path / 'database' / 'events'}): give a data dir or a "
            "downloaded release month such as mirai-releases/2024-02"
        )
    database = EventDatabase(path)
    close_database()
    _state.database = database
    if _state.end_date is not None:
        _state.environment = _environment_for(_state.end_date)


def close_database() -> None:
    """Forget the database (and the environment of the current end date)."""
    _state.database = None
    _state.environment = None


def _database() -> EventDatabase:
    if _state.database is None:
        from pipeline.config import Settings

        open_database(Settings.from_env().dataset.data_dir)
    return _state.database


def _environment_for(end_date: str) -> Environment:
    # The environment of a query on the day after the end date, at distance 1, sees exactly the
    # days up to the end date (docs/agent_api.md, "The gate").
    # MIRAI's entity counting and its order of ties (docs/mirai.md, "The `mirai` mode").
    return _database().environment(
        _date.fromisoformat(end_date) + timedelta(days=1), distance_days=1, count_both_actors=True, dialect=gated.MIRAI
    )


def set_default_end_date(date: str | None) -> None:
    """The last day the API may show ('YYYY-MM-DD'), as in MIRAI: the day before the query. Every
    later call sees the database up to that day and nothing after it; None unsets it (the
    functions that read the database then refuse to run)."""
    if date is None:
        _state.environment = _state.end_date = None
        return
    if isinstance(date, Date):
        date = date.date
    day = _parse_day(date, "the end date")
    _state.environment = _environment_for(day)
    _state.end_date = day


def get_default_end_date() -> str | None:
    return _state.end_date


def get_default_start_date() -> str:
    """The database's first day (MIRAI's ``DEFAULT_START_DATE``): no date before it is accepted."""
    return _database().start.isoformat()


def use_end_date() -> None:
    """Print the end date, as MIRAI's function of that name does."""
    if _state.end_date is None:
        print("DEFAULT_END_DATE is not set.")
    else:
        print(f"The DEFAULT_END_DATE is set to {_state.end_date}.")


def _environment() -> Environment:
    if _state.environment is None:
        raise ValueError(
            "no end date is set: call set_default_end_date('YYYY-MM-DD') with the last day the agent may see "
            "(the day before the query) first"
        )
    return _state.environment


def _parse_day(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string in the format 'YYYY-MM-DD', got {value!r} ({type(value).__name__})")
    try:
        day = _date.fromisoformat(value)
    except ValueError:
        day = None
    if day is None or day.isoformat() != value:
        raise ValueError(f"{what} must be a day in the format 'YYYY-MM-DD', got {value!r}")
    return value


# --- the data classes: the API's own (types.py) in MIRAI's rendering, with MIRAI's checks ----------


def _require(value: object, kind: type, what: str) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{what} must be a {kind.__name__} object, got {type(value).__name__}")


class Date(gated.Date):
    """A day, 'YYYY-MM-DD', from the database's first day up to the end date."""

    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        _parse_day(self.date, "Date")
        if _state.database is not None and self.date < _state.database.start.isoformat():
            raise ValueError(f"Date must be on or after {_state.database.start.isoformat()}, but received: {self.date}")
        if _state.end_date is not None and self.date > _state.end_date:
            raise ValueError(f"Date must be on or before the current date {_state.end_date}, but received: {self.date}")


class DateRange(gated.DateRange):
    """Days from start_date to end_date, inclusive; a missing side is the database's first day or
    the end date, filled in when the range is made (as in MIRAI), unless the database begins after
    the end date: then both stay None, a range over no day."""

    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        for name in ("start_date", "end_date"):
            value = getattr(self, name)
            if value is not None:
                _require(value, Date, f"DateRange.{name}")
        first = _state.database.start.isoformat() if _state.database is not None else None
        if first is not None and _state.end_date is not None and first > _state.end_date:
            # The database begins after the end date (a query on the first day of a release's
            # first month): no day is visible and no Date can be made, so the range stays open,
            # over tables that hold nothing. MIRAI's own start date always precedes its queries.
            return
        if self.start_date is None and first is not None:
            object.__setattr__(self, "start_date", Date(first))
        if self.end_date is None and _state.end_date is not None:
            object.__setattr__(self, "end_date", Date(_state.end_date))
        if self.start_date and self.end_date and self.start_date.date > self.end_date.date:
            raise ValueError(
                f"Start date must be before or equal to end date, but received: start_date={self.start_date.date}, "
                f"end_date={self.end_date.date}"
            )


class ISOCode(gated.ISOCode):
    """An ISO 3166-1 alpha-3 country code, e.g. 'USA' (upper case, as MIRAI requires)."""

    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or self.code not in iso3_codes():
            raise ValueError(
                f"ISO code must be a valid ISO alpha-3 country code, but received: {self.code!r} "
                "(map_country_name_to_iso(name) finds the code of a country)"
            )


class Country(gated.Country):
    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        _require(self.iso_code, ISOCode, "Country.iso_code")
        expected = lookup.map_iso_to_country_name(self.iso_code.code)
        if self.name != expected:
            raise ValueError(f"Country name for {self.iso_code.code} is {expected!r}, but received: {self.name!r}")


class CAMEOCode(gated.CAMEOCode):
    """A CAMEO relation code: two digits (first level, '04') or three (second level, '042')."""

    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or self.code not in level1_codes() | level2_codes():
            raise ValueError(
                f"CAMEO code must be a valid 2 or 3-digit CAMEO code, but received: {self.code!r} "
                "(map_relation_description_to_cameo(text) finds codes for a description)"
            )


class Relation(gated.Relation):
    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        _require(self.cameo_code, CAMEOCode, "Relation.cameo_code")
        known = lookup.map_cameo_to_relation(self.cameo_code.code)
        if (self.name, self.description) != (known.name, known.description):
            raise ValueError(
                f"Relation name and description must be those of CAMEO code {self.cameo_code.code} "
                "(map_cameo_to_relation gives them)"
            )


class Event(gated.Event):
    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        _require(self.date, Date, "Event.date")
        _require(self.head_entity, ISOCode, "Event.head_entity")
        _require(self.relation, CAMEOCode, "Event.relation")
        _require(self.tail_entity, ISOCode, "Event.tail_entity")


class NewsArticle(gated.NewsArticle):
    RENDERING = gated.MIRAI

    def __post_init__(self) -> None:
        _require(self.date, Date, "NewsArticle.date")
        _require(self.title, str, "NewsArticle.title")
        _require(self.content, str, "NewsArticle.content")
        _require(self.events, list, "NewsArticle.events")


# --- conversions from the gated environment's objects ----------------------------------------------


def _gated_range(date_range: DateRange | None) -> gated.DateRange | None:
    if date_range is None:
        return None
    if not isinstance(date_range, DateRange):
        date_range = DateRange(*(None if d is None else _as(Date, d) for d in date_range))
    return gated.DateRange(
        None if date_range.start_date is None else date_range.start_date.date,
        None if date_range.end_date is None else date_range.end_date.date,
    )


def _as(kind: type, value: object):
    """A data class from itself or from its plain string (as our API accepts both)."""
    return value if isinstance(value, kind) else kind(value)


def _codes(values, kind: type) -> list[str] | None:
    """MIRAI reads an empty list as "no filter" (``if head_entities:``); so does this."""
    if not values:
        return None
    if isinstance(values, (str, kind)):
        values = [values]
    return [_as(kind, v).code for v in values]


def _relation(rel: gated.Relation) -> Relation:
    return Relation(CAMEOCode(rel.cameo_code.code), rel.name, rel.description)


def _event(event: gated.Event) -> Event:
    return Event(
        Date(event.date.date),
        ISOCode(event.head_entity.code),
        CAMEOCode(event.relation.code),
        ISOCode(event.tail_entity.code),
    )


# --- the 14 functions -----------------------------------------------------------------------------


def map_country_name_to_iso(name: str) -> list[Country]:
    """The country of an exact name or code, else the 5 most similar (docs/agent_api.md)."""
    return [Country(ISOCode(c.iso_code.code), c.name) for c in lookup.map_country_name_to_iso(name)]


def map_iso_to_country_name(iso_code: ISOCode) -> str:
    return lookup.map_iso_to_country_name(_as(ISOCode, iso_code).code)


def map_relation_description_to_cameo(description: str) -> list[Relation]:
    return [_relation(r) for r in lookup.map_relation_description_to_cameo(description)]


def map_cameo_to_relation(cameo_code: CAMEOCode) -> Relation:
    return _relation(lookup.map_cameo_to_relation(_as(CAMEOCode, cameo_code).code))


def get_parent_relation(cameo_code: CAMEOCode) -> Relation:
    return _relation(lookup.get_parent_relation(_as(CAMEOCode, cameo_code).code))


def get_child_relations(cameo_code: CAMEOCode) -> list[Relation]:
    return [_relation(r) for r in lookup.get_child_relations(_as(CAMEOCode, cameo_code).code)]


def get_sibling_relations(cameo_code: CAMEOCode) -> list[Relation]:
    return [_relation(r) for r in lookup.get_sibling_relations(_as(CAMEOCode, cameo_code).code)]


def count_events(date_range=None, head_entities=None, tail_entities=None, relations=None) -> int:
    return _environment().count_events(
        _gated_range(date_range),
        _codes(head_entities, ISOCode),
        _codes(tail_entities, ISOCode),
        _codes(relations, CAMEOCode),
    )


def get_events(
    date_range=None, head_entities=None, tail_entities=None, relations=None, text_description=None
) -> list[Event]:
    events = _environment().get_events(
        _gated_range(date_range),
        _codes(head_entities, ISOCode),
        _codes(tail_entities, ISOCode),
        _codes(relations, CAMEOCode),
        text_description,
    )
    return [_event(e) for e in events]


def get_entity_distribution(
    date_range=None, involved_relations=None, interacted_entities=None, entity_role=None
) -> dict[ISOCode, int]:
    counts = _environment().get_entity_distribution(
        _gated_range(date_range),
        _codes(involved_relations, CAMEOCode),
        _codes(interacted_entities, ISOCode),
        entity_role,
    )
    return {ISOCode(code.code): n for code, n in counts.items()}


def get_relation_distribution(date_range=None, head_entities=None, tail_entities=None) -> dict[CAMEOCode, int]:
    counts = _environment().get_relation_distribution(
        _gated_range(date_range), _codes(head_entities, ISOCode), _codes(tail_entities, ISOCode)
    )
    return {CAMEOCode(code.code): n for code, n in counts.items()}


def count_news_articles(date_range=None, head_entities=None, tail_entities=None, relations=None, keywords=None) -> int:
    return _environment().count_news_articles(
        _gated_range(date_range),
        _codes(head_entities, ISOCode),
        _codes(tail_entities, ISOCode),
        _codes(relations, CAMEOCode),
        keywords or None,
    )


def get_news_articles(
    date_range=None, head_entities=None, tail_entities=None, relations=None, keywords=None, text_description=None
) -> list[tuple[Date, str]]:
    found = _environment().get_news_articles(
        _gated_range(date_range),
        _codes(head_entities, ISOCode),
        _codes(tail_entities, ISOCode),
        _codes(relations, CAMEOCode),
        keywords or None,
        text_description,
    )
    return [(Date(day.date), title) for day, title in found]


def browse_news_article(date: Date, title: str) -> str:
    """'Date('YYYY-MM-DD'):', the title and the article's text, one per line, as MIRAI shows it."""
    return _environment().browse_news_article(_as(Date, date).date, title)


# --- MIRAI's module globals -------------------------------------------------------------------------


class _Module(types.ModuleType):
    """``DEFAULT_START_DATE`` and ``DEFAULT_END_DATE`` read (and, for the end date, set) the state
    above, so code that touches MIRAI's globals through the module moves the gate the same way."""

    @property
    def DEFAULT_START_DATE(self) -> str:
        return get_default_start_date()

    @property
    def DEFAULT_END_DATE(self) -> str | None:
        return get_default_end_date()

    @DEFAULT_END_DATE.setter
    def DEFAULT_END_DATE(self, value: str) -> None:
        set_default_end_date(value)


sys.modules[__name__].__class__ = _Module
