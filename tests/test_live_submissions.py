"""Live-round submissions (pipeline/live/submissions.py): the baselines
accepted through the same path as anyone's, strict matching to the round's questions, p_event
checked, the deadline judged on the store's clock (late refused, on time accepted: on a local
store and on SeaweedFS), a round not published yet awaited then refused, and the monthly path
untouched."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from pipeline.cli import main
from pipeline.evaluation.submissions import NotReady
from pipeline.live import submissions as sub
from pipeline.live.publication import publish_round
from pipeline.release.layout import submission_key
from pipeline.release.store import LocalStore
from pipeline.release.store_uri import open_store

from .month_builder import write_days
from .test_live_rounds import DAY, PUBLISH, WINDOW, later_quads, live_settings, window_quads

NOW = datetime(2024, 3, 10, 6, tzinfo=UTC)  # processing time (store times are the files' own)
META = {"model": "some-model", "knowledge_cutoff": "2024-03-01", "contact": "me@example.org", "round": "2024-03-10"}


@pytest.fixture
def published(tmp_path):
    settings = live_settings(tmp_path / "data")
    write_days(settings, [*WINDOW, DAY, DAY + timedelta(days=1)], window_quads() + later_quads())
    store = LocalStore(tmp_path / "bucket")
    publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH)
    return settings, store


def question_ids(settings) -> list[str]:
    path = settings.dataset.data_dir / "live" / "2024-03-10" / "questions.parquet"
    return pl.read_parquet(path).get_column("query_id").to_list()


def manifest_mtime(store: LocalStore) -> float:
    return (store.root / "live" / "rounds" / "2024-03-10" / "manifest.json").stat().st_mtime


def upload(
    store: LocalStore, name: str, records: list[dict] | bytes, meta: dict | bytes = META, *, at: float | None = None
):
    """Files written straight into the local store, as a submitter with write access could; ``at``
    sets their store timestamps (a local store's object time is the file's mtime)."""
    directory = store.root / "submissions" / name
    directory.mkdir(parents=True)
    data = records if isinstance(records, bytes) else "".join(json.dumps(r) + "\n" for r in records).encode()
    (directory / "predictions.jsonl").write_bytes(data)
    (directory / "submission.json").write_bytes(meta if isinstance(meta, bytes) else json.dumps(meta).encode())
    if at is not None:
        for path in directory.iterdir():
            os.utime(path, (at, at))


def good_records(settings) -> list[dict]:
    return [{"query_id": q, "answer": {"04": ["042"]}, "p_event": 0.5} for q in question_ids(settings)]


def test_baselines_are_accepted_through_the_submission_path(published):
    settings, store = published
    found = sub.triage(store, settings.dataset.data_dir, now=NOW)
    assert sorted(found.ready) == ["live-2024-03-10-frequency", "live-2024-03-10-recurrency"]
    for name in found.ready:
        record = sub.process(store, name, settings.dataset.data_dir, now=NOW)
        assert record["status"] == "accepted" and record["baseline"] is True and record["reasons"] == []
        assert record["format"] == "mirai-live-submission-v1" and record["round"] == "2024-03-10"
        assert record["deadline_published"] == "2024-03-11T00:00:00+00:00"
        frame = pl.read_parquet(
            settings.dataset.data_dir / "live" / "2024-03-10" / "submissions" / name / "predictions.parquet"
        )
        assert frame.schema == pl.Schema(sub.LIVE_PREDICTIONS_SCHEMA)
        assert frame.get_column("query_id").to_list() == question_ids(settings)
        assert frame.get_column("p_event").is_between(0, 1).all()
        assert all(r == sorted(set(r)) for r in frame.get_column("relations").to_list())
    # Processed once: the sensor's next look has nothing, and process returns the stored record.
    assert sub.triage(store, settings.dataset.data_dir, now=NOW).ready == {}
    assert sub.process(store, "live-2024-03-10-frequency", settings.dataset.data_dir, now=NOW)["baseline"] is True
    # The monthly leaderboard's records are untouched: no record.json in the monthly area.
    assert not list((settings.dataset.data_dir / "submissions").glob("*/record.json"))


def test_an_on_time_submission_is_accepted_and_normalised(published):
    settings, store = published
    ids = question_ids(settings)
    records = [
        {"query_id": ids[0], "answer": {"04": ["042", "040"], "19": ["190"]}, "p_event": 0.9},
        {"query_id": ids[1], "answer": ["190", "036"]},  # a list, no p_event
        {"query_id": ids[2], "answer": {}, "p_event": 0},
    ]
    upload(store, "mine", records, at=manifest_mtime(store) + 3600)
    record = sub.process(store, "mine", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "accepted" and record["baseline"] is False and record["answered"] == 3
    frame = pl.read_parquet(
        settings.dataset.data_dir / "live" / "2024-03-10" / "submissions" / "mine" / "predictions.parquet"
    )
    rows = frame.head(4).to_dicts()
    assert rows[0] == {"query_id": ids[0], "relations": ["040", "042", "190"], "p_event": 0.9}
    assert rows[1] == {"query_id": ids[1], "relations": ["036", "190"], "p_event": None}
    assert rows[2] == {"query_id": ids[2], "relations": [], "p_event": 0.0}
    assert rows[3] == {"query_id": ids[3], "relations": [], "p_event": None}  # no prediction
    assert frame.height == len(ids)
    assert store.stat(submission_key("mine", "rejection.json")) is None


def test_a_late_submission_is_refused_naming_both_times(published):
    settings, store = published
    # The round was published at 05:00 for a 00:00 deadline: 19 h after its manifest reached the store.
    anchor = manifest_mtime(store)
    upload(store, "late", good_records(settings), at=anchor + 19 * 3600 + 1)
    record = sub.process(store, "late", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "rejected"
    due = datetime.fromtimestamp(anchor, UTC) + timedelta(hours=19)
    submitted = datetime.fromtimestamp(anchor + 19 * 3600 + 1, UTC)
    assert record["reasons"] == [
        f"late: the submission's last object reached the store at {submitted.isoformat()}, after the round's "
        f"deadline {due.isoformat()} (19:00:00 after the round's manifest.json reached the store)"
    ]
    assert json.loads(store.get_bytes("submissions/late/rejection.json"))["reasons"] == record["reasons"]
    assert not (
        settings.dataset.data_dir / "live" / "2024-03-10" / "submissions" / "late" / "predictions.parquet"
    ).exists()
    # The latest object counts: predictions on time, submission.json a second late.
    upload(store, "late-meta", good_records(settings)[:1], at=anchor + 60)
    os.utime(store.root / "submissions" / "late-meta" / "submission.json", (anchor + 19 * 3600 + 1,) * 2)
    assert "late: " in sub.process(store, "late-meta", settings.dataset.data_dir, now=NOW)["reasons"][0]
    # Exactly on the deadline is on time.
    upload(store, "just", good_records(settings)[:2], at=anchor + 19 * 3600)
    assert sub.process(store, "just", settings.dataset.data_dir, now=NOW)["status"] == "accepted"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"p_event": 1.5}, "line 1: p_event 1.5 is not a probability from 0 to 1"),
        ({"p_event": "0.5"}, "line 1: p_event '0.5' is not a probability from 0 to 1"),
        ({"p_event": True}, "line 1: p_event True is not a probability from 0 to 1"),
        (
            {"query_id": "2024-03-10-0099"},
            "line 1: unknown query_id '2024-03-10-0099' (not in round 2024-03-10's questions, whose ids are 2024-03-10-NNNN)",
        ),
        ({"answer": {"04": ["999"]}}, "line 1: answer['04']: code '999' is not a CAMEO level-2 code"),
    ],
)
def test_predictions_are_matched_strictly(published, change, expected):
    settings, store = published
    upload(store, "bad", [good_records(settings)[0] | change], at=manifest_mtime(store) + 60)
    record = sub.process(store, "bad", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "rejected" and record["reasons"] == [f"predictions.jsonl: {expected}"]


def test_a_nan_p_event_in_parquet_is_refused(published, tmp_path):
    settings, store = published
    frame = pl.DataFrame(
        {"query_id": question_ids(settings)[:2], "answer": ["[]", "[]"], "p_event": [0.2, float("nan")]}
    )
    directory = store.root / "submissions" / "pq"
    directory.mkdir(parents=True)
    frame.write_parquet(directory / "predictions.parquet")
    (directory / "submission.json").write_bytes(json.dumps(META).encode())
    record = sub.process(store, "pq", settings.dataset.data_dir, now=NOW)
    assert record["reasons"] == ["predictions.parquet: record 2: p_event nan is not a probability from 0 to 1"]


def test_live_metadata_is_checked_field_by_field(published):
    settings, store = published
    meta = META | {"round": "2024-02-30", "month": "2024-03", "contact": ""}
    del meta["model"]
    upload(store, "meta", good_records(settings), meta)
    record = sub.process(store, "meta", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "rejected"
    assert record["reasons"] == [
        "submission.json: unknown field 'month' (a live round's fields are model, knowledge_cutoff, contact, round, "
        "owner_key)",
        "submission.json: the field 'model' is missing",
        "submission.json: contact must be a non-empty string",
        "submission.json: round must be a day YYYY-MM-DD, got '2024-02-30'",
    ]


def test_a_round_not_published_yet_is_awaited_then_refused(published):
    settings, store = published
    upload(store, "early", good_records(settings), META | {"round": "2024-03-12"})
    found = sub.triage(store, settings.dataset.data_dir, now=datetime(2024, 3, 12, 23, tzinfo=UTC))
    assert "early" not in found.ready
    assert (
        "early: round 2024-03-12 is not published yet: waits for live_round 2024-03-12 "
        "(awaited until 2024-03-13T00:00:00+00:00)" in found.waiting
    )
    with pytest.raises(NotReady, match="round 2024-03-12 is not published yet"):
        sub.process(store, "early", settings.dataset.data_dir, now=datetime(2024, 3, 12, 23, tzinfo=UTC))
    assert "early" in sub.triage(store, settings.dataset.data_dir, now=datetime(2024, 3, 13, tzinfo=UTC)).ready
    record = sub.process(store, "early", settings.dataset.data_dir, now=datetime(2024, 3, 13, tzinfo=UTC))
    assert record["status"] == "rejected"
    assert record["reasons"] == ["round 2024-03-12 was never published (the published rounds are in live/index.json)"]
    assert store.stat("submissions/early/rejection.json") is not None


def test_a_copy_of_an_accepted_submission_is_refused(published):
    settings, store = published
    assert sub.process(store, "live-2024-03-10-frequency", settings.dataset.data_dir, now=NOW)["status"] == "accepted"
    copied = (store.root / "submissions" / "live-2024-03-10-frequency" / "predictions.jsonl").read_bytes()
    upload(store, "copycat", copied, at=manifest_mtime(store) + 60)
    record = sub.process(store, "copycat", settings.dataset.data_dir, now=NOW)
    assert (
        record["status"] == "rejected"
        and "already accepted for round 2024-03-10 as 'live-2024-03-10-frequency'" in (record["reasons"][0])
    )


def test_a_squatted_baseline_name_is_not_a_baseline(published, tmp_path):
    settings, store = published
    # Someone else's bytes under a baseline's name (uploaded before publication): accepted as an
    # ordinary submission, never marked as the baseline.
    other = tmp_path / "other"
    os.rename(store.root / "submissions" / "live-2024-03-10-recurrency", other)
    upload(store, "live-2024-03-10-recurrency", good_records(settings), at=manifest_mtime(store) + 60)
    record = sub.process(store, "live-2024-03-10-recurrency", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "accepted" and record["baseline"] is False


def test_late_refused_and_on_time_accepted_on_seaweedfs(tmp_path, s3_server, bucket, monkeypatch):
    monkeypatch.setenv("MIRAI_S3_ENDPOINT_URL", s3_server.endpoint)
    settings = live_settings(
        tmp_path / "data", release_uri=f"s3://{bucket}/mirai", s3_endpoint_url=s3_server.endpoint, s3_region="us-east-1"
    )
    write_days(settings, [*WINDOW, DAY, DAY + timedelta(days=1)], window_quads() + later_quads())
    store = open_store(settings.dataset, settings.network, settings.release)
    # Round D published one second before its deadline: on the store's clock, its deadline is one
    # second after its manifest landed. Round D + 1 published at 02:00: 22 hours after.
    publish_round(
        DAY, settings.dataset, settings.gdelt, settings.live, store, now=datetime(2024, 3, 10, 23, 59, 59, tzinfo=UTC)
    )
    publish_round(
        DAY + timedelta(days=1),
        settings.dataset,
        settings.gdelt,
        settings.live,
        store,
        now=datetime(2024, 3, 11, 2, tzinfo=UTC),
    )
    admin = s3_server.client()

    def put(name: str, day: str) -> None:
        ids = pl.read_parquet(settings.dataset.data_dir / "live" / day / "questions.parquet").get_column("query_id")
        body = "".join(json.dumps({"query_id": q, "answer": ["042"], "p_event": 0.25}) + "\n" for q in ids).encode()
        admin.put_object(Bucket=bucket, Key=f"mirai/submissions/{name}/predictions.jsonl", Body=body)
        meta = json.dumps(META | {"round": day}).encode()
        admin.put_object(Bucket=bucket, Key=f"mirai/submissions/{name}/submission.json", Body=meta)

    manifest = store.stat("live/rounds/2024-03-10/manifest.json")
    time.sleep(2.5)  # S3 times are whole seconds: two more make the upload late for round D
    put("tardy", "2024-03-10")
    put("prompt", "2024-03-11")
    record = sub.process(store, "tardy", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "rejected" and record["reasons"][0].startswith("late: ")
    assert record["deadline"] == (manifest.modified + timedelta(seconds=1)).isoformat()
    assert json.loads(store.get_bytes("submissions/tardy/rejection.json"))["reasons"] == record["reasons"]
    record = sub.process(store, "prompt", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "accepted" and record["round"] == "2024-03-11"
    assert store.stat("submissions/prompt/rejection.json") is None
    # The same forecast for round D + 1, its predictions uploaded in parts, on time: a store may
    # date such an object by when its upload began, so the round does not take it.
    put("parted", "2024-03-11")
    key = "mirai/submissions/parted/predictions.jsonl"
    body = admin.get_object(Bucket=bucket, Key=key)["Body"].read()
    upload = admin.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = admin.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=body)
    admin.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    )
    record = sub.process(store, "parted", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "rejected", record
    assert any(r.startswith("predictions.jsonl was uploaded in parts (multipart)") for r in record["reasons"])


def test_the_record_of_a_live_submission_is_where_the_pointer_says(published):
    settings, store = published
    sub.process(store, "live-2024-03-10-recurrency", settings.dataset.data_dir, now=NOW)
    pointer = Path(settings.dataset.data_dir) / "submissions" / "live-2024-03-10-recurrency" / "live.json"
    assert json.loads(pointer.read_bytes()) == {"round": "2024-03-10"}
    assert sub.read_live_record(settings.dataset.data_dir, "live-2024-03-10-recurrency")["status"] == "accepted"


def test_mirai_submit_checks_a_live_submission_against_the_published_round(published, tmp_path, capsys):
    settings, store = published
    preds, meta = tmp_path / "predictions.jsonl", tmp_path / "submission.json"
    meta.write_text(json.dumps(META))
    preds.write_text(json.dumps({"query_id": "2024-03-10-0099", "answer": []}) + "\n")
    assert main(["submit", str(preds), "--meta", str(meta), "--name", "cli", "--store", str(store.root)]) == 1
    assert "unknown query_id '2024-03-10-0099'" in capsys.readouterr().err
    assert store.stat("submissions/cli/submission.json") is None
    preds.write_text("".join(json.dumps(r) + "\n" for r in good_records(settings)))
    assert main(["submit", str(preds), "--meta", str(meta), "--name", "cli", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    # The deadline on the store's clock, which decides, and the published one beside it.
    assert "round 2024-03-10: accepted if the upload reaches the store before " in out
    assert "after the round's manifest.json reached the store; published deadline 2024-03-11T00:00:00+00:00)" in out
    # The replayed round's deadline is 19 hours after its manifest reached the store (just now).
    assert sub.process(store, "cli", settings.dataset.data_dir, now=NOW)["status"] == "accepted"
    meta.write_text(json.dumps(META | {"round": "2024-03-11"}))
    assert main(["submit", str(preds), "--meta", str(meta), "--name", "cli2", "--store", str(store.root)]) == 1
    assert "round 2024-03-11 is not published" in capsys.readouterr().err


def test_hostile_live_uploads_are_refused_without_reading_or_writing_outside(published, monkeypatch):
    settings, store = published
    # A round that is a path: refused in one line, nothing created outside the data directory's areas.
    upload(store, "path", good_records(settings), META | {"round": "../../../etc"})
    record = sub.process(store, "path", settings.dataset.data_dir, now=NOW)
    assert record["reasons"] == ["submission.json: round must be a day YYYY-MM-DD, got '../../../etc'"]
    assert sorted(p.name for p in (settings.dataset.data_dir / "live").iterdir()) == ["2024-03-10"]
    # Predictions over the cap: refused by their listed size, never read.
    monkeypatch.setattr(sub, "MAX_SUBMISSION_BYTES", 100)
    upload(store, "big", good_records(settings), at=manifest_mtime(store) + 60)
    read = store.get_bytes

    def get_bytes(key, limit=None):
        assert not key.endswith("predictions.jsonl"), f"{key} was read"
        return read(key, limit=limit)

    monkeypatch.setattr(store, "get_bytes", get_bytes)
    record = sub.process(store, "big", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "rejected" and "over the 100 cap; not read" in record["reasons"][0]


def test_a_submission_processed_after_the_round_is_resolved_is_refused_whatever_its_times(published):
    """Issue 30: on a store that dates a multipart upload by its start, one begun before the
    deadline and completed after the answers were published would carry an on-time timestamp.
    Once a target date is resolved, no submission to the round is accepted."""
    from pipeline.live.rounds import answers_file

    settings, store = published
    upload(store, "in-time-by-its-stamp", good_records(settings), at=manifest_mtime(store) + 3600)
    answers = answers_file(settings.dataset.data_dir, DAY, DAY + timedelta(days=1))
    answers.parent.mkdir(parents=True)
    answers.write_bytes(b"resolved")
    record = sub.process(store, "in-time-by-its-stamp", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "rejected"
    assert record["reasons"] == [
        f"round {DAY} is already resolved (answers for {DAY + timedelta(days=1)} are out): a submission processed "
        "after that is refused, whatever its objects' timestamps"
    ]


def test_an_owner_key_is_kept_only_as_its_sha256_and_a_bad_one_is_never_quoted(published):
    """docs/live.md, "Who a row belongs to": submission.json's optional owner_key."""
    settings, store = published
    key = "my-owner-key-0123456789"
    upload(store, "keyed", good_records(settings)[:2], META | {"owner_key": key}, at=manifest_mtime(store) + 60)
    record = sub.process(store, "keyed", settings.dataset.data_dir, now=NOW)
    assert record["status"] == "accepted" and record["owner_sha256"] == hashlib.sha256(key.encode()).hexdigest()
    stored = (settings.dataset.data_dir / "live" / "2024-03-10" / "submissions" / "keyed" / "record.json").read_text()
    assert key not in stored
    short = "short-secret"
    upload(store, "short-key", good_records(settings)[:2], META | {"owner_key": short}, at=manifest_mtime(store) + 60)
    refused = sub.process(store, "short-key", settings.dataset.data_dir, now=NOW)
    assert refused["status"] == "rejected" and refused["reasons"] == [
        "submission.json: owner_key must be 16 to 256 printable characters (not shown)"
    ]
    assert short not in json.dumps(refused) and short.encode() not in store.get_bytes(
        "submissions/short-key/rejection.json"
    )


