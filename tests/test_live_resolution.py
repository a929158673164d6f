"""Resolution of live rounds (pipeline/live/resolve.py): the answers by the event database's rule,
only once a target date has closed (ledger settled, files stored, grace over) and the deadline
passed, written once, and the same on every re-run; in a local store and on SeaweedFS."""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest

from pipeline.config import Settings
from pipeline.live.resolve import ANSWERS_SCHEMA, answers_path, resolve_round, unresolved_dates
from pipeline.release.layout import UnsafeRelease, check_store_key
from pipeline.release.publish import ReleaseConflict
from pipeline.release.store import LocalStore
from pipeline.release.store_uri import open_store
from pipeline.storage import DataLayout

from .live_builder import midnight, pairs, world, write_round
from .month_builder import Quad, write_days
from .settings_builder import make_settings

ROUND = date(2024, 3, 10)
T1, T7 = ROUND + timedelta(days=1), ROUND + timedelta(days=7)
WINDOW = [ROUND - timedelta(days=i) for i in range(14, 0, -1)]


@pytest.fixture
def settings(tmp_path) -> Settings:
    return make_settings(data_dir=tmp_path / "data")


def expected_answers(quads: list[Quad], questions: pl.DataFrame, target: date, min_mentions: int) -> dict[str, list]:
    """The answers computed by hand from the written quads: relations with enough mentions and a
    kept article."""
    taken: dict[tuple[str, str], set[str]] = {}
    for q in quads:
        if q.day == target and q.mentions >= min_mentions and q.kept > 0:
            taken.setdefault((q.s, q.o), set()).add(q.r)
    asked = questions.filter(pl.col("date") == target)
    return {qid: sorted(taken.get((s, o), ())) for qid, s, o in asked.select("query_id", "s", "o").iter_rows()}


def read_answers(settings: Settings, target: date) -> dict[str, list]:
    frame = pl.read_parquet(answers_path(settings.dataset, ROUND, target))
    assert frame.schema == ANSWERS_SCHEMA
    return dict(frame.iter_rows())


def test_resolution_waits_for_the_deadline_closure_and_grace_then_never_changes(settings):
    world_pairs = pairs(seed=1)
    quads = world(2, world_pairs, [T1, T7])
    # Boundary cases of the database rule on T1: under the threshold, and no kept article.
    s, o = world_pairs[0].s, world_pairs[0].o
    quads += [
        Quad(T1, s, "190", o, mentions=settings.dataset.article_min_mentions - 1),
        Quad(T1, s, "193", o, mentions=80, kept=0, dropped=1),
    ]
    write_days(settings, [T1], quads)
    write_days(settings, [T7], quads, slot_status="pending")
    store = LocalStore(settings.dataset.data_dir / "bucket")
    questions = write_round(settings, ROUND, world_pairs, store=store)

    # Before the deadline nothing resolves, even though T1's files are all there and settled.
    early = resolve_round(
        ROUND, settings.dataset, settings.live, now=midnight(ROUND) + timedelta(hours=12), store=store
    )
    assert early.resolved == []
    assert early.waiting[T1.isoformat()][0].startswith("submissions are open until 2024-03-11T00:00:00")
    # At the deadline, and until t + 1 day + 24 h of grace, T1 still waits.
    for now in (midnight(T1), midnight(T1) + timedelta(hours=47, minutes=59)):
        result = resolve_round(ROUND, settings.dataset, settings.live, now=now, store=store)
        assert (
            result.resolved == []
            and "grace period runs until 2024-03-13T00:00:00+00:00" in result.waiting[T1.isoformat()]
        )
    assert not answers_path(settings.dataset, ROUND, T1).exists()

    now = midnight(T1) + timedelta(hours=48)
    first = resolve_round(ROUND, settings.dataset, settings.live, now=now, store=store)
    assert first.resolved == [T1]
    assert any(r.startswith("slots not settled: 192 pending") for r in first.waiting[T7.isoformat()])
    answers = read_answers(settings, T1)
    assert answers == expected_answers(quads, questions, T1, settings.dataset.article_min_mentions)
    assert "190" not in answers[questions.row(0, named=True)["query_id"]]
    empty = sum(1 for a in answers.values() if not a)
    assert 0 < empty < len(answers)  # quiet pairs give empty answers, active ones relations
    (state,) = [d for d in first.dates if d.target == T1]
    assert state.newly and state.questions == len(answers) and state.empty == empty
    published = store.get_bytes(state.store_key)
    lines = [json.loads(line) for line in published.decode().splitlines()]
    assert [(x["query_id"], x["answer_list"]) for x in lines] == sorted(answers.items())
    assert list(lines[0]) == ["query_id", "date", "s", "o", "answer_list"]
    # The live index lists the published answers (pipeline/live/rounds.py write_live_index).
    (listed,) = json.loads(store.get_bytes("live/index.json"))["rounds"]
    assert listed["round"] == str(ROUND) and listed["resolved_dates"] == [str(T1)]

    # A re-run (and a later change of T1's files) never recomputes or republishes a resolved date.
    write_days(settings, [T1], world(99, world_pairs, [T1]))
    before = answers_path(settings.dataset, ROUND, T1).stat().st_mtime_ns
    again = resolve_round(ROUND, settings.dataset, settings.live, now=now + timedelta(days=30), store=store)
    (state_again,) = [d for d in again.dates if d.target == T1]
    assert not state_again.newly and read_answers(settings, T1) == answers
    assert answers_path(settings.dataset, ROUND, T1).stat().st_mtime_ns == before
    assert store.get_bytes(state.store_key) == published

    # T7 resolves once its slots settle.
    assert T7.isoformat() in again.waiting
    write_days(settings, [T7], quads)
    last = resolve_round(ROUND, settings.dataset, settings.live, now=midnight(T7) + timedelta(hours=48), store=store)
    assert last.resolved == [T1, T7] and read_answers(settings, T7) == expected_answers(quads, questions, T7, 50)


