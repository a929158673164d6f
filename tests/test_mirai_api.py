"""pipeline.agent_api.mirai_api, MIRAI's module-level API over the gated database: docs/mirai.md's
scripted agent runs as written, the end date is an exact gate, dates before the database's first
day are refused as MIRAI refuses them, and observations print as MIRAI's do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import polars as pl
import pytest

import pipeline.agent_api.mirai_api as api
from pipeline.agent_api import EventDatabase
from pipeline.agent_api.mirai_api import (
    CAMEOCode,
    Country,
    Date,
    DateRange,
    Event,
    ISOCode,
    Relation,
    browse_news_article,
    count_events,
    count_news_articles,
    get_entity_distribution,
    get_events,
    get_news_articles,
    get_relation_distribution,
    map_cameo_to_relation,
    map_iso_to_country_name,
    set_default_end_date,
    use_end_date,
)
from pipeline.evaluation.mirai_predictions import read_predictions, score_round
from testbed.database import generate_event_database

ROOT = Path(__file__).resolve().parent.parent
FIRST_DAY = "2024-01-01"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mirai-api")
    generate_event_database(root, date(2024, 1, 1), 2, seed=9, quads_per_day=40)
    return root


@pytest.fixture(scope="module")
def tables(data_dir) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every event and article, read straight from the files (the truth the gate is checked on)."""
    read = lambda table: pl.read_parquet(data_dir / "database" / table / "*.parquet")  # noqa: E731
    return read("events"), read("news")


@pytest.fixture(autouse=True)
def fresh_module(data_dir):
    api.set_default_end_date(None)
    api.open_database(data_dir)
    yield
    api.set_default_end_date(None)
    api.close_database()


def _scripted_agent_source() -> str:
    text = (ROOT / "docs" / "mirai.md").read_text()
    block = re.search(r"<!-- scripted-agent: [^>]*-->\n```python\n(.*?)```", text, re.DOTALL)
    assert block, "docs/mirai.md lost its scripted agent"
    return block.group(1)


