"""`mirai live list` and `mirai live questions D` (pipeline/cli/live.py, pipeline/live/participate.py):
the published rounds read from live/index.json, open or closed on the store's clock, and a round's
questions fetched and verified against its manifest (itself against the index), on SeaweedFS and on
a local store whose index, manifest or questions were tampered with."""

from __future__ import annotations

import hashlib
import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.cli import main
from pipeline.live.publication import publish_round, write_live_index
from pipeline.release.store import LocalStore
from pipeline.release.store_uri import open_store

from .month_builder import write_days
from .test_live_rounds import DAY, WINDOW, later_quads, live_settings, window_quads

NEXT = DAY + timedelta(days=1)


def _publish(settings, store) -> None:
    """Round D one second before its deadline (on the store's clock its deadline is one second after
    its manifest landed), round D + 1 at 02:00 (22 hours after)."""
    write_days(settings, [*WINDOW, DAY, NEXT], window_quads() + later_quads())
    last_second = datetime(2024, 3, 10, 23, 59, 59, tzinfo=UTC)
    publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=last_second)
    publish_round(
        NEXT, settings.dataset, settings.gdelt, settings.live, store, now=datetime(2024, 3, 11, 2, tzinfo=UTC)
    )


def test_live_list_and_questions_on_seaweedfs(tmp_path, s3_server, bucket, monkeypatch, capsys):
    monkeypatch.setenv("MIRAI_S3_ENDPOINT_URL", s3_server.endpoint)
    uri = f"s3://{bucket}/mirai"
    settings = live_settings(
        tmp_path / "data", release_uri=uri, s3_endpoint_url=s3_server.endpoint, s3_region="us-east-1"
    )
    store = open_store(settings.dataset, settings.network, settings.release)
    _publish(settings, store)
    time.sleep(2.5)  # S3 times are whole seconds: round D's deadline is then past
    assert main(["live", "list", "--from", uri, "--signed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["round", "deadline", "(published)", "target", "dates", "status"]
    assert lines[1].startswith("2024-03-11  2024-03-12T00:00:00+00:00  2024-03-12, 2024-03-18  open until ")
    assert re.search(r"\(store time; 21:5\d:\d\d left\)$", lines[1])
    assert lines[2].startswith("2024-03-10  2024-03-11T00:00:00+00:00  2024-03-11, 2024-03-17  closed at ")
    assert lines[3] == f"1 open, 1 closed (the 2 newest rounds at {store.description})"
    assert main(["live", "list", "--from", uri, "--signed", "--last", "1"]) == 0
    assert "1 open, 0 closed" in capsys.readouterr().out
    # The questions, verified: printed as published, or written to a file.
    published = store.get_bytes("live/rounds/2024-03-11/questions.jsonl")
    assert main(["live", "questions", "2024-03-11", "--from", uri, "--signed"]) == 0
    captured = capsys.readouterr()
    assert captured.out.encode() == published
    assert (
        captured.err.startswith("round 2024-03-11: ") and "(sha256 verified), history cutoff 2024-03-10" in captured.err
    )
    # The deadline acceptance uses (the store's clock), then the published one.
    assert "store time (published deadline 2024-03-12T00:00:00+00:00)" in captured.err, captured.err
    out = tmp_path / "q" / "questions.jsonl"
    out.parent.mkdir()
    assert main(["live", "questions", "2024-03-11", "--from", uri, "--signed", "--out", str(out)]) == 0
    assert out.read_bytes() == published
    assert main(["live", "questions", "2024-03-09", "--from", uri, "--signed"]) == 1
    err = capsys.readouterr().err
    assert "round 2024-03-09 is not published" in err and "newest published: 2024-03-11, 2024-03-10" in err


@pytest.fixture
def local(tmp_path):
    settings = live_settings(tmp_path / "data")
    store = LocalStore(tmp_path / "bucket")
    _publish(settings, store)
    return store


def test_a_resolved_round_is_closed_without_reading_its_manifest(local, capsys):
    store = local
    store.put_bytes(
        "live/rounds/2024-03-11/answers-2024-03-12.jsonl", b"{}\n", cache_control="no-cache", if_absent=True
    )
    write_live_index(store)
    (store.root / "live" / "rounds" / "2024-03-11" / "manifest.json").write_bytes(b"changed")  # never read
    assert main(["live", "list", "--from", str(store.root)]) == 0
    assert "2024-03-12, 2024-03-18  closed (resolved: 2024-03-12)\n" in capsys.readouterr().out


def test_tampered_questions_or_manifest_are_refused_and_nothing_kept(local, tmp_path, capsys):
    store = local
    questions = store.root / "live" / "rounds" / "2024-03-11" / "questions.jsonl"
    good = questions.read_bytes()
    questions.write_bytes(good.replace(b"2024-03-11-0001", b"2024-03-11-9999"))
    out = tmp_path / "questions.jsonl"
    assert main(["live", "questions", "2024-03-11", "--from", str(store.root), "--out", str(out)]) == 3
    assert capsys.readouterr().err.startswith("checksum mismatch: live/rounds/2024-03-11/questions.jsonl: got ")
    assert not out.exists() and list(tmp_path.glob(".questions.jsonl*")) == []
    assert main(["live", "questions", "2024-03-11", "--from", str(store.root)]) == 3
    assert capsys.readouterr().out == ""
    questions.write_bytes(good)
    manifest = store.root / "live" / "rounds" / "2024-03-11" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"2024-03-18"', b'"2024-03-19"'))
    assert main(["live", "questions", "2024-03-11", "--from", str(store.root)]) == 3
    assert "manifest.json has sha256 " in capsys.readouterr().err
    assert main(["live", "list", "--from", str(store.root)]) == 3
    assert "manifest.json has sha256 " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (b"not json", "is not valid JSON"),
        (json.dumps({"format": "other", "rounds": []}).encode(), "is not a mirai-live-index-v1 index"),
        (
            json.dumps({"format": "mirai-live-index-v1", "rounds": [{"round": "2024-03-11\x1b[2J"}]}).encode(),
            "has an entry that is not a round YYYY-MM-DD",
        ),
        (
            json.dumps(
                {
                    "format": "mirai-live-index-v1",
                    "rounds": [
                        {"round": "2024-03-11", "manifest_sha256": "0" * 64, "deadline": "soon", "target_dates": []}
                    ],
                }
            ).encode(),
            "round 2024-03-11 has the deadline 'soon'",
        ),
    ],
)
def test_a_hostile_index_is_one_line(local, capsys, index, expected):
    store = local
    (store.root / "live" / "index.json").write_bytes(index)
    assert main(["live", "list", "--from", str(store.root)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mirai live list: error: ") and expected in err
    assert "\x1b" not in err


def test_printed_questions_show_hidden_characters_a_store_put_in(local, capsys):
    """A store that rewrote the questions, manifest and index consistently passes the checksums; a
    bidi override in a name is still shown as <U+202E>, never sent to the terminal."""
    store = local
    folder = store.root / "live" / "rounds" / "2024-03-11"
    data = (folder / "questions.jsonl").read_bytes().replace(b'"South Africa"', '"South\u202eAfrica"'.encode())
    assert "\u202e".encode() in data
    (folder / "questions.jsonl").write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["questions.jsonl"] |= {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    write_live_index(store)
    assert main(["live", "questions", "2024-03-11", "--from", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "\u202e" not in out and '"South<U+202E>Africa"' in out