def test_a_date_without_its_daily_files_or_ledger_waits_with_the_reason(settings):
    world_pairs = pairs(seed=3)
    write_round(settings, ROUND, world_pairs)
    result = resolve_round(ROUND, settings.dataset, settings.live, now=midnight(T7) + timedelta(days=10))
    assert result.resolved == []
    # Named by asset and partition: quads and articles both store T1 as date=<T1>.parquet.
    assert result.waiting[T1.isoformat()] == [
        f"no slot ledger (gdelt_files {T1} not materialised)",
        f"not stored yet: daily_quads {T1}, articles {T1}",
    ]
    write_days(settings, [T1], world(4, world_pairs, [T1]))
    DataLayout(settings.dataset.data_dir).articles_path(T1).unlink()
    result = resolve_round(ROUND, settings.dataset, settings.live, now=midnight(T7) + timedelta(days=10))
    assert result.waiting[T1.isoformat()] == [f"not stored yet: articles {T1}"]


def test_other_bytes_in_the_store_are_refused_and_left_alone(settings):
    world_pairs = pairs(seed=5)
    write_days(settings, [T1, T7], world(6, world_pairs, [T1, T7]))
    write_round(settings, ROUND, world_pairs)
    store = LocalStore(settings.dataset.data_dir / "bucket")
    key = f"live/rounds/{ROUND}/answers-{T1}.jsonl"
    store.put_bytes(key, b'{"query_id": "forged"}\n', cache_control="no-cache", if_absent=True)
    with pytest.raises(ReleaseConflict, match="holds other bytes than the answers resolved here"):
        resolve_round(ROUND, settings.dataset, settings.live, now=midnight(T7) + timedelta(days=2), store=store)
    assert store.get_bytes(key) == b'{"query_id": "forged"}\n'
    # The local answers were written first, so they are kept; the refusal repeats on every run.
    assert answers_path(settings.dataset, ROUND, T1).exists()
    with pytest.raises(ReleaseConflict):
        resolve_round(ROUND, settings.dataset, settings.live, now=midnight(T7) + timedelta(days=2), store=store)


@pytest.mark.parametrize(
    "key",
    [
        "live/rounds/2024-02-30/answers-2024-03-01.jsonl",
        "live/rounds/2024-03-10/answers-2024-13-01.jsonl",
        "live/rounds/2024-03-10/../../releases/x",
        "live/rounds/2024-03-10/predictions.parquet",
        "live/other.json",
    ],
)
def test_store_keys_under_live_are_checked(key):
    with pytest.raises(UnsafeRelease):
        check_store_key(key)


def test_resolution_publishes_to_seaweedfs_once(settings, s3_server, bucket):
    world_pairs = pairs(seed=7)
    write_days(settings, [T1, T7], world(8, world_pairs, [T1, T7]))
    write_round(settings, ROUND, world_pairs)
    remote = make_settings(
        settings, release_uri=f"s3://{bucket}/mirai", s3_endpoint_url=s3_server.endpoint, s3_region="us-east-1"
    )
    now = midnight(T7) + timedelta(days=2)
    first = resolve_round(
        ROUND, remote.dataset, remote.live, now=now, store=open_store(remote.dataset, remote.network, remote.release)
    )
    assert first.resolved == [T1, T7]
    client = s3_server.client()
    keys = {o["Key"]: o["LastModified"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    answers = {f"mirai/live/rounds/{ROUND}/answers-{t}.jsonl" for t in (T1, T7)}
    assert set(keys) == answers | {"mirai/live/index.json"}
    head = client.head_object(Bucket=bucket, Key=f"mirai/live/rounds/{ROUND}/answers-{T1}.jsonl")
    assert head["CacheControl"] == "public, max-age=31536000, immutable"
    again = resolve_round(
        ROUND, remote.dataset, remote.live, now=now, store=open_store(remote.dataset, remote.network, remote.release)
    )
    assert [d.newly for d in again.dates] == [False, False]
    assert {o["Key"]: o["LastModified"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]} == keys


def test_a_replayed_round_resolves_only_once_its_deadline_passed_on_the_store_s_clock(settings):
    """A round replayed today (the demo's open round) has a published deadline years ago, but
    acceptance places it in store time, after its manifest landed: resolution waits for the same
    moment, or answers would be out while a submission is still accepted."""
    world_pairs = pairs(seed=1)
    write_days(settings, [T1, T7], world(2, world_pairs, [T1, T7]))
    store = LocalStore(settings.dataset.data_dir / "bucket")
    write_round(settings, ROUND, world_pairs, store=store)
    manifest = store.root / "live" / "rounds" / str(ROUND) / "manifest.json"
    now = datetime.now(UTC)
    landed = now - timedelta(hours=1)  # published deadline − published_at is 23 h
    os.utime(manifest, (landed.timestamp(), landed.timestamp()))
    waiting = resolve_round(ROUND, settings.dataset, settings.live, now=now, store=store)
    assert waiting.resolved == []
    closes = (landed + timedelta(hours=23)).isoformat()
    assert waiting.waiting[T1.isoformat()] == [f"submissions are open until {closes}"]
    assert unresolved_dates(settings.dataset, settings.live, ROUND, now, store)[T1] == (
        f"submissions are open until {closes}",
    )
    landed = now - timedelta(hours=23, seconds=1)
    os.utime(manifest, (landed.timestamp(), landed.timestamp()))
    assert resolve_round(ROUND, settings.dataset, settings.live, now=now, store=store).resolved == [T1, T7]