def test_the_docs_scripted_agent_runs_unchanged_and_answers_from_the_gated_environment(data_dir, tables, tmp_path):
    events, _ = tables
    # Queries of MIRAI's relation_query.csv: three pairs that met before their query day, one
    # (date, s, o) that never did (the agent's fallback branch).
    pairs = (
        events.filter(pl.col("date") < date(2024, 2, 12))
        .group_by("s", "o")
        .len()
        .sort(["len", "s", "o"], descending=[True, False, False])
    )
    chosen = [(s, o) for s, o, _ in pairs.head(3).iter_rows()]
    met = set(events.select(pl.concat_str("s", "o")).to_series())
    chosen.append(next((s, o) for s in ("ATA", "BVT", "HMD") for o in ("NIU", "TKL", "PCN") if s + o not in met))
    days = ["2024-02-12", "2024-02-20", "2024-03-01", "2024-02-15"]
    lines = ["QueryId\tDateStr\tActor1CountryCode\tActor2CountryCode\tAnswerDict"]
    lines += [f"{i}\t{day}\t{s}\t{o}\t{{'04': ['042']}}" for i, (day, (s, o)) in enumerate(zip(days, chosen), 1)]
    (tmp_path / "relation_query.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "scripted_agent.py").write_text(_scripted_agent_source())

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "MIRAI_DATA_DIR": str(data_dir)}
    run = subprocess.run(
        [sys.executable, "scripted_agent.py", "relation_query.csv", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "The DEFAULT_END_DATE is set to 2024-02-11." in run.stdout

    (predictions,) = read_predictions(tmp_path / "out", ["1", "2", "3", "4"])
    database = EventDatabase(data_dir)
    for prediction, day, (s, o) in zip(predictions, days, chosen):
        # The module answers in MIRAI's order of ties (the "mirai" dialect).
        gated = database.environment(date.fromisoformat(day), 1, count_both_actors=True, dialect="mirai")
        distribution = gated.get_relation_distribution(None, [s], [o]) or gated.get_relation_distribution(None, [s])
        expected = {}
        for code in list(distribution)[:3]:
            expected.setdefault(code.code[:2], []).append(code.code)
        assert prediction.answer == expected and prediction.end_state == "Final Answer"
    assert [p.n_steps for p in predictions] == [2, 2, 2, 3]
    assert score_round(predictions, [{"04": ["042"]}] * 4)["n"] == 4


@pytest.mark.parametrize(
    "ends",
    [
        ["2024-01-01", "2024-01-31", "2024-02-01", "2024-02-09", "2024-02-29", "2024-03-15"],
        ["2024-02-20", "2024-01-15", "2024-02-20", "2024-01-02"],  # moved back and forth
    ],
)
def test_the_shim_never_returns_rows_after_the_end_date(tables, ends):
    events, news = tables
    seen = {}
    for end in ends:
        cutoff = date.fromisoformat(end)
        later = news.filter(pl.col("date") == cutoff + timedelta(days=1))
        set_default_end_date("2024-02-29")
        stale = [Date(day.isoformat()) for day in later.get_column("date").head(1)]  # made under a later end date
        set_default_end_date(end)
        visible = events.filter(pl.col("date") <= cutoff)
        total = count_events()
        assert total == visible.height and count_news_articles() == news.filter(pl.col("date") <= cutoff).height
        assert sum(get_relation_distribution().values()) == total
        # MIRAI's code counts both actors of every event, whatever the role (issue 34, point 2).
        assert sum(get_entity_distribution(entity_role="head").values()) == 2 * total
        returned = [e.date.date for e in get_events()] + [e.date.date for e in get_events(text_description="trade")]
        returned += [d.date for d, _ in get_news_articles()] + [d.date for d, _ in get_news_articles(keywords=["the"])]
        assert returned and max(returned) == min(end, "2024-02-29")  # up to the end date, never after
        answers = (total, str(get_relation_distribution()), str(get_events()))
        assert seen.setdefault(end, answers) == answers  # the same end date answers the same, whatever came before
        if stale:
            day, title = later.row(0, named=True)["date"], later.row(0, named=True)["title"]
            with pytest.raises(ValueError, match="on or before the current date"):
                browse_news_article(day.isoformat(), title)
            with pytest.raises(ValueError, match="after the environment's cutoff"):
                browse_news_article(stale[0], title)  # past Date's check; the environment's gate holds


def test_a_date_made_under_a_later_end_date_is_refused_not_answered():
    set_default_end_date("2024-02-20")
    stale = Date("2024-02-15")
    set_default_end_date("2024-02-09")
    with pytest.raises(ValueError, match="after the environment's cutoff 2024-02-09"):
        get_events(DateRange(Date("2024-02-01"), stale))
    api.DEFAULT_END_DATE = "2024-01-10"  # MIRAI's global, assigned through the module: the same gate
    assert api.get_default_end_date() == "2024-01-10"
    assert max(e.date.date for e in get_events()) == "2024-01-10"


def test_dates_before_the_first_day_are_refused_as_mirai_refuses_them(capsys):
    set_default_end_date("2024-02-09")
    assert api.DEFAULT_START_DATE == FIRST_DAY and api.DEFAULT_END_DATE == "2024-02-09"
    with pytest.raises(ValueError, match=f"Date must be on or after {FIRST_DAY}, but received: 2023-12-31"):
        Date("2023-12-31")
    with pytest.raises(ValueError, match="Date must be on or before the current date 2024-02-09"):
        Date("2024-02-10")
    assert (
        str(DateRange(end_date=Date("2024-01-05")))
        == f"DateRange(start_date=Date('{FIRST_DAY}'), end_date=Date('2024-01-05'))"
    )
    # An end date before the database starts: an empty history (a query on its first day).
    set_default_end_date("2023-12-31")
    assert count_events() == 0 and get_events() == [] and get_relation_distribution() == {}
    # A range with its defaults selects nothing, as MIRAI's functions without one (issue 33, point
    # 4: the docs' drop-in agent failed on the first query of a release's first month).
    assert str(DateRange()) == "DateRange(start_date=None, end_date=None)"
    usa, chn = ISOCode("USA"), ISOCode("CHN")
    assert get_relation_distribution(DateRange(), [usa], [chn]) == {} and get_events(DateRange()) == []
    with pytest.raises(ValueError, match=f"on or before the current date 2023-12-31, but received: {FIRST_DAY}"):
        Date(FIRST_DAY)
    use_end_date()
    assert capsys.readouterr().out == "The DEFAULT_END_DATE is set to 2023-12-31.\n"


def test_observations_print_as_miraiS_do():
    set_default_end_date("2024-02-09")
    event = Event(Date("2024-02-01"), ISOCode("USA"), CAMEOCode("042"), ISOCode("CHN"))
    # MIRAI's examples/outputs_raw: a function call's observation is str(result) (reprs inside).
    assert str([event]) == (
        "[Event(date=Date(date='2024-02-01'), head_entity=ISOCode(code='USA'), relation=CAMEOCode(code='042'), "
        "tail_entity=ISOCode(code='CHN'))]"
    )
    assert str(event) == (
        "Event(date=Date('2024-02-01'), head_entity=ISOCode('USA'), relation=CAMEOCode('042'), "
        "tail_entity=ISOCode('CHN'))"
    )
    relation = map_cameo_to_relation(CAMEOCode("042"))
    assert str(relation).startswith("Relation(cameo_code=CAMEOCode('042'), name='Make a visit', description='")
    assert repr(relation).startswith("Relation(cameo_code=CAMEOCode(code='042'), name='Make a visit', description=")
    assert str(Country(ISOCode("USA"), map_iso_to_country_name(ISOCode("USA")))) == (
        f"Country(iso_code=ISOCode('USA'), name='{map_iso_to_country_name('USA')}')"
    )
    assert re.fullmatch(r"\{(CAMEOCode\(code='\d{3}'\): \d+(, )?)+\}", str(get_relation_distribution()))
    (day, title), *_ = get_news_articles()
    assert browse_news_article(day, title).startswith(f"Date('{day.date}'):\n{title}\n")
    # MIRAI's loop says "Empty output from the function call." when type(x) is exactly list or dict.
    set_default_end_date("2023-12-31")
    for empty in (get_events(), get_news_articles(), get_relation_distribution(), get_entity_distribution()):
        assert type(empty) in (list, dict) and len(empty) == 0


def test_without_an_end_date_only_the_look_ups_answer(capsys, tmp_path):
    use_end_date()
    assert capsys.readouterr().out == "DEFAULT_END_DATE is not set.\n"
    with pytest.raises(ValueError, match=r"no end date is set: call set_default_end_date\('YYYY-MM-DD'\)"):
        count_events()
    api.close_database()
    assert map_iso_to_country_name(ISOCode("FRA")) == "France" and map_cameo_to_relation("19").name
    with pytest.raises(FileNotFoundError, match=f"no event database under {tmp_path}"):
        api.open_database(tmp_path)
    for bad in ("2024-2-9", "2024-02-30", 20240209):
        with pytest.raises(ValueError, match="the end date must be"):
            set_default_end_date(bad)


def test_arguments_as_mirai_reads_them():
    set_default_end_date("2024-02-09")
    everything = count_events()
    assert count_events(head_entities=[], relations=[]) == everything  # MIRAI: `if head_entities:`
    assert count_events(head_entities=["USA"]) == count_events(head_entities=[ISOCode("USA")]) > 0
    relations = [CAMEOCode("04")]
    assert count_events(relations=relations) == count_events(relations=get_children("04"))
    assert relations == [CAMEOCode("04")]  # MIRAI appends the children to the caller's list; we do not
    for bad in (lambda: ISOCode("usa"), lambda: CAMEOCode("999"), lambda: Event("2024-01-01", "USA", "042", "CHN")):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(ValueError, match="name and description must be those of CAMEO code 042"):
        Relation(CAMEOCode("042"), "Make a visit", "made up")
    assert json.dumps(str(get_events()[0]))  # observations are plain text


def get_children(root: str) -> list[CAMEOCode]:
    return [r.cameo_code for r in api.get_child_relations(CAMEOCode(root))]