def _submit_live(store, preds, meta, name, *extra) -> int:
    return main(["submit", str(preds), "--meta", str(meta), "--name", name, "--store", str(store.root), *extra])


def test_mirai_submit_refuses_locally_once_the_deadline_passed_and_warns_before(published, tmp_path, capsys):
    """docs/live.md, "Submitting": the deadline on the store's clock (19 h after the manifest reached
    it), against this machine's clock; past it, one line and nothing uploaded."""
    settings, store = published
    preds, meta = tmp_path / "predictions.jsonl", tmp_path / "submission.json"
    meta.write_text(json.dumps(META))
    preds.write_text("".join(json.dumps(r) + "\n" for r in good_records(settings)))
    manifest = store.root / "live" / "rounds" / "2024-03-10" / "manifest.json"
    landed = time.time() - 19 * 3600 - 120  # the store-time deadline passed two minutes ago
    os.utime(manifest, (landed, landed))
    assert _submit_live(store, preds, meta, "too-late", "--live", "2024-03-10") == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("mirai submit: error: round 2024-03-10: its deadline ")
    assert "ago by this machine's clock" in err[0] and "nothing was uploaded" in err[0]
    assert "the store's clock decides acceptance" in err[0]
    assert store.list_keys("submissions/too-late/", max_keys=10).keys == []
    # Ten minutes left: uploaded, with a warning (none when more than --warn-minutes are left).
    landed = time.time() - 19 * 3600 + 600
    os.utime(manifest, (landed, landed))
    assert _submit_live(store, preds, meta, "hurried", "--live", "2024-03-10") == 0
    captured = capsys.readouterr()
    assert re.search(r"^warning: round 2024-03-10: only 0:(09:5\d|10:00) left before its deadline ", captured.err, re.M)
    assert store.stat("submissions/hurried/submission.json") is not None
    assert _submit_live(store, preds, meta, "calm", "--live", "2024-03-10", "--warn-minutes", "5") == 0
    assert "warning" not in capsys.readouterr().err


