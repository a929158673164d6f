"""Submissions (pipeline/evaluation/submissions.py, `mirai submit`, the submission asset and
sensor): every refusal reason, the contaminated and duplicate cases, the size caps, hostile
uploads done for real in a local store and on SeaweedFS, and a round trip through the sensor."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.evaluations import evaluation, leaderboard
from assets.resources import resources_for
from assets.submissions import submission
from pipeline.cli import main
from pipeline.config import Settings
from pipeline.evaluation import submission_metadata
from pipeline.evaluation import submissions as sub
from pipeline.markdown import markdown_text
from pipeline.release.layout import UnsafeRelease
from pipeline.release.store import LocalStore
from pipeline.release.store_uri import open_store
from quality.submission_checks import submission_accepted
from sensors.evaluations import leaderboard_job
from sensors.submissions import submission_job, submission_sensor

from .settings_builder import make_settings
from .table_metadata import has_row
from .test_markdown import active_markdown, unescaped

GOLD = {
    "2024-01-00001": {"04": ["042"], "19": ["190"]},
    "2024-01-00002": {"01": ["010", "013"]},
    "2024-01-00003": {"17": ["173"]},
}
ANSWERS = {"2024-01-00001": {"04": ["042"]}, "2024-01-00002": {"01": ["010"]}, "2024-01-00003": {"17": ["172"]}}
META = {
    "model": "llama-3.1-8b-instruct",
    "knowledge_cutoff": "2023-12-01",
    "contact": "someone@example.org",
    "month": "2024-01",
    "query_set": "queries",
    "distance": 1,
    "rounds": 1,
    "api_mode": "native",
    "action_type": "code_block",
    "tokens_in": 1200,
    "tokens_out": 300,
    "cost_usd": 0.01,
}
RECORD_KEYS = {
    "format",
    "submission",
    "status",
    "reasons",
    "model",
    "knowledge_cutoff",
    "contact",
    "month",
    "query_set",
    "distance",
    "rounds",
    "api_mode",
    "action_type",
    "tokens_in",
    "tokens_out",
    "cost_usd",
    "predictions_sha256",
    "submitted_at",
    "scored_at",
    "scorecard",
}


def predictions(answers: dict = ANSWERS) -> bytes:
    return "".join(json.dumps({"query_id": q, "answer": a}) + "\n" for q, a in answers.items()).encode()


def write_split(data_dir: Path, month: str = "2024-01") -> None:
    directory = data_dir / "splits" / month
    directory.mkdir(parents=True)
    queries = pl.DataFrame({"query_id": list(GOLD), "answer_dict": [json.dumps(a) for a in GOLD.values()]})
    queries.write_parquet(directory / "queries.parquet")
    queries.head(2).write_parquet(directory / "queries_sample.parquet")


@pytest.fixture
def data_dir(tmp_path) -> Path:
    write_split(tmp_path / "data")
    return tmp_path / "data"


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "bucket")


def upload(store: LocalStore, name: str, meta: dict | bytes | None = META, data: bytes | None = b"", file="jsonl"):
    """Files written straight into the local store's directory, as a submitter with write access
    to it could (no check on the way in). ``data`` b"" is the good predictions; None writes none."""
    directory = store.root / "submissions" / name
    directory.mkdir(parents=True, exist_ok=True)
    if data is not None:
        (directory / f"predictions.{file}").write_bytes(data or predictions())
    if meta is not None:
        (directory / "submission.json").write_bytes(meta if isinstance(meta, bytes) else json.dumps(meta).encode())
    return directory


def rejection(store: LocalStore, name: str) -> dict:
    return json.loads((store.root / "submissions" / name / "rejection.json").read_bytes())


def one_line(reasons: list[str]) -> bool:
    return all(reasons) and not any("\n" in r for r in reasons)


# --- metadata ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"model": None}, "model must be a non-empty string"),
        ({"model": "  "}, "model must be a non-empty string"),
        ({"model": "m" * 201}, "model is longer than 200 characters"),
        ({"contact": "a\x1bb"}, "contact contains a control character"),
        ({"knowledge_cutoff": "2023-10"}, "knowledge_cutoff must be a date YYYY-MM-DD"),
        ({"knowledge_cutoff": "2023-02-30"}, "knowledge_cutoff is not a real date"),
        ({"knowledge_cutoff": 20231031}, "knowledge_cutoff must be a date YYYY-MM-DD"),
        ({"month": "2024-13"}, "month must be a month YYYY-MM"),
        ({"month": "../../etc"}, "month must be a month YYYY-MM"),
        ({"query_set": "all"}, "query_set must be one of queries, queries_sample"),
        ({"distance": 0}, "distance must be a whole number from 1 to 365"),
        ({"distance": True}, "distance must be a whole number from 1 to 365"),
        ({"distance": 1.0}, "distance must be a whole number from 1 to 365"),
        ({"rounds": 10**6}, "rounds must be a whole number from 1 to 100"),
        ({"api_mode": "python"}, "api_mode must be one of native, mirai"),
        ({"action_type": ["code_block"]}, "action_type must be one of single_function, code_block, none"),
        ({"tokens_in": -1}, "tokens_in must be a whole number from 0"),
        ({"tokens_out": "300"}, "tokens_out must be a whole number from 0"),
        ({"cost_usd": float("inf")}, "cost_usd must be null or a number of dollars"),
        ({"cost_usd": -0.5}, "cost_usd must be null or a number of dollars"),
        ({"extra": {"nested": [1]}}, "unknown field 'extra'"),
    ],
)
def test_each_metadata_problem_is_one_line_naming_the_field(change, expected):
    meta = {**META, **change}
    parsed, _, problems = submission_metadata.parse_metadata(json.dumps(meta).encode())
    assert parsed is None
    assert any(expected in p for p in problems), problems
    assert one_line(problems)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"{", "is not valid JSON"),
        (b"\xff\xfe{}", "is not UTF-8 text"),
        (b"[" * 8000 + b"]" * 8000, "nested too deeply"),
        (b'"a string"', "is not a JSON object but str"),
        (b'{"model": "a", "model": "b"}', "the field 'model' appears twice"),
        (b" " * (submission_metadata.MAX_METADATA_BYTES + 1), "larger than 16,384 bytes"),
        (json.dumps({k: v for k, v in META.items() if k != "month"}).encode(), "the field 'month' is missing"),
    ],
)
def test_malformed_metadata_is_refused_in_one_line(raw, expected):
    parsed, _, problems = submission_metadata.parse_metadata(raw)
    assert parsed is None and one_line(problems)
    assert any(expected in p for p in problems), problems


def test_optional_costs_may_be_absent_or_null():
    bare = {k: v for k, v in META.items() if k not in submission_metadata.OPTIONAL_FIELDS}
    meta, _, problems = submission_metadata.parse_metadata(json.dumps({**bare, "cost_usd": None}).encode())
    assert problems == [] and meta.tokens_in is None and meta.cost_usd is None


# --- processing ---------------------------------------------------------------------------------


def test_a_good_submission_is_scored_and_recorded_in_the_shared_format(store, data_dir):
    upload(store, "good-1")
    record = sub.process(store, "good-1", data_dir)
    stored = json.loads((data_dir / "submissions" / "good-1" / "record.json").read_bytes())
    assert stored == record and set(record) == RECORD_KEYS
    assert record["format"] == "mirai-submission-record-v1"
    assert (record["status"], record["reasons"]) == ("scored", [])
    assert record["model"] == META["model"] and record["cost_usd"] == 0.01 and record["distance"] == 1
    card = record["scorecard"]
    assert card["format"] == "mirai-scorecard-v1" and card["mode"] == "strict" and card["queries"] == 3
    assert card["predictions_sha256"] == record["predictions_sha256"]
    assert 0 < card["metrics"]["level2_f1"]["value"] < 100
    datetime.fromisoformat(record["submitted_at"]), datetime.fromisoformat(record["scored_at"])
    assert not (store.root / "submissions" / "good-1" / "rejection.json").exists()
    # A re-run returns the record unchanged and scores nothing again.
    os.utime(data_dir / "submissions" / "good-1" / "record.json", (0, 0))
    assert sub.process(store, "good-1", data_dir) == record
    assert (data_dir / "submissions" / "good-1" / "record.json").stat().st_mtime == 0


@pytest.mark.parametrize("file", ["csv", "parquet"])
def test_csv_and_parquet_predictions_score_as_jsonl(store, data_dir, tmp_path, file):
    upload(store, "as-jsonl")
    table = pl.DataFrame({"query_id": list(ANSWERS), "answer": [json.dumps(a) for a in ANSWERS.values()]})
    path = tmp_path / f"p.{file}"
    table.write_csv(path) if file == "csv" else table.write_parquet(path)
    upload(store, f"as-{file}", META, path.read_bytes(), file)
    jsonl = sub.process(store, "as-jsonl", data_dir)["scorecard"]["metrics"]
    other = sub.process(store, f"as-{file}", data_dir)
    assert other["status"] == "scored" and other["scorecard"]["metrics"] == jsonl


def test_the_sample_query_set_scores_against_queries_sample(store, data_dir):
    upload(store, "sample", {**META, "query_set": "queries_sample"}, predictions(dict(list(ANSWERS.items())[:2])))
    record = sub.process(store, "sample", data_dir)
    assert record["status"] == "scored" and record["scorecard"]["split"]["query_set"] == "queries_sample"


@pytest.mark.parametrize("cutoff", ["2024-01-01", "2024-01-31", "2025-06-30"])
def test_a_cutoff_not_before_the_month_is_scored_but_contaminated(store, data_dir, cutoff):
    upload(store, "late", {**META, "knowledge_cutoff": cutoff})
    record = sub.process(store, "late", data_dir)
    assert record["status"] == "contaminated" and record["scorecard"] is not None
    assert record["reasons"] == [
        f"contaminated: knowledge cutoff {cutoff} is not before 2024-01-01: the model may have seen 2024-01's "
        "events, so it is scored and shown, never ranked"
    ]
    assert not (store.root / "submissions" / "late" / "rejection.json").exists()


def test_the_day_before_the_month_is_still_rankable(store, data_dir):
    upload(store, "edge", {**META, "knowledge_cutoff": "2023-12-31"})
    assert sub.process(store, "edge", data_dir)["status"] == "scored"


def test_an_identical_file_is_not_scored_twice(store, data_dir):
    upload(store, "first")
    upload(store, "again")
    upload(store, "other-distance", {**META, "distance": 7})
    assert sub.process(store, "first", data_dir)["status"] == "scored"
    again = sub.process(store, "again", data_dir)
    assert again["status"] == "rejected" and again["scorecard"] is None
    assert "already scored as submission 'first'" in again["reasons"][0]
    assert again["predictions_sha256"] == sub.read_record(data_dir, "first")["predictions_sha256"]
    assert rejection(store, "again")["reasons"] == again["reasons"]
    # The same file for another distance is another submission.
    assert sub.process(store, "other-distance", data_dir)["status"] == "scored"


def test_a_rejected_submission_gets_a_rejection_file_and_a_record(store, data_dir):
    upload(store, "bad-meta", {**META, "distance": 0, "api_mode": "x"})
    record = sub.process(store, "bad-meta", data_dir)
    assert record["status"] == "rejected" and set(record) == RECORD_KEYS and one_line(record["reasons"])
    assert record["distance"] is None and record["model"] == META["model"]  # what held is kept
    assert len(record["reasons"]) == 2
    found = rejection(store, "bad-meta")
    assert found["format"] == "mirai-submission-rejection-v1" and found["reasons"] == record["reasons"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"query_id": "2024-01-00001", "answer": {"04": ["042"]}}\n{\n', "predictions.jsonl: line 2: not JSON"),
        (b'{"query_id": "2024-99-00001", "answer": {}}\n', "unknown query_id"),
        (b'{"query_id": "2024-01-00001", "answer": {"04": ["190"]}}\n', "190"),
        (b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_predictions_strict_scoring_refuses(store, data_dir, data, expected):
    upload(store, "strict", META, data)
    record = sub.process(store, "strict", data_dir)
    assert record["status"] == "rejected" and one_line(record["reasons"])
    assert any(expected in r for r in record["reasons"]), record["reasons"]
    assert str(store.root) not in " ".join(record["reasons"]) and "/tmp" not in " ".join(record["reasons"])


def test_half_uploads_are_refused_or_waited_for(store, data_dir):
    upload(store, "meta-only", META, None)
    record = sub.process(store, "meta-only", data_dir)
    assert record["status"] == "rejected" and "half-uploaded: no predictions file" in record["reasons"][0]

    directory = upload(store, "preds-only", None, predictions())
    found = sub.triage(store, data_dir)
    assert "preds-only" not in found.ready and any(
        w.startswith("preds-only: upload in progress") for w in found.waiting
    )
    with pytest.raises(sub.NotReady):
        sub.process(store, "preds-only", data_dir)
    assert sub.read_record(data_dir, "preds-only") is None
    two_hours_ago = (datetime.now(UTC) - timedelta(hours=2)).timestamp()
    os.utime(directory / "predictions.jsonl", (two_hours_ago, two_hours_ago))
    assert "preds-only" in sub.triage(store, data_dir).ready
    record = sub.process(store, "preds-only", data_dir)
    assert record["status"] == "rejected" and "half-uploaded: no submission.json" in record["reasons"][0]


def test_oversized_uploads_are_refused_by_their_listed_size_without_being_read(store, data_dir):
    directory = upload(store, "huge", META)
    # Sparse: the size is real, the disk blocks are not; then unreadable, so a read would fail
    # with another message (root reads it anyway: the reason's "not read" is checked too).
    with open(directory / "predictions.jsonl", "r+b") as fh:
        fh.truncate(sub.MAX_SUBMISSION_BYTES + 1)
    record = sub.process(store, "huge", data_dir)
    assert record["status"] == "rejected"
    assert record["reasons"] == [
        f"predictions.jsonl is {sub.MAX_SUBMISSION_BYTES + 1:,} bytes, over the 67,108,864 cap; not read"
    ]

    big_meta = upload(
        store, "big-meta", json.dumps({**META, "model": "m"}).encode() + b" " * submission_metadata.MAX_METADATA_BYTES
    )
    record = sub.process(store, "big-meta", data_dir)
    assert record["status"] == "rejected" and "bytes, over the 16,384 cap" in record["reasons"][0]
    assert (big_meta / "rejection.json").exists()


def test_get_bytes_refuses_past_its_limit_on_a_local_store(store):
    upload(store, "grown", META)
    with pytest.raises(UnsafeRelease, match="is over 10 bytes"):
        store.get_bytes("submissions/grown/predictions.jsonl", limit=10)


def test_hostile_local_uploads_are_refused_and_nothing_outside_is_touched(store, data_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not for submitters")
    # A link to a file outside, and a link standing in for the whole submission directory.
    link = upload(store, "link-file", META, None)
    (link / "predictions.jsonl").symlink_to(outside / "secret")
    (store.root / "submissions" / "link-dir").symlink_to(outside, target_is_directory=True)
    # A FIFO would block a reader forever; an unexpected file; two predictions files.
    fifo = upload(store, "fifo", META, None)
    os.mkfifo(fifo / "predictions.jsonl")
    upload(store, "extra", META)
    (store.root / "submissions" / "extra" / "run.sh").write_text("rm -rf /")
    upload(store, "two", META)
    (store.root / "submissions" / "two" / "predictions.csv").write_text("query_id,answer\n")
    # Names no submission may have, one not even UTF-8.
    (store.root / "submissions" / "bad name").mkdir()
    (store.root / "submissions" / "bad name" / "submission.json").write_text("{}")
    undecodable = os.path.join(os.fsencode(store.root / "submissions"), b"\xff\xfe")
    os.mkdir(undecodable)
    Path(os.fsdecode(undecodable), "submission.json").write_text("{}")
    upload(store, "good", META)

    found = sub.triage(store, data_dir)
    assert sorted(found.ready) == ["extra", "fifo", "good", "link-dir", "link-file", "two"]
    assert len(found.stray) == 2 and one_line(found.stray)
    assert any("'submissions/bad name/submission.json'" in s for s in found.stray)
    statuses = {name: sub.process(store, name, data_dir) for name in found.ready}
    assert statuses.pop("good")["status"] == "scored"
    reasons = {name: r["reasons"] for name, r in statuses.items()}
    assert all(r["status"] == "rejected" and one_line(r["reasons"]) for r in statuses.values())
    assert "'predictions.jsonl' is a symbolic link" in reasons["link-file"]
    assert "'predictions.jsonl' is not a regular file" in reasons["fifo"]
    assert any("unexpected object 'run.sh'" in r for r in reasons["extra"])
    assert "more than one predictions file: predictions.jsonl, predictions.csv" in reasons["two"]
    assert "'' is a symbolic link" in reasons["link-dir"]
    assert any("rejection.json could not be written" in r and "link out of the store" in r for r in reasons["link-dir"])
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]  # no rejection.json written through the link
    # Refused ones are never looked at again.
    assert sub.triage(store, data_dir).ready == {}


def test_a_submissions_area_that_is_a_link_is_not_entered(store, data_dir, tmp_path):
    outside = tmp_path / "outside"
    upload(LocalStore(outside), "planted")
    store.root.mkdir()
    (store.root / "submissions").symlink_to(outside / "submissions", target_is_directory=True)
    found = sub.triage(store, data_dir)
    assert found.ready == {} and found.stray == ["'submissions' is a symbolic link: nothing under it is read"]
    with pytest.raises(UnsafeRelease, match="link out of the store"):
        sub.process(store, "planted", data_dir)
    assert sorted(p.name for p in (outside / "submissions" / "planted").iterdir()) == [
        "predictions.jsonl",
        "submission.json",
    ]


def test_a_month_without_a_split_waits(store, data_dir):
    upload(store, "future", {**META, "month": "2024-02"})
    found = sub.triage(store, data_dir)
    assert found.ready == {} and found.waiting == [
        "future: no split for 2024-02 yet: waits for test_split 2024-02-01 (scored once it is built)"
    ]
    with pytest.raises(sub.NotReady, match="no split for 2024-02 yet"):
        sub.process(store, "future", data_dir)
    assert sub.read_record(data_dir, "future") is None
    write_split(data_dir, "2024-02")
    assert list(sub.triage(store, data_dir).ready) == ["future"]


def test_the_listing_pages_through_in_key_order(store, data_dir):
    names = [f"s{i}" for i in range(5)]
    for name in names:
        upload(store, name)
    seen, after = [], ""
    for _ in range(10):
        found = sub.triage(store, data_dir, start_after=after, max_keys=3)
        seen += list(found.ready)
        after = found.next_after
        if not after:
            break
    assert sorted(seen) == names and len(seen) == len(set(seen))


# --- mirai submit -------------------------------------------------------------------------------


@pytest.fixture
def submit_files(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("MIRAI_DATA_DIR", str(data_dir))
    monkeypatch.delenv("MIRAI_RELEASE_URI", raising=False)
    (tmp_path / "p.jsonl").write_bytes(predictions())
    (tmp_path / "submission.json").write_text(json.dumps(META))
    return tmp_path / "p.jsonl", tmp_path / "submission.json"


def test_submit_uploads_a_checked_submission_and_never_overwrites_a_name(submit_files, tmp_path, capsys):
    preds, meta = submit_files
    bucket = tmp_path / "cli-bucket"
    argv = ["submit", str(preds), "--meta", str(meta), "--name", "mine", "--store", str(bucket)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| level2_f1 |" in out and "submitted 'mine'" in out
    assert sorted(p.name for p in (bucket / "submissions" / "mine").iterdir()) == [
        "predictions.jsonl",
        "submission.json",
    ]
    assert main(argv) == 1
    assert "the submission name 'mine' is taken" in capsys.readouterr().err


def test_submit_without_a_local_split_uploads_and_says_it_was_not_scored_here(submit_files, tmp_path, capsys):
    preds, meta = submit_files
    meta.write_text(json.dumps({**META, "month": "2024-02"}))
    bucket = tmp_path / "cli-bucket"
    assert main(["submit", str(preds), "--meta", str(meta), "--name", "feb", "--store", str(bucket)]) == 0
    assert "not scored here (no split for 2024-02" in capsys.readouterr().err
    assert (bucket / "submissions" / "feb" / "submission.json").is_file()


@pytest.mark.parametrize(
    ("meta", "data", "name", "expected"),
    [
        ({**META, "rounds": 0}, predictions(), "ok", "rounds must be a whole number"),
        (META, predictions(), "../escape", "the name '../escape' is not letters"),
        (META, b'{"query_id": "nope", "answer": {}}\n', "ok", "unknown query_id"),
    ],
)
def test_submit_refuses_before_uploading_anything(submit_files, tmp_path, capsys, meta, data, name, expected):
    preds, meta_path = submit_files
    meta_path.write_text(json.dumps(meta))
    preds.write_bytes(data)
    bucket = tmp_path / "cli-bucket"
    assert main(["submit", str(preds), "--meta", str(meta_path), "--name", name, "--store", str(bucket)]) == 1
    assert expected in capsys.readouterr().err
    assert not (bucket / "submissions").exists() or not any((bucket / "submissions").iterdir())


# --- through Dagster, on SeaweedFS ----------------------------------------------------------------


@pytest.fixture
def bucket(bucket, s3_server, monkeypatch) -> str:
    """conftest's fresh bucket, with the pipeline's settings pointing at the server."""
    monkeypatch.setenv("MIRAI_S3_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("MIRAI_S3_REGION", "us-east-1")
    return bucket


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None):
    with dg.build_sensor_context(
        instance=instance,
        instance_ref=instance.get_ref(),
        cursor=cursor,
        definitions=defs,
        resources={key: defs.resources[key] for key in ("dataset", "network", "release_store")},
    ) as context:
        data = submission_sensor.evaluate_tick(context)
    for request in data.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return data


def test_round_trip_on_seaweedfs_through_the_sensor(s3_server, bucket, data_dir, submit_files, capsys, monkeypatch):
    # The predictions cap lowered to 1 MiB so that the oversized upload is 2 MiB, not 64 (the
    # real cap is exercised on a local store above); the check is the same code.
    monkeypatch.setattr(sub, "MAX_SUBMISSION_BYTES", 2**20)
    uri = f"s3://{bucket}/mirai/v1"
    preds, meta = submit_files
    assert main(["submit", str(preds), "--meta", str(meta), "--name", "good", "--store", uri]) == 0
    capsys.readouterr()
    # Hostile uploads straight to the bucket: deep JSON metadata, an oversized predictions file
    # (never fetched), and keys no submission may have.
    admin, prefix = s3_server.client(), "mirai/v1/submissions"
    admin.put_object(Bucket=bucket, Key=f"{prefix}/deep/predictions.jsonl", Body=predictions())
    admin.put_object(Bucket=bucket, Key=f"{prefix}/deep/submission.json", Body=b"[" * 10000)
    admin.put_object(Bucket=bucket, Key=f"{prefix}/huge/predictions.csv", Body=b"x" * 2**21)
    admin.put_object(Bucket=bucket, Key=f"{prefix}/huge/submission.json", Body=json.dumps(META).encode())
    admin.put_object(Bucket=bucket, Key=f"{prefix}/.hidden/submission.json", Body=b"{}")
    admin.put_object(Bucket=bucket, Key=f"{prefix}/bad name/submission.json", Body=b"{}")
    admin.put_object(Bucket=bucket, Key=f"{prefix}/a/b/c/submission.json", Body=b"{}")

    resources = resources_for(
        make_settings(data_dir=str(data_dir), release_uri=uri, s3_endpoint_url=s3_server.endpoint)
    )
    defs = dg.Definitions(
        assets=[submission, evaluation, leaderboard],
        jobs=[submission_job, leaderboard_job],
        sensors=[submission_sensor],
        resources=resources,
    )
    with dg.instance_for_test() as instance:
        data = tick(defs, instance, None)
        assert sorted(r.partition_key for r in data.run_requests) == ["a", "deep", "good", "huge"]
        assert all(r.run_key.startswith(f"submission:{r.partition_key}:") for r in data.run_requests)
        assert sorted(instance.get_dynamic_partitions("submissions")) == ["a", "deep", "good", "huge"]
        job = defs.resolve_job_def(submission_job.name)
        for request in data.run_requests:
            result = job.execute_in_process(instance=instance, partition_key=request.partition_key, tags=request.tags)
            assert result.success
        meta_of = {
            r.partition_key: r.asset_materialization.metadata
            for r in instance.fetch_materializations(submission.key, limit=10).records
        }
        good = meta_of["good"]
        assert good["status"].value == "scored" and has_row(good["scorecard"], metric="level2_f1")
        assert 0 < good["level2_f1"].value < 100
        assert meta_of["deep"]["status"].value == "rejected" and "nested too deeply" in meta_of["deep"]["reasons"].value
        assert (
            "predictions.csv is 2,097,152 bytes, over the 1,048,576 cap; not read" in meta_of["huge"]["reasons"].value
        )
        assert "unexpected object 'b/c/submission.json'" in meta_of["a"]["reasons"].value
        settings = _settings(data_dir, uri, s3_server)
        store = open_store(settings.dataset, settings.network, settings.release)
        for name in ("deep", "huge", "a"):
            assert json.loads(store.get_bytes(f"submissions/{name}/rejection.json"))["submission"] == name
        assert store.stat("submissions/good/rejection.json") is None
        assert sub.read_record(data_dir, "good")["scorecard"]["queries"] == 3

        # The next tick rescored nothing: it asks for the leaderboard once, then nothing.
        again = tick(defs, instance, data.cursor)
        assert [r.job_name for r in again.run_requests] == [leaderboard_job.name]
        assert tick(defs, instance, again.cursor).run_requests == []

    # The S3 listing pages in key order, as the local one: two keys at a time reach every key once.
    everything = store.list_keys("submissions/", max_keys=100).keys
    paged, after = [], ""
    while True:
        page = store.list_keys("submissions/", max_keys=2, start_after=after)
        paged += page.keys
        if not page.truncated:
            break
        after = page.keys[-1].key
    assert [k.key for k in paged] == [k.key for k in everything] == sorted(k.key for k in everything)
    assert len(everything) == 12  # the 4 uploads' 7 objects, 3 rejections, 2 keys under invalid names


def _settings(data_dir: Path, uri: str, server) -> Settings:
    return make_settings(data_dir=data_dir, release_uri=uri, s3_endpoint_url=server.endpoint, s3_region="us-east-1")


def test_a_rejected_submission_fails_its_check_in_the_scoring_run_with_the_reason_escaped(store, data_dir):
    """The submission_scoring run that refuses a submission succeeds (refusing is the pipeline
    working), and its submission_accepted check warns with the reason, inert Markdown; a scored
    submission passes it."""
    hostile = "<img src=x onerror=alert(1)> *x*"
    upload(store, "good")
    (upload(store, "bad") / hostile).write_bytes(b"{}")  # a submitter names the files it uploads
    defs = dg.Definitions(
        assets=[submission],
        asset_checks=[submission_accepted],
        jobs=[submission_job],
        resources=resources_for(make_settings(data_dir=str(data_dir), release_uri=str(store.root))),
    )
    with dg.instance_for_test() as instance:
        # Resolved inside the block: resolving reads the current instance's definitions state, and
        # outside one it can find a closed instance that an earlier test of the worker left current.
        job = defs.resolve_job_def(submission_job.name)
        instance.add_dynamic_partitions("submissions", ["good", "bad"])
        runs = {name: job.execute_in_process(instance=instance, partition_key=name) for name in ("good", "bad")}
        # A run's result reads its events from the instance: inside the block, while it is open.
        assert all(run.success for run in runs.values())
        (good,) = runs["good"].get_asset_check_evaluations()
        (bad,) = runs["bad"].get_asset_check_evaluations()
    assert good.passed and good.metadata["status"].value == "scored"
    assert not bad.passed and bad.severity == dg.AssetCheckSeverity.WARN
    (reason,) = sub.read_record(data_dir, "bad")["reasons"]
    assert bad.description == f"rejected: {markdown_text(reason)}" and hostile in reason
    assert active_markdown(bad.description) == [] and unescaped(bad.description) == f"rejected: {reason}"


def test_every_monthly_outcome_has_a_public_status_without_the_contact(store, data_dir, capsys):
    """releases/status/<name>.json (public-read, unlike submissions/): the verdict, the reasons and
    the scorecard's headline, never the contact; `mirai status NAME` prints it, and a hostile
    store's status is refused or shown with its controls visible."""
    upload(store, "good-1")
    upload(store, "late", {**META, "knowledge_cutoff": "2024-01-01"}, predictions({**ANSWERS, "2024-01-00003": {}}))
    upload(store, "bad", {**META, "distance": 0})
    for name in ("good-1", "late", "bad"):
        sub.process(store, name, data_dir)
        raw = store.get_bytes(f"releases/status/{name}.json")
        assert raw is not None and META["contact"].encode() not in raw, name
    assert main(["status", "good-1", "--from", str(store.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "good-1: scored for 2024-01 (model llama-3.1-8b-instruct, queries, distance 1)"
    assert out[2].startswith("  scored over 3 queries (0 not answered): level2_f1 ") and "(95% intervals)" in out[2]
    assert main(["status", "late", "--from", str(store.root)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("  never ranked: the knowledge cutoff")
    assert main(["status", "bad", "--from", str(store.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bad: rejected for 2024-01") and out[2].startswith("  refused: ") and len(out) == 3
    # A record made by a run that stopped before its status: the next look publishes it.
    (store.root / "releases" / "status" / "good-1.json").unlink()
    sub.process(store, "good-1", data_dir)
    assert store.get_bytes("releases/status/good-1.json") is not None
    # Neither kind of status: one line, exit 1.
    assert main(["status", "nobody", "--from", str(store.root)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no status for 'nobody' at " in err and "releases/status/nobody.json" in err
    path = store.root / "releases" / "status" / "bad.json"
    hostile = json.loads(path.read_bytes()) | {"model": "x\x1b]0;owned\x07\u202e"}
    path.write_text(json.dumps(hostile))
    assert main(["status", "bad", "--from", str(store.root)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\u202e" not in shown and "x<U+001B>]0;owned<U+0007><U+202E>" in shown
    path.write_text(json.dumps(hostile | {"submission": "good-1"}))
    assert main(["status", "bad", "--from", str(store.root)]) == 1
    assert "is not the mirai-submission-status-v1 status of 'bad'; refused" in capsys.readouterr().err
