"""What an agent reads in mode mirai is the text MIRAI's code prints (issue 34): the data classes'
two renderings, the observations of a mode-mirai sandbox, and MIRAI's order of ties. The golden
strings are what MIRAI's ``APIs/api_implementation.py`` (github.com/yecchen/MIRAI) prints: its
classes are ``@dataclass``es with their own ``__str__``, so ``repr`` (inside lists and dicts) is the
dataclass one and ``str`` the short one; its ``browse_news_article`` heads the text with
``f"{date}:"`` of a ``Date``; its loop (``agents/react_agents.py``) shows ``str()`` of a call's value,
or "Empty output from the function call." for an empty list or dict."""

from __future__ import annotations

import random
from datetime import date

import pandas as pd
import polars as pl
import pytest

import pipeline.agent_api.mirai_api as mirai_api
from pipeline.agent_api import EventDatabase, mirai_order, types
from pipeline.agent_api.types import MIRAI, NATIVE, rendering
from pipeline.evaluation.mirai_mode import mirai_code
from testbed.database import generate_event_database

QUERY_DATE = date(2024, 2, 10)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirai-text")
    generate_event_database(root, date(2024, 1, 1), 2, seed=5, quads_per_day=40)
    return root


def _values(m):
    day, usa, code = m.Date("2024-01-05"), m.ISOCode("USA"), m.CAMEOCode("042")
    event = m.Event(day, usa, code, m.ISOCode("CHN"))
    return day, usa, code, event, m.Relation(code, "Make a visit", "Visit the target's territory.")


def test_mirai_rendering_is_miraiS_dataclass_repr_and_short_str():
    day, usa, code, event, relation = _values(types)
    with rendering(MIRAI):
        assert [repr(day), str(day)] == ["Date(date='2024-01-05')", "Date('2024-01-05')"]
        assert [repr(usa), str(usa)] == ["ISOCode(code='USA')", "ISOCode('USA')"]
        assert [repr(code), str(code)] == ["CAMEOCode(code='042')", "CAMEOCode('042')"]
        assert (
            repr(types.DateRange(day, day))
            == "DateRange(start_date=Date(date='2024-01-05'), end_date=Date(date='2024-01-05'))"
        )
        assert str(types.DateRange(day, day)) == "DateRange(start_date=Date('2024-01-05'), end_date=Date('2024-01-05'))"
        assert str(types.Country(usa, "United States")) == "Country(iso_code=ISOCode('USA'), name='United States')"
        assert str([types.Country(usa, "United States")]) == (
            "[Country(iso_code=ISOCode(code='USA'), name='United States')]"
        )
        # MIRAI's __str__ puts strings between quotes as they are; its dataclass repr uses repr().
        assert str(relation) == (
            "Relation(cameo_code=CAMEOCode('042'), name='Make a visit', description='Visit the target's territory.')"
        )
        assert repr(relation) == (
            "Relation(cameo_code=CAMEOCode(code='042'), name='Make a visit', "
            'description="Visit the target\'s territory.")'
        )
        assert str([event]) == (
            "[Event(date=Date(date='2024-01-05'), head_entity=ISOCode(code='USA'), relation=CAMEOCode(code='042'), "
            "tail_entity=ISOCode(code='CHN'))]"
        )
        assert str(event) == (
            "Event(date=Date('2024-01-05'), head_entity=ISOCode('USA'), relation=CAMEOCode('042'), "
            "tail_entity=ISOCode('CHN'))"
        )
        assert (
            str({code: 3}) == "{CAMEOCode(code='042'): 3}" and str([(day, "T")]) == "[(Date(date='2024-01-05'), 'T')]"
        )
        assert str(types.NewsArticle(day, "T", "text", [])) == "Date('2024-01-05'):\nT\ntext"


def test_native_rendering_is_unchanged():
    day, _, _, event, relation = _values(types)
    assert types.current_rendering() == NATIVE
    assert str(day) == repr(day) == 'Date("2024-01-05")'
    assert str([event]) == (
        '[Event(date=Date("2024-01-05"), head_entity=ISOCode("USA"), relation=CAMEOCode("042"), '
        'tail_entity=ISOCode("CHN"))]'
    )
    assert str(relation) == (
        'Relation(cameo_code=CAMEOCode("042"), name=\'Make a visit\', description="Visit the target\'s territory.")'
    )
    assert repr(types.DateRange(day)) == 'DateRange(start_date=Date("2024-01-05"), end_date=None)'


def test_mirai_api_classes_are_the_api_classes_in_miraiS_rendering():
    for name in ("Date", "DateRange", "ISOCode", "Country", "CAMEOCode", "Relation", "Event", "NewsArticle"):
        assert issubclass(getattr(mirai_api, name), getattr(types, name))
    with rendering(NATIVE):  # their rendering is their own, whatever the context's
        assert str([mirai_api.CAMEOCode("042")]) == "[CAMEOCode(code='042')]"
        assert str(mirai_api.ISOCode("USA")) == "ISOCode('USA')"


