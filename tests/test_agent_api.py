"""The date-gated agent API: the gate on every function, the code-block sandbox, the look-ups,
the database generator and the leakage audit."""

from __future__ import annotations

import hashlib
import math
import random
import shutil
import subprocess
import sys
import textwrap
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.agent_api import (
    API_FUNCTIONS,
    Date,
    DateGateError,
    DateRange,
    Environment,
    EventDatabase,
    ISOCode,
    open_environment,
)
from pipeline.agent_api.audit import leakage_violations
from pipeline.agent_api.bm25 import mirai_tokens, okapi_scores
from pipeline.agent_api.lockdown import SECCOMP_ARCHES, machine
from pipeline.config import Settings
from pipeline.reference import country_alternate_names
from pipeline.splits.database import EVENT_DB_SCHEMA, NEWS_DB_SCHEMA
from pipeline.storage import DamagedFile, DataLayout, atomic_write_parquet
from testbed.database import generate_event_database

QUERY = date(2024, 2, 10)
CUTOFF = QUERY - timedelta(days=1)
# Only rows dated after the cutoff use these; seeing any of them anywhere is a leak.
FUTURE_COUNTRY, FUTURE_RELATION, FUTURE_WORD = "PRK", "193", "zeppelin"


def _event(day: date, s: str, r: str, o: str, ids: list[str]) -> dict:
    return {
        "date": day,
        "s": s,
        "r": r,
        "o": o,
        "r1": r[:2],
        "s_name": s,
        "o_name": o,
        "r_name": r,
        "daily_mentions": 120,
        "n_articles": len(ids),
        "article_ids": ids,
    }


def _article(article_id: str, day: date, future: bool) -> dict:
    word = FUTURE_WORD if future else "summit"
    return {
        "article_id": article_id,
        "date": day,
        "url": f"https://x.test/{article_id}",
        "title": f"{'FUTURE' if future else 'Past'} {word} story {article_id}",
        "text": f"Officials discussed the {word} and trade on {day}.",
        "abstract": "",
    }


def _write_month(root: Path, month: date, events: list[dict], news: list[dict]) -> None:
    layout = DataLayout(root)
    atomic_write_parquet(pl.DataFrame(events, schema=EVENT_DB_SCHEMA), layout.database_path("events", month))
    atomic_write_parquet(pl.DataFrame(news, schema=NEWS_DB_SCHEMA), layout.database_path("news", month))


@pytest.fixture(scope="module")
def gate_db(tmp_path_factory) -> Path:
    """Three months; rows before, at, one day after and long after the cutoff (2024-02-09)."""
    root = tmp_path_factory.mktemp("gate-db")
    days = {
        "jan": date(2024, 1, 15),
        "before": CUTOFF - timedelta(days=1),
        "at": CUTOFF,
        "query": QUERY,
        "after": QUERY + timedelta(days=1),
        "march": date(2024, 3, 5),
    }
    past = [
        ("jan", "USA", "042", "CHN"),
        ("before", "CHN", "036", "USA"),
        ("at", "USA", "010", "RUS"),
        ("at", "AUS", "042", "CHN"),
    ]
    future = [
        ("query", FUTURE_COUNTRY, FUTURE_RELATION, "USA"),
        ("query", "USA", "042", "CHN"),
        ("after", "USA", FUTURE_RELATION, FUTURE_COUNTRY),
        ("march", FUTURE_COUNTRY, "190", "CHN"),
    ]
    months: dict[date, tuple[list, list]] = {}
    for i, (key, s, r, o) in enumerate(past + future):
        day, is_future = days[key], (key, s, r, o) in future
        ids = [f"{i:02d}a", f"{i:02d}b"]
        events, news = months.setdefault(day.replace(day=1), ([], []))
        events.append(_event(day, s, r, o, ids))
        news.extend(_article(a, day, is_future) for a in ids)
    for month, (events, news) in months.items():
        _write_month(root, month, events, news)
    return root