def test_mirai_submit_live_must_name_the_round_of_submission_json(published, tmp_path, capsys):
    settings, store = published
    preds, meta = tmp_path / "predictions.jsonl", tmp_path / "submission.json"
    preds.write_text("".join(json.dumps(r) + "\n" for r in good_records(settings)))
    meta.write_text(json.dumps(META))
    assert _submit_live(store, preds, meta, "other", "--live", "2024-03-11") == 2
    assert f"--live 2024-03-11: {meta} names round 2024-03-10; nothing was uploaded" in capsys.readouterr().err
    meta.write_text(json.dumps({k: v for k, v in META.items() if k != "round"} | {"month": "2024-02"}))
    assert _submit_live(store, preds, meta, "other", "--live", "2024-03-10") != 0
    assert store.list_keys("submissions/other/", max_keys=10).keys == []


def test_mirai_submit_refuses_a_manifest_of_another_round(published, tmp_path, capsys):
    settings, store = published
    preds, meta = tmp_path / "predictions.jsonl", tmp_path / "submission.json"
    meta.write_text(json.dumps(META))
    preds.write_text("".join(json.dumps(r) + "\n" for r in good_records(settings)))
    manifest = store.root / "live" / "rounds" / "2024-03-10" / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"round": "2024-03-\x1b[2J09"}))
    assert _submit_live(store, preds, meta, "elsewhere", "--live", "2024-03-10") == 1
    err = capsys.readouterr().err
    assert "live/rounds/2024-03-10/manifest.json in " in err and "is not the manifest of round 2024-03-10" in err
    assert "\x1b" not in err and store.list_keys("submissions/elsewhere/", max_keys=10).keys == []


@pytest.mark.parametrize("deadline", ["soon", "2024-03-11T00:00:00", None])
def test_mirai_submit_refuses_a_manifest_whose_deadline_cannot_be_read(published, tmp_path, capsys, deadline):
    settings, store = published
    preds, meta = tmp_path / "predictions.jsonl", tmp_path / "submission.json"
    meta.write_text(json.dumps(META))
    preds.write_text("".join(json.dumps(r) + "\n" for r in good_records(settings)))
    manifest = store.root / "live" / "rounds" / "2024-03-10" / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"deadline": deadline}))
    assert _submit_live(store, preds, meta, "unclear", "--live", "2024-03-10") == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "mirai submit: error: round 2024-03-10: its manifest's deadline cannot be read; nothing was uploaded"
    ]
    assert store.list_keys("submissions/unclear/", max_keys=10).keys == []