def _observe(env, action: str) -> str:
    code, problem = mirai_code(action, "single_function")
    assert problem is None
    return env.run_code(code).rstrip("\n")


def test_a_mode_mirai_sandbox_shows_what_miraiS_loop_shows(data_dir):
    database = EventDatabase(data_dir)
    with database.environment(QUERY_DATE, 1, count_both_actors=True, dialect=MIRAI) as env:
        events = env.get_events()
        with rendering(MIRAI):
            assert _observe(env, "get_events()") == str(events)
            assert _observe(env, "get_events()[:1]").startswith(
                "[Event(date=Date(date='2024-02-09'), head_entity=ISOCode(code='"
            )
            assert _observe(env, "get_relation_distribution()") == str(env.get_relation_distribution())
            assert _observe(env, "get_relation_distribution()").startswith("{CAMEOCode(code='")
            day, title = env.get_news_articles()[0]
            assert _observe(env, "get_news_articles()[:1]") == f"[(Date(date='{day.date}'), {title!r})]"
            assert _observe(env, f"browse_news_article(Date('{day.date}'), {title!r})").startswith(
                f"Date('{day.date}'):\n{title}\n"
            )
        assert _observe(env, "map_cameo_to_relation(CAMEOCode('042'))").startswith(
            "Relation(cameo_code=CAMEOCode('042'), name='Make a visit', description='"
        )
        assert _observe(env, "get_events(head_entities=[ISOCode('ATA')], tail_entities=[ISOCode('ATA')])") == (
            "Empty output from the function call."
        )
        assert _observe(env, "count_events()") == str(env.count_events())
        # A code block's print() shows MIRAI's str of an object and its repr inside a list.
        assert (
            env.run_code("print(CAMEOCode('042'), [Date('2024-01-05')])")
            == "CAMEOCode('042') [Date(date='2024-01-05')]\n"
        )
    with database.environment(QUERY_DATE, 1) as native:  # native mode: today's text
        assert _observe(native, "get_events()[:1]").startswith('[Event(date=Date("2024-02-09")')
        assert native.browse_news_article(day.date, title).startswith(f"{day.date}:\n")


def test_miraiS_order_is_pandas_default_sort_without_simd():
    """Object arrays take numpy's portable sort, which pandas' sort_values(ascending=False) uses
    for MIRAI's string columns, and which MIRAI's numbers get on a machine without AVX-512."""
    rng = random.Random(3)
    for n in (3, 16, 17, 60, 400):
        days = [f"2024-01-{rng.randint(1, 9):02d}" for _ in range(n)]
        expected = pd.Series(days, dtype=object).sort_values(ascending=False).index.tolist()
        assert mirai_order.descending(days) == expected
        codes = pl.Series([rng.choice(["010", "042", "043", "190"]) for _ in range(n)])
        first_seen = list(dict.fromkeys(codes.to_list()))
        counts = pd.Series([codes.to_list().count(c) for c in first_seen], dtype=object)
        ranked = counts.sort_values(ascending=False).index
        assert mirai_order.value_counts(codes) == [(first_seen[i], int(counts[i])) for i in ranked]
    scores = [0.5, 1.0, 0.5, 0.0, 1.0] * 5
    assert mirai_order.best_first(scores, 15) == list(pd.Series(scores, dtype=object).argsort()[::-1][:15])


def test_the_mirai_dialect_orders_ties_as_miraiS_code(data_dir):
    """MIRAI's get_relation_distribution and get_events over data_kg's rows (date, head, relation,
    tail: mirai export's order), done with pandas as its code does them, on object columns."""
    database = EventDatabase(data_dir)
    env = database.environment(QUERY_DATE, 1, count_both_actors=True, dialect=MIRAI)
    native = database.environment(QUERY_DATE, 1)
    events, _ = env.tables()
    kg = events.sort("date", "s", "r", "o").select(
        pl.col("date").cast(pl.String), *(pl.col(c).cast(pl.String) for c in ("s", "r", "o"))
    )
    frame = pd.DataFrame({c: pd.Series(kg.get_column(c).to_list(), dtype=object) for c in kg.columns})
    relation_counts = frame["r"].value_counts(sort=False)
    by_count = pd.Series(relation_counts.to_list(), dtype=object).sort_values(ascending=False).index
    expected = [(relation_counts.index[i], relation_counts.iloc[i]) for i in by_count]
    assert [(c.code, n) for c, n in env.get_relation_distribution().items()] == expected
    assert list(env.get_relation_distribution().items()) != list(native.get_relation_distribution().items())
    newest = frame.sort_values(by="date", ascending=False).head(30)
    assert [(e.date.date, e.head_entity.code, e.relation.code, e.tail_entity.code) for e in env.get_events()] == [
        tuple(row) for row in newest[["date", "s", "r", "o"]].itertuples(index=False)
    ]
    env.close()
    native.close()
