"""A live submission's public status (pipeline/live/status.py) and `mirai status NAME`: published at
live/status/<name>.json when the submission is accepted or refused and again with its score once
its round resolves; never the contact or the owner key's hash; a hostile status file is refused or
shown with its control characters visible."""

from __future__ import annotations

import json
from datetime import date, timedelta

from pipeline.cli import main
from pipeline.live import submissions as sub
from pipeline.live.publication import publish_round
from pipeline.live.resolve import resolve_round
from pipeline.live.score import score_round
from pipeline.live.status import publish_round_statuses
from pipeline.release.store import LocalStore

from .live_builder import baseline_predictions, history, midnight, pairs, write_accepted, write_round, write_world
from .month_builder import write_days
from .settings_builder import make_settings
from .test_live_rounds import DAY, PUBLISH, WINDOW, later_quads, live_settings, window_quads
from .test_live_submissions import NOW, good_records, upload

CONTACT = "private-contact@example.org"
META = {"model": "open model", "knowledge_cutoff": "2024-03-01", "contact": CONTACT, "round": "2024-03-10"}


def test_accepted_and_refused_submissions_have_a_public_status(tmp_path, capsys):
    settings = live_settings(tmp_path / "data")
    write_days(settings, [*WINDOW, DAY, DAY + timedelta(days=1)], window_quads() + later_quads())
    store = LocalStore(tmp_path / "bucket")
    publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH)
    anchor = (store.root / "live" / "rounds" / "2024-03-10" / "manifest.json").stat().st_mtime
    upload(store, "prompt", good_records(settings), META | {"owner_key": "a secret of mine, long enough"}, at=anchor)
    upload(store, "tardy", good_records(settings)[:3], META, at=anchor + 19 * 3600 + 1)
    for name in ("prompt", "tardy"):
        sub.process(store, name, settings.dataset.data_dir, now=NOW)
    for name in ("prompt", "tardy"):
        raw = store.get_bytes(f"live/status/{name}.json")
        assert CONTACT.encode() not in raw and b"owner" not in raw and b"a secret" not in raw
    assert json.loads(store.get_bytes("live/status/prompt.json"))["status"] == "accepted"
    assert main(["status", "prompt", "--from", str(store.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "prompt: accepted for round 2024-03-10 (model open model)"
    assert out[1].startswith("  uploaded ") and "(store time), deadline " in out[1]
    assert out[2:] == [
        f"  answered {len(good_records(settings))} of {len(good_records(settings))} questions",
        "  not scored yet: no target date of the round is resolved",
    ]
    assert main(["status", "tardy", "--from", str(store.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "tardy: rejected for round 2024-03-10 (model open model)"
    assert out[2].startswith("  refused: late: the submission's last object reached the store at ")
    # Not processed (or not a live submission): one line, exit 1.
    assert main(["status", "nobody", "--from", str(store.root)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mirai status: error: no status for 'nobody' at " in err
    assert err.rstrip().endswith("or no submission has that name: check its spelling")  # a typo is not "pending"
    # A hostile store: a status with terminal controls shows them; one of another shape is refused.
    hostile = json.loads(store.get_bytes("live/status/tardy.json")) | {"model": "x\x1b]0;owned\x07\u202e"}
    (store.root / "live" / "status" / "tardy.json").write_text(json.dumps(hostile))
    assert main(["status", "tardy", "--from", str(store.root)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\u202e" not in shown and "x<U+001B>]0;owned<U+0007><U+202E>" in shown
    (store.root / "live" / "status" / "tardy.json").write_text(json.dumps(hostile | {"submission": "prompt"}))
    assert main(["status", "tardy", "--from", str(store.root)]) == 1
    assert "is not the mirai-live-status-v1 status of 'tardy'; refused" in capsys.readouterr().err


def test_a_resolved_round_publishes_each_submission_s_score(tmp_path, capsys):
    rnd = date(2024, 3, 10)
    window = [rnd - timedelta(days=i) for i in range(14, 0, -1)]
    targets = [rnd + timedelta(days=1), rnd + timedelta(days=7)]
    settings = make_settings(data_dir=tmp_path / "data")
    world_pairs = pairs(seed=3, active=12, quiet=4)
    write_world(settings, 4, world_pairs, window + targets)
    questions = write_round(settings, rnd, world_pairs)
    predictions = baseline_predictions(questions, history(settings, window), "frequency")
    write_accepted(settings, rnd, "freq", predictions, model="freq model", contact=CONTACT)
    store = LocalStore(tmp_path / "bucket")
    assert publish_round_statuses(store, settings.dataset.data_dir, rnd) == 1
    assert json.loads(store.get_bytes("live/status/freq.json"))["score"] is None
    resolve_round(rnd, settings.dataset, settings.live, now=midnight(targets[-1]) + timedelta(days=2))
    card = score_round(settings.dataset, rnd)
    assert publish_round_statuses(store, settings.dataset.data_dir, rnd) == 1
    assert publish_round_statuses(store, settings.dataset.data_dir, rnd) == 0  # unchanged: not rewritten
    status = json.loads(store.get_bytes("live/status/freq.json"))
    live_score = card["submissions"]["freq"]["metrics"]["live_score"]
    assert status["score"]["metrics"]["live_score"] == live_score
    assert status["score"]["resolved_questions"] == card["resolved_questions"] == questions.height
    assert CONTACT not in json.dumps(status)
    assert main(["status", "freq", "--from", str(store.root)]) == 0
    out = capsys.readouterr().out
    low, high = live_score["ci95"]
    assert f"  scored over {questions.height} of {questions.height} questions resolved so far: " in out
    assert f"live_score {live_score['value']:g} [{low:g}, {high:g}], level2_f1 " in out