@pytest.fixture(scope="module")
def gate_env(gate_db):
    env = open_environment(gate_db, QUERY)
    yield env
    env.close()


@pytest.fixture(scope="module")
def generated_db(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("generated-db")
    generate_event_database(root, date(2023, 11, 1), 3, seed=21, quads_per_day=60)
    return root


@pytest.fixture(scope="module")
def env(generated_db):
    environment = EventDatabase(generated_db).environment(date(2023, 12, 15))
    yield environment
    environment.close()


def _visible_text(env: Environment) -> str:
    """Everything every function returns with no filter, as text."""
    out = [
        repr(env.get_events()),
        repr(env.get_entity_distribution()),
        repr(env.get_relation_distribution()),
        repr(env.get_news_articles()),
        repr(env.get_events(text_description=FUTURE_WORD)),
        repr(env.get_news_articles(text_description=FUTURE_WORD)),
        repr(env.get_news_articles(keywords=[FUTURE_WORD, "FUTURE"])),
    ]
    out += [env.browse_news_article(d, t) for d, t in env.get_news_articles()]
    return "\n".join(out)


# --- the gate -------------------------------------------------------------------------------------


def test_every_function_sees_up_to_the_cutoff_and_nothing_after(gate_env):
    events = gate_env.get_events()
    assert {e.date.date for e in events} == {"2024-01-15", "2024-02-08", "2024-02-09"}
    assert gate_env.count_events() == 4
    assert gate_env.count_news_articles() == 8
    assert gate_env.count_news_articles(keywords=[FUTURE_WORD]) == 0
    assert gate_env.count_events(head_entities=[FUTURE_COUNTRY]) == 0
    assert gate_env.count_events(relations=["19"]) == 0
    assert ISOCode(FUTURE_COUNTRY) not in gate_env.get_entity_distribution()
    assert sum(gate_env.get_relation_distribution().values()) == 4
    text = _visible_text(gate_env)
    for marker in (FUTURE_COUNTRY, FUTURE_RELATION, FUTURE_WORD, "FUTURE", "2024-02-10", "2024-02-11", "2024-03"):
        assert marker not in text
    assert "2024-02-09" in text  # the cutoff day itself is visible
    events_table, news_table = gate_env.tables()
    assert events_table.get_column("date").max() == CUTOFF
    assert news_table.get_column("date").max() == CUTOFF


def test_distance_one_sees_the_day_before_the_query_only(gate_db):
    db = EventDatabase(gate_db)
    one = db.environment(QUERY, 1)
    two = db.environment(QUERY, 2)
    assert max(e.date.date for e in one.get_events()) == "2024-02-09"
    assert max(e.date.date for e in two.get_events()) == "2024-02-08"
    assert two.cutoff == CUTOFF - timedelta(days=1)
    with pytest.raises(ValueError, match="at least 1"):
        db.environment(QUERY, 0)


AFTER = Date((CUTOFF + timedelta(days=1)).isoformat())
BEFORE_START = Date("2023-12-31")
DATED_CALLS = {
    "count_events": lambda env, rng: env.count_events(rng),
    "get_events": lambda env, rng: env.get_events(rng, text_description="summit"),
    "get_entity_distribution": lambda env, rng: env.get_entity_distribution(rng),
    "get_relation_distribution": lambda env, rng: env.get_relation_distribution(rng),
    "count_news_articles": lambda env, rng: env.count_news_articles(rng),
    "get_news_articles": lambda env, rng: env.get_news_articles(rng),
}


@pytest.mark.parametrize("name", sorted(DATED_CALLS))
@pytest.mark.parametrize(
    "date_range",
    [
        DateRange(None, AFTER),
        DateRange(AFTER, None),
        DateRange(AFTER, AFTER),
        DateRange(BEFORE_START, None),
        DateRange("2024-01-01", "2024-12-31"),
    ],
    ids=["end-after", "start-after", "day-after", "before-start", "year"],
)
def test_dates_past_the_cutoff_or_before_the_start_are_refused(gate_env, name, date_range):
    with pytest.raises(DateGateError, match=r"2024-02-09|2024-01-01"):
        DATED_CALLS[name](gate_env, date_range)


def test_browsing_an_article_past_the_cutoff_is_refused(gate_env):
    with pytest.raises(DateGateError, match="cutoff 2024-02-09"):
        gate_env.browse_news_article(AFTER, f"FUTURE {FUTURE_WORD} story 04a")
    assert gate_env.browse_news_article("2024-02-09", "Past summit story 02a").startswith("2024-02-09:\nPast summit")


def test_a_range_ending_at_the_cutoff_is_allowed(gate_env):
    assert gate_env.count_events(DateRange("2024-02-09", "2024-02-09")) == 2


def test_month_files_after_the_cutoff_month_are_never_opened(gate_db, tmp_path):
    copy = tmp_path / "db"
    shutil.copytree(gate_db, copy)
    layout = DataLayout(copy)
    for table in ("events", "news"):
        layout.database_path(table, date(2024, 3, 1)).write_bytes(b"not parquet")  # opening it would fail
    env = open_environment(copy, QUERY)
    assert env.count_events() == 4


def test_a_sealed_month_with_changed_bytes_is_refused_not_read(generated_db, tmp_path):
    copy = tmp_path / "db"
    shutil.copytree(generated_db, copy)
    news = DataLayout(copy).database_path("news", date(2023, 11, 1))
    pl.read_parquet(news).with_columns(pl.col("title").str.to_uppercase()).write_parquet(news)  # still decodes
    with pytest.raises(DamagedFile, match=r"database/news/month=2023-11\.parquet"):
        EventDatabase(copy).environment(date(2023, 12, 15))


def test_the_cached_database_gives_the_same_tables_as_a_fresh_one(gate_db):
    warm = EventDatabase(gate_db)
    warm.environment(date(2024, 3, 30))  # loads all three months into the cache
    cached, fresh = warm.environment(QUERY).tables(), open_environment(gate_db, QUERY).tables()
    for a, b in zip(cached, fresh):
        assert a.equals(b)


# --- functions ------------------------------------------------------------------------------------


def test_filters_relations_expand_and_results_are_capped(env):
    assert env.count_events(relations=["04"]) == sum(
        env.count_events(relations=[r.cameo_code]) for r in env.get_child_relations("04")
    )
    events = env.get_events()
    assert len(events) == 30
    assert [e.date for e in events] == sorted((e.date for e in events), reverse=True)
    assert len(env.get_news_articles()) == 15
    usa = env.get_events(head_entities=["USA"], tail_entities=[ISOCode("CHN")])
    assert usa and all(e.head_entity.code == "USA" and e.tail_entity.code == "CHN" for e in usa)
    dist = env.get_relation_distribution(head_entities=["USA"])
    assert list(dist.values()) == sorted(dist.values(), reverse=True)
    assert sum(dist.values()) == env.count_events(head_entities=["USA"])


def test_entity_distribution_roles(env):
    heads = env.get_entity_distribution(interacted_entities=["CHN"], entity_role="head")
    assert sum(heads.values()) == env.count_events(tail_entities=["CHN"])
    both = env.get_entity_distribution(interacted_entities=["CHN"])
    tails = env.get_entity_distribution(interacted_entities=["CHN"], entity_role="tail")
    assert sum(both.values()) == sum(heads.values()) + sum(tails.values())
    with pytest.raises(ValueError, match="entity_role"):
        env.get_entity_distribution(entity_role="subject")


def test_text_search_ranks_matching_articles_first(env):
    title_words = env.get_news_articles(head_entities=["USA"])[0][1]
    top = env.get_news_articles(text_description=title_words)
    assert title_words in [title for _, title in top]
    word = "ceasefire"
    assert word in env.browse_news_article(*env.get_news_articles(text_description=word)[0]).lower()
    assert env.count_news_articles(keywords=[word]) > 0
    assert env.get_events(text_description=word)


def test_country_lookup(env):
    assert [c.iso_code.code for c in env.map_country_name_to_iso("United States")] == ["USA"]
    assert [c.iso_code.code for c in env.map_country_name_to_iso("usa")] == ["USA"]
    assert "KOR" in [c.iso_code.code for c in env.map_country_name_to_iso("Korea")]
    assert env.map_country_name_to_iso("Britian")[0].iso_code.code == "GBR"
    assert len(env.map_country_name_to_iso("Republic of Nowhere")) == 5
    assert env.map_iso_to_country_name("CHN") == "China"


def test_country_lookup_knows_cldrS_english_names(env):
    # CLDR's English names (babel) and pycountry's give one code each, returned under its display
    # name; accents and curly apostrophes do not matter.
    for name, iso in (
        ("Russia", "RUS"),
        ("vatican city", "VAT"),
        ("Myanmar (Burma)", "MMR"),
        ("Congo - Kinshasa", "COD"),
        ("Palestinian Territories", "PSE"),
        ("St Lucia", "LCA"),
        ("Cote d'Ivoire", "CIV"),
        ("Côte d’Ivoire", "CIV"),
    ):
        found = env.map_country_name_to_iso(name)
        assert [(c.iso_code.code, c.name) for c in found] == [(iso, env.map_iso_to_country_name(iso))], name
    assert env.map_country_name_to_iso("Burma")[0].iso_code.code == "MMR"  # a word of CLDR's "Myanmar (Burma)"


def test_country_lookup_knows_countryinfos_common_names(env):
    # The common English names CLDR's main names lack, and native names in any script, each give
    # one code under its display name.
    for name, iso in (
        ("Turkey", "TUR"),
        ("Ivory Coast", "CIV"),
        ("UK", "GBR"),
        ("uk", "GBR"),
        ("Russia", "RUS"),
        ("Holland", "NLD"),
        ("Swaziland", "SWZ"),
        ("Cape Verde", "CPV"),
        ("East Timor", "TLS"),
        ("Российская Федерация", "RUS"),
        ("中华人民共和国", "CHN"),
    ):
        found = env.map_country_name_to_iso(name)
        assert [(c.iso_code.code, c.name) for c in found] == [(iso, env.map_iso_to_country_name(iso))], name


def test_every_dictionary_name_looks_up_its_own_code_only(env):
    # Names are compared without case, accents or punctuation: two codes' names must stay apart
    # after that too, else an exact look-up gives two answers.
    for iso, names in country_alternate_names().items():
        for name in names:
            assert [c.iso_code.code for c in env.map_country_name_to_iso(name)] == [iso], (iso, name)


def test_relation_lookup_and_hierarchy(env):
    assert env.map_relation_description_to_cameo("Make a visit")[0].cameo_code.code == "042"
    assert "193" in [r.cameo_code.code for r in env.map_relation_description_to_cameo("fight with small arms")]
    assert "173" in [r.cameo_code.code for r in env.map_relation_description_to_cameo("arrest journalists")]
    assert env.get_parent_relation("042").cameo_code.code == "04"
    assert all(r.cameo_code.code.startswith("19") for r in env.get_child_relations("19"))
    assert len(env.get_sibling_relations("04")) == 20
    # The codebook paraphrase (pipeline/reference/cameo_descriptions.csv), not a sentence built from the name.
    assert (
        env.map_cameo_to_relation("042").description
        == "The actor travels to the target's territory for a visit or meeting."
    )
    with pytest.raises(ValueError):
        env.get_parent_relation("04")
    with pytest.raises(ValueError, match="not a known"):
        env.map_cameo_to_relation("999")


def test_data_classes_validate():
    assert repr(Date("2024-01-02")) == 'Date("2024-01-02")'
    for bad in ("2024-1-2", "2024-02-30", 20240102):
        with pytest.raises(ValueError):
            Date(bad)
    with pytest.raises(ValueError):
        ISOCode("XXX")
    with pytest.raises(ValueError):
        DateRange("2024-02-02", "2024-02-01")


# --- the sandbox ----------------------------------------------------------------------------------

# Reaching a module agent code may not import, through an object graph it can walk.
ESCAPE = (
    "_m = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]"
    ".__init__.__globals__['sys'].modules\n"
)


@pytest.mark.parametrize("module", ["os", "subprocess", "socket", "ctypes", "sys", "importlib", "polars"])
def test_sandbox_refuses_imports(env, module):
    assert env.run_code(f"import {module}").startswith("ImportError")


@pytest.mark.parametrize(
    "code",
    [
        "open('/etc/hostname').read()",
        ESCAPE + "_m['io'].open('/etc/hostname').read()",
        ESCAPE + "_m['os'].listdir('/')",
        ESCAPE + "_m['os'].system('true')",
        ESCAPE + "_m['subprocess'].run(['true'])",
        ESCAPE + "_m['socket'].create_connection(('127.0.0.1', 9))",
        ESCAPE + "_m['ctypes'].CDLL(None)",
        "get_events.__func__.__code__",
        ESCAPE + "_m['os'].kill(_m['os'].getppid(), 0)",
        ESCAPE + "_m['sys']._getframe()",
        # polars reads files in Rust, below the audit hook: the kernel filter and the descriptor limit stop it
        "get_events.__globals__['pl'].read_parquet('/etc/hostname')",
    ],
)
def test_sandbox_blocks_files_network_processes_and_introspection(env, code):
    observation = env.run_code(code)
    assert observation.startswith(("PermissionError", "NameError", "OSError")), observation


def test_sandbox_holds_only_gated_rows(generated_db, env):
    cutoff = env.cutoff.isoformat()
    seen = env.run_code(
        "_e, _n = get_events.__self__.tables()\nprint(_e.get_column('date').max(), _n.get_column('date').max())"
    ).split()
    assert seen == [cutoff, cutoff]
    after = (env.cutoff + timedelta(days=1)).isoformat()
    assert env.run_code(f"get_events(DateRange(None, Date('{after}')))").startswith("DateGateError")
    assert env.run_code("count_events()").strip() == str(env.count_events())
    # The month files exist, but the child was never told where and cannot open them anyway.
    path = DataLayout(generated_db).database_path("events", date(2024, 1, 1))
    assert env.run_code(f"get_events.__globals__['pl'].read_parquet('{path}')").startswith(
        ("PermissionError", "OSError")
    )


def test_sandbox_variables_persist_and_output_is_the_observation(env):
    assert env.run_code("total = count_events()\nprint('counted')") == "counted\n"
    assert env.run_code("total == count_events()").strip() == "True"
    assert env.run_code("from collections import Counter\nCounter('aab')").strip() == "Counter({'a': 2, 'b': 1})"
    assert env.run_code("1/0").strip() == "ZeroDivisionError: division by zero"


def test_sandbox_survives_an_infinite_loop_and_a_memory_bomb(generated_db):
    env = EventDatabase(generated_db).environment(date(2023, 12, 1))
    try:
        assert env.run_code("kept = 1") == ""
        assert env.run_code("while True:\n    pass", timeout_s=2).startswith("TimeoutError")
        assert env.run_code("kept").startswith("NameError")  # restarted: variables are gone
        assert env.run_code("kept = 2\nblob = bytearray(50 * 2**30)", memory_mb=512).startswith("MemoryError")
        assert env.run_code(
            "chunks = []\nwhile True:\n    chunks.append(bytearray(2**26))", timeout_s=20, memory_mb=512
        ).startswith(("MemoryError", "SandboxError"))
        assert env.run_code("count_events()").strip() == str(env.count_events())
    finally:
        env.close()


@pytest.mark.skipif(
    sys.platform != "linux" or machine() not in SECCOMP_ARCHES,
    reason=f"the seccomp allowlist is written for Linux {', '.join(SECCOMP_ARCHES)}",
)
def test_seccomp_layer_blocks_syscalls_without_the_audit_hook():
    """The kernel filter on its own: files, sockets, fork, exec and new threads fail."""
    script = textwrap.dedent("""
        import os, socket, threading
        from pipeline.agent_api.lockdown import install_seccomp
        assert install_seccomp().startswith("allowlist")
        results = []
        for name, call in [("open", lambda: open("/etc/hostname")), ("socket", socket.socket),
                           ("fork", os.fork), ("exec", lambda: os.execv("/bin/true", ["true"])),
                           ("stat", lambda: os.stat("/etc/hostname"))]:
            try:
                call()
                results.append(name + ":allowed")
            except PermissionError:
                results.append(name + ":denied")
        try:
            threading.Thread(target=lambda: results.append("thread:ran")).start()
        except RuntimeError:  # "can't start new thread": clone answered EPERM
            results.append("thread:denied")
        print(" ".join(results))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout.split() == [
        "open:denied",
        "socket:denied",
        "fork:denied",
        "exec:denied",
        "stat:denied",
        "thread:denied",
    ], out.stderr


def test_code_blocks_are_refused_on_an_architecture_without_the_allowlist_unless_allowed(generated_db, monkeypatch):
    """The platform is the one thing mocked: this machine is x86_64 or aarch64."""
    import pipeline.agent_api.sandbox as sandbox

    monkeypatch.setattr(sandbox, "machine", lambda: "riscv64")
    refused = EventDatabase(generated_db).environment(date(2023, 12, 1))
    with pytest.raises(
        sandbox.SandboxError, match=r"code blocks are refused on linux/riscv64.*MIRAI_SANDBOX_ALLOW_UNCONFINED"
    ):
        refused.run_code("1")
    allowed = EventDatabase(generated_db, allow_unconfined_sandbox=True).environment(date(2023, 12, 1))
    try:
        assert allowed.run_code("1").strip() == "1"
        assert set(allowed.sandbox_report) >= {"namespaces", "landlock", "seccomp", "audit_hook"}
    finally:
        allowed.close()
    assert Settings.from_env({"MIRAI_SANDBOX_ALLOW_UNCONFINED": "true"}).sandbox.allow_unconfined


def test_sandbox_namespace_has_every_api_function(env):
    listed = env.run_code("print(sorted(n for n in globals() if not n.startswith('_')))")
    for name in API_FUNCTIONS:
        assert name in listed


# --- the database generator -----------------------------------------------------------------------


def test_generator_is_deterministic_and_realistic(tmp_path):
    first = generate_event_database(tmp_path / "a", date(2024, 1, 1), 2, seed=4, quads_per_day=50)
    again = generate_event_database(tmp_path / "b", date(2024, 1, 1), 2, seed=4, quads_per_day=50)
    generate_event_database(tmp_path / "c", date(2024, 1, 1), 1, seed=5, quads_per_day=50)
    assert first == again and first["events"] > 2500
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.parquet"))
    assert len(files) == 4
    for rel in files:
        assert (
            hashlib.md5((tmp_path / "a" / rel).read_bytes()).digest()
            == hashlib.md5((tmp_path / "b" / rel).read_bytes()).digest()
        )
    jan = Path("database/events/month=2024-01.parquet")
    assert (tmp_path / "a" / jan).read_bytes() != (tmp_path / "c" / jan).read_bytes()
    events = pl.read_parquet(tmp_path / "a" / jan)
    news = pl.read_parquet(tmp_path / "a" / "database/news/month=2024-01.parquet")
    assert events.schema == EVENT_DB_SCHEMA and news.schema == NEWS_DB_SCHEMA
    assert events.get_column("daily_mentions").min() >= 50
    assert 0.2 < (events.get_column("daily_mentions") >= 100).mean() < 0.7
    assert events.get_column("n_articles").is_between(1, 12).all()
    assert (events.get_column("s") != events.get_column("o")).all()
    assert not events.select("date", "s", "r", "o").is_duplicated().any()
    links = events.select("date", pl.col("article_ids").alias("article_id")).explode("article_id").unique()
    joined = links.join(news.select("article_id", pl.col("date").alias("news_date")), on="article_id", how="left")
    assert joined.get_column("news_date").null_count() == 0
    assert (joined.get_column("date") == joined.get_column("news_date")).all()
    assert news.height == links.select("article_id").n_unique()
    top = events.group_by("s").len().sort("len", descending=True).get_column("s").head(3).to_list()
    assert "USA" in top


# --- the audit ------------------------------------------------------------------------------------


def test_audit_passes_a_gated_environment(env):
    assert leakage_violations(env) == []


def test_audit_catches_an_environment_built_without_the_gate(generated_db):
    db = EventDatabase(generated_db)
    events, news = db.gated_tables(db.last_day)  # everything, not cut at the query's cutoff
    cutoff = date(2023, 12, 14)
    leaky = Environment(
        events, news, start=db.start, cutoff=cutoff, query_date=cutoff + timedelta(days=1), distance_days=1
    )
    try:
        violations = leakage_violations(leaky)
    finally:
        leaky.close()
    assert any("events table holds" in v for v in violations)
    assert any(v.startswith("get_events()") for v in violations)
    assert any(v.startswith("sandbox tables") for v in violations)


def test_audit_finds_nothing_for_random_query_dates_and_distances(generated_db):
    """Property check over random queries: any date of the database, distances of 1, 7, 30 and 90
    days (MIRAI §3.4), random filters inside the audit; nothing after t − distance is ever seen."""
    rng = random.Random(5)
    db = EventDatabase(generated_db)
    span = (db.last_day - db.start).days
    for _ in range(12):
        distance = rng.choice([1, 7, 30, 90])
        query_date = db.start + timedelta(days=distance + rng.randrange(span - distance + 1))
        with db.environment(query_date, distance) as env:
            assert env.cutoff == query_date - timedelta(days=distance)
            assert leakage_violations(env, rng=random.Random(rng.random()), sandbox=False) == [], (query_date, distance)


def test_a_query_in_the_first_days_of_the_database_sees_nothing(generated_db):
    db = EventDatabase(generated_db)
    with db.environment(db.start, 1) as env:  # cutoff: the day before the database starts
        events, news = env.tables()
        assert events.height == news.height == 0
        assert env.count_events() == 0 and env.get_events() == [] and env.get_news_articles() == []
        with pytest.raises(DateGateError, match="after the environment's cutoff"):
            env.get_events(DateRange(Date(db.start.isoformat()), None))
        assert leakage_violations(env, sandbox=False) == []


# --- ranking by text_description (MIRAI's BM25) ---------------------------------------------------

# (title, text) per day; documents B and E are the same words, C and D score 0: two ties.
RANKED_DOCS = {
    "A": ("peace talks", "talks resumed"),
    "B": ("trade deal", "peace"),
    "C": ("trade deal", "signed"),
    "D": ("border clash", "shelling"),
    "E": ("trade deal", "peace"),
}


def _okapi(docs: list[list[str]], query: list[str], k1: float = 1.5, b: float = 0.75, eps: float = 0.25) -> list:
    """BM25Okapi written out (Robertson & Zaragoza 2009, eq. 3.15 with rank_bm25's idf floor: an idf
    below zero becomes eps x the mean idf over the corpus's terms)."""
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    vocab = {t for d in docs for t in d}
    idf = {t: math.log(n - sum(t in d for d in docs) + 0.5) - math.log(sum(t in d for d in docs) + 0.5) for t in vocab}
    floor = eps * sum(idf.values()) / len(idf)
    idf = {t: floor if v < 0 else v for t, v in idf.items()}
    return [
        sum(idf.get(q, 0.0) * d.count(q) * (k1 + 1) / (d.count(q) + k1 * (1 - b + b * len(d) / avgdl)) for q in query)
        for d in docs
    ]


@pytest.fixture(scope="module")
def ranked_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranked-db")
    events, news = [], []
    for i, (key, (title, text)) in enumerate(RANKED_DOCS.items()):
        day = date(2024, 1, 10 + i)  # one day each: database order A..E
        events.append(_event(day, "USA", "042", "CHN", [key]))
        news.append(
            {
                "article_id": key,
                "date": day,
                "url": f"https://x.test/{key}",
                "title": title,
                "text": text,
                "abstract": "",
            }
        )
    _write_month(root, date(2024, 1, 1), events, news)
    env = open_environment(root, date(2024, 2, 1))
    yield env
    env.close()


def _hand_order(keys: list[str], query: str) -> list[str]:
    docs = [f"{RANKED_DOCS[k][0]} {RANKED_DOCS[k][1]}".split(" ") for k in keys]
    scores = _okapi(docs, query.split(" "))
    # Highest first; equal scores later document first (MIRAI's argsort(...)[::-1]).
    return [keys[i] for i in sorted(range(len(keys)), key=lambda i: (-scores[i], -i))]


def test_news_ranking_is_bm25okapi_with_ties_later_first(ranked_env):
    expected = _hand_order(list(RANKED_DOCS), "peace talks")
    assert expected == ["A", "E", "B", "D", "C"]
    titles = {f"2024-01-{10 + i}": key for i, key in enumerate(RANKED_DOCS)}
    found = ranked_env.get_news_articles(text_description="peace talks")
    assert [titles[d.date] for d, _ in found] == expected
    # get_events: the events of the ranked articles, in the articles' order.
    assert [titles[e.date.date] for e in ranked_env.get_events(text_description="peace talks")] == expected


def test_news_ranking_statistics_come_from_the_candidates_only(ranked_env):
    """Without A, "peace" is in half the documents: its idf is 0 and B, E no longer beat C, D. A
    ranking using statistics of rows outside the call's candidates would still put them first."""
    window = DateRange("2024-01-11", "2024-01-14")
    expected = _hand_order(["B", "C", "D", "E"], "peace talks")
    assert expected == ["E", "D", "C", "B"]  # all scores 0: later first
    titles = {f"2024-01-{10 + i}": key for i, key in enumerate(RANKED_DOCS)}
    assert [titles[d.date] for d, _ in ranked_env.get_news_articles(window, text_description="peace talks")] == expected


def test_news_ranking_tokenises_as_mirai(ranked_env):
    """Split on single spaces, case kept: "Peace" matches no document, "talks" only A."""
    assert ranked_env.get_news_articles(text_description="Peace")[0][0].date == "2024-01-14"  # all 0: later first
    assert ranked_env.get_news_articles(text_description="talks")[0][0].date == "2024-01-10"


def test_okapi_scores_equal_rank_bm25_bit_for_bit(env):
    """bm25.okapi_scores is rank_bm25's BM25Okapi (MIRAI's ranker) computed with polars: the same
    floats, negative idfs (terms in most documents) and their epsilon floor included."""
    from rank_bm25 import BM25Okapi

    rng = random.Random(5)
    words = ["the", "a", "peace", "Peace", "talks,", "", "trade", "deal", "x", "ü"]
    for _ in range(300):
        docs = [
            [rng.choice(words[: rng.randint(2, len(words))]) for _ in range(rng.randint(1, 12))]
            for _ in range(rng.randint(1, 25))
        ]
        query = [rng.choice([*words, "absent"]) for _ in range(rng.randint(1, 5))]
        ours = okapi_scores(pl.Series(docs, dtype=pl.List(pl.String)), query)
        assert np.array_equal(ours, BM25Okapi(docs).get_scores(query)), (docs, query)
    _, news = env.tables()
    tokens = news.select(mirai_tokens(pl.col("title"), pl.col("text"))).to_series()
    reference = BM25Okapi(tokens.to_list())
    for query in ("and the", "Talks on  trade", "ceasefire talks", "China"):
        assert np.array_equal(okapi_scores(tokens, query.split(" ")), reference.get_scores(query.split(" "))), query
