"""Every asset and asset check of the code location materialised on one real Dagster instance, with
hostile text at each entry point: a GDELT day whose export rows carry it as actor codes, names and
source URLs and whose zips name their members after it, a news page titled with it, submissions
whose model, contact and file names are it, and live submissions whose models are it. Every
Markdown value and check description in the instance's event log (the Dagster UI renders both as
Markdown) is then parsed as CommonMark: none opens an image, a link or HTML, and each hostile text
is still shown where its source is."""

from __future__ import annotations

import html
import io
import json
import os
import unicodedata
import zipfile
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from assets.articles import articles, fetch_ledger
from assets.database import event_database
from assets.evaluations import evaluation, leaderboard
from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.live import live_round
from assets.live_history import live_history
from assets.live_resolution import live_leaderboard, live_resolution
from assets.release import release
from assets.resources import resources_for
from assets.splits import test_split as split_asset
from assets.submissions import submission
from pipeline.splits.database import month_days
from pipeline.storage import DataLayout, raw_file_name
from quality.event_checks import (
    articles_fetch_health,
    articles_valid,
    daily_quads_valid,
    events_history_current,
    events_valid,
    gdelt_events_valid,
)
from quality.ingest_checks import gdelt_events_intact, gdelt_files_all_green, gdelt_mentions_intact
from quality.schema_checks import column_schema_checks
from quality.split_checks import split_leakage_audit
from quality.submission_checks import submission_accepted
from testbed.generate import MirrorOptions, generate_mirror, news_sites
from testbed.hostile import relist, zip_member
from testbed.news import NewsServer
from testbed.serve import MirrorServer

from .month_builder import write_days
from .settings_builder import make_settings
from .test_column_schemas import columns_of
from .test_dagster_evaluations import split_quads
from .test_live_dagster import LIVE
from .test_live_rounds import DAY as ROUND
from .test_live_rounds import WINDOW, later_quads, window_quads
from .test_markdown import active_markdown, unescaped

PAYLOADS = (
    "![m](http://evil.invalid/p.png)",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "<http://evil.invalid>",
    "| a | b |\n|---|---|\n| `c` | d |",
    "``x`` `<b>y</b>`",
    "gpt\u202eevil",  # RIGHT-TO-LEFT OVERRIDE: displayed as "gptlive" (Trojan Source, CVE-2021-42574)
    "a\u200bb",  # ZERO WIDTH SPACE: displayed as "ab", another name's look-alike
)
# A file name cannot hold "/": these are the payloads a submitter can name a file after.
FILE_NAMED = tuple(p for p in PAYLOADS if "/" not in p)
JAN = date(2024, 1, 1)
RECURRENCY = {"name": "recurrency", "kind": "baseline", "baseline": "recurrency", "distances": [1]}
# Refused for January (its knowledge cutoff is inside it): the leaderboard's refusals table.
REFUSED = {
    "name": "recent-llm",
    "kind": "llm",
    "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
    "knowledge_cutoff": "2024-01-15",
    "strategy": "direct",
}
MONTHLY = {
    "knowledge_cutoff": "2023-06-01",
    "month": "2024-01",
    "query_set": "queries",
    "distance": 1,
    "rounds": 1,
    "api_mode": "native",
    "action_type": "none",
}


def flat(text: str) -> str:
    """``text`` on one line, as a tab-separated GDELT field or a submission's model must be."""
    return " ".join(text.split())


def hostile_page() -> bytes:
    """A news article titled with the payloads, each paragraph opening with one, in prose varied
    enough for the filters to keep it (so its title reaches the month's news table)."""
    paragraphs = (
        "Negotiators from both capitals met near the frontier on Monday to settle the rules for trucks.",
        "Farmers along the river complained that the drought had halved this season's wheat harvest.",
        "The central bank left interest rates unchanged, citing stubborn inflation in housing costs.",
        "Hospital staff in the northern province walked out after talks over overtime pay collapsed.",
        "A joint statement promised new patrols, shared customs software and an emergency hotline.",
        "Observers described the meeting as cordial, although no treaty text has been signed so far.",
    )
    body = "".join(f"<p>{html.escape(p)} {text}</p>" for p, text in zip(PAYLOADS, paragraphs))
    title = html.escape(" ".join(PAYLOADS))
    return f"<html><head><title>{title}</title></head><body><article><h1>{title}</h1>{body}</article></body></html>".encode()


def plant_hostile_gdelt(mirror_dir: Path, page_url: str) -> None:
    """In the first listed export of the day, one row per payload with it as both actors' country
    code (unknown: the unmapped-codes table), names and source URL, and one kept event whose
    actors are named with a payload and whose article is the hostile page; the next two listed
    exports become zips whose members are named with the payloads (quarantined with the names
    quoted in the slot ledger). Each file is relisted with its md5, as GDELT would serve it."""
    manifest = json.loads((mirror_dir / "manifest.json").read_text())
    slots = [datetime.strptime(s["ts"], "%Y%m%d%H%M%S").replace(tzinfo=UTC) for s in manifest["slots"]]
    listed = [slot for slot, s in zip(slots, manifest["slots"]) if s["export"]["listed"]]
    name = raw_file_name(listed[0], "export")
    with zipfile.ZipFile(mirror_dir / "gdeltv2" / name) as archive:
        real = archive.read(archive.infolist()[0])
    template = next(line for line in real.decode(errors="replace").splitlines() if line.count("\t") == 60).split("\t")
    stamp = f"{listed[0]:%Y%m%d%H%M%S}"

    def row(event_id: int, fields: dict[int, str]) -> str:
        values = list(template)
        values[0], values[1], values[59] = str(event_id), stamp[:8], stamp  # SQLDATE aligned with DATEADDED
        for i, value in fields.items():
            values[i] = value
        return "\t".join(values) + "\n"

    rows = [
        row(9_000_000_000 + i, {6: flat(p), 7: flat(p), 16: flat(p), 17: flat(p), 60: f"http://evil.invalid/{flat(p)}"})
        for i, p in enumerate(PAYLOADS)
    ]
    kept = {5: "USA", 6: flat(PAYLOADS[0]), 7: "USA", 15: "CHN", 16: flat(PAYLOADS[1]), 17: "CHN"}
    kept |= {26: "042", 27: "042", 28: "04", 29: "1", 31: "5000", 60: page_url}
    rows.append(row(9_000_000_100, kept))
    relist(mirror_dir, name, zip_member(name.removesuffix(".zip"), real + "".join(rows).encode()))
    for slot, names in ((listed[1], PAYLOADS[:3]), (listed[2], PAYLOADS[3:])):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for member in names:
                archive.writestr(member, b"x")
        relist(mirror_dir, raw_file_name(slot, "export"), buffer.getvalue())


def upload(bucket: Path, name: str, meta: dict, predictions: list[dict], extra: tuple[str, ...] = ()) -> None:
    """A submission written straight into the local store, as a submitter with write access could;
    ``extra``: more objects, named as given."""
    directory = bucket / "submissions" / name
    directory.mkdir(parents=True)
    (directory / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in predictions))
    for file in extra:
        (directory / file).write_bytes(b"{}")
    (directory / "submission.json").write_text(json.dumps(meta))


def json_strings(value: object) -> list[str]:
    """Every string in a JSON value, its keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in json_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in json_strings(v)]
    return []


@pytest.fixture(scope="module")
def event_log(tmp_path_factory):
    """Materialise every asset and check with the hostile inputs, in the order the deployment
    would (a day, its month and release, evaluations and submissions, a live round and its
    resolution, the leaderboards), then read the instance's event log. Returns the assets and
    checks it holds a materialisation or evaluation of; (where, label, text) for every Markdown
    value and description there; the code location's asset keys and check keys."""
    from definitions import defs

    tmp = tmp_path_factory.mktemp("hostile-metadata")
    data, bucket = tmp / "data", tmp / "bucket"
    generate_mirror(tmp / "mirror", JAN, JAN, seed=7, slots=8, options=MirrorOptions(url_scheme="http"))
    agents_file = tmp / "agents.yaml"
    agents_file.write_text(yaml.safe_dump({"agents": [RECURRENCY, REFUSED]}))
    with (
        NewsServer(sites=news_sites(), pages={"/hostile.html": hostile_page()}) as news,
        MirrorServer(tmp / "mirror") as mirror,
        dg.instance_for_test() as instance,
    ):
        plant_hostile_gdelt(tmp / "mirror", news.url_for("/hostile.html"))
        resources = resources_for(
            make_settings(
                data_dir=str(data),
                gdelt_base_url=mirror.base_url,
                release_uri=str(bucket),
                agents_file=str(agents_file),
                fetch_allow_loopback=True,
                fetch_host_map=f"*.example=127.0.0.1:{news.port}",
                extract_workers=1,
                **LIVE,
            )
        )

        def run(selection: list, partition_key: str | None = None, run_config: dict | None = None) -> None:
            # With the column-schema-change checks of the assets run (their descriptions are Markdown too).
            keys = {a.key for a in selection if isinstance(a, dg.AssetSpec)}
            keys |= {k for a in selection if isinstance(a, dg.AssetsDefinition) for k in a.keys}
            schema = [c for c in column_schema_checks if {spec.asset_key for spec in c.check_specs} <= keys]
            dg.materialize(
                [*selection, *schema],
                partition_key=partition_key,
                run_config=run_config,
                resources=resources,
                instance=instance,
            )

        # The hostile day, then the rest of January as the daily assets write it: the month
        # holds the hostile page. Its quarantined slots keep it open: an operator override splits it.
        daily = [gdelt_files, gdelt_events, gdelt_mentions, events, daily_quads, articles, fetch_ledger]
        checks = [gdelt_files_all_green, gdelt_events_intact, gdelt_mentions_intact, gdelt_events_valid]
        checks += [events_valid, events_history_current, daily_quads_valid, articles_valid, articles_fetch_health]
        run(daily + checks, JAN.isoformat())
        # fetch_ledger has no step (articles records it): its checks run as articles_daily selects them.
        ledger_checks = dg.AssetSelection.checks_for_assets(fetch_ledger.key)
        ledger_job = dg.define_asset_job("ledger_checks", selection=ledger_checks)
        dg.Definitions(
            assets=[fetch_ledger], asset_checks=column_schema_checks, jobs=[ledger_job], resources=resources
        ).resolve_job_def("ledger_checks").execute_in_process(instance=instance)
        write_days(make_settings(data_dir=data), month_days(JAN)[1:], split_quads(JAN))
        override = {"override_by": "operator", "override_reason": "GDELT served zips that are not GDELT files"}
        run(
            [event_database, split_asset, split_leakage_audit, release],
            JAN.isoformat(),
            {"ops": {"test_split": {"config": override}}},
        )
        instance.add_dynamic_partitions("agents", [RECURRENCY["name"], REFUSED["name"]])
        for agent in (RECURRENCY, REFUSED):
            run([evaluation], dg.MultiPartitionKey({"month": JAN.isoformat(), "agent": agent["name"]}))

        queries = pl.read_parquet(DataLayout(data).split_dir(JAN) / "queries.parquet").get_column("query_id")
        answers = [{"query_id": q, "answer": {"04": ["042"]}} for q in queries]
        hostile = {"model": " ".join(flat(p) for p in PAYLOADS), "contact": flat(PAYLOADS[2])}
        upload(bucket, "hostile-scored", MONTHLY | hostile, answers)
        upload(bucket, "hostile-files", MONTHLY | hostile, answers, extra=FILE_NAMED)

        write_days(
            make_settings(data_dir=data), [*WINDOW, ROUND, ROUND + timedelta(days=1)], window_quads() + later_quads()
        )
        run(
            [live_round],
            ROUND.isoformat(),
            {"ops": {"live_round": {"config": {"replay_at": f"{ROUND}T02:00:00+00:00"}}}},
        )
        # The history participants may use: the window's last day, published the day after it.
        run(
            [live_history],
            WINDOW[-1].isoformat(),
            {"ops": {"live_history": {"config": {"replay_at": f"{ROUND}T02:30:00+00:00"}}}},
        )
        questions = pl.read_parquet(data / "live" / str(ROUND) / "questions.parquet").get_column("query_id")
        for i, payload in enumerate(PAYLOADS):
            # One model per payload (the live board shows a model's first 80 characters);
            # different forecasts, or all but the first would be refused as copies.
            meta = {
                "model": flat(payload),
                "contact": flat(payload),
                "knowledge_cutoff": "2024-03-01",
                "round": str(ROUND),
            }
            forecasts = [{"query_id": q, "answer": ["042"], "p_event": i / 10} for q in questions]
            upload(bucket, f"hostile-live-{i}", meta, forecasts)

        # Every upload in the store (the live round's baselines too), as the submission sensor finds them.
        names = sorted(p.name for p in (bucket / "submissions").iterdir())
        instance.add_dynamic_partitions("submissions", names)
        for name in names:
            run([submission, submission_accepted], name)
        # A day later on the store's clock: the round, accepted into until its deadline there, closes
        # and resolves (its manifest's store time moved back by the 22 h it takes submissions).
        manifest = bucket / "live" / "rounds" / str(ROUND) / "manifest.json"
        closed = manifest.stat().st_mtime - 23 * 3600
        os.utime(manifest, (closed, closed))
        run([live_resolution], ROUND.isoformat())
        run([live_leaderboard])
        run([leaderboard])

        walked, shown, cells, columns = set(), [], [], {}
        for record in instance.get_runs():
            for entry in instance.all_logs(
                record.run_id,
                of_type={dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.ASSET_CHECK_EVALUATION},
            ):
                event = entry.dagster_event.event_specific_data
                if entry.dagster_event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
                    event = event.materialization
                    where = event.asset_key.to_user_string()
                    columns.setdefault(where, []).append(columns_of(event.metadata))
                else:
                    where = f"{event.asset_key.to_user_string()}:{event.check_name}"
                walked.add(where)
                # The UI renders descriptions (a check's, on its page) and Markdown values as
                # Markdown; text values (a submission's model) as plain text, inert as they are.
                if event.description:
                    shown.append((where, "description", event.description))
                for label, value in event.metadata.items():
                    if isinstance(value, dg.MarkdownMetadataValue):
                        shown.append((where, label, value.value))
                    # Table cells the UI shows as plain text (React text nodes), never as Markdown.
                    if isinstance(value, dg.TableMetadataValue):
                        cells += [
                            (where, label, c) for r in value.records for c in r.data.values() if isinstance(c, str)
                        ]
                    # Text values and a JSON value's strings: plain text too (a submission's model).
                    if isinstance(value, dg.TextMetadataValue):
                        cells.append((where, label, value.value))
                    if isinstance(value, dg.JsonMetadataValue):
                        cells += [(where, label, text) for text in json_strings(value.value)]
        asset_keys = {key.to_user_string() for key in defs.resolve_all_asset_keys()}
        check_keys = {
            f"{key.asset_key.to_user_string()}:{key.name}" for key in defs.resolve_asset_graph().asset_check_keys
        }
    return walked, shown, asset_keys, check_keys, columns, cells


def test_every_asset_and_check_of_the_code_location_is_walked(event_log):
    """A new asset or check fails this test until the walk materialises it."""
    walked, _, asset_keys, check_keys, _, _ = event_log
    assert asset_keys - walked == set()
    assert check_keys - walked == set()


def test_no_hostile_text_opens_an_image_a_link_or_html_anywhere(event_log):
    _, shown, _, _, _, _ = event_log
    active = [(where, label, found) for where, label, text in shown if (found := active_markdown(text))]
    assert active == []


def hidden_shown(text: str) -> str:
    """``text`` with its control and format characters (bidi controls, zero-width spaces) as <U+XXXX>."""
    return "".join(f"<U+{ord(c):04X}>" if unicodedata.category(c) in ("Cc", "Cf") else c for c in text)


def visible(payload: str, markdown: str) -> bool:
    """The payload is in what the UI shows of ``markdown``: on one line, its hidden characters
    shown, or quoted as a repr."""
    return any(form in unescaped(markdown) for form in (hidden_shown(flat(payload)), repr(payload)[1:-1]))


def test_no_bidi_control_or_invisible_character_reaches_the_markdown_or_a_table(event_log):
    """A bidi override or a zero-width space in a model, file name or GDELT code would change what
    the UI displays (Trojan Source, CVE-2021-42574; Unicode TR36): none is left in any Markdown,
    nor in any table cell, text value or JSON string (plain text shows them as they act)."""
    _, shown, _, _, _, cells = event_log
    hidden = [
        (where, label, {c for c in text if unicodedata.category(c) in ("Cc", "Cf")} - {"\n"})
        for where, label, text in [*shown, *cells]
    ]
    assert [(where, label, found) for where, label, found in hidden if found] == []


@pytest.mark.parametrize(
    ("where", "label", "payloads"),
    [
        ("gdelt_files:gdelt_files_all_green", "description", PAYLOADS),
        ("submission", "reasons", FILE_NAMED),  # a submitter's file names
        ("submission:submission_accepted", "description", FILE_NAMED),
    ],
)
def test_hostile_text_is_still_shown_escaped_not_dropped(event_log, where, label, payloads):
    _, shown, _, _, _, _ = event_log
    texts = [text for w, key, text in shown if (w, key) == (where, label)]
    assert texts, f"no Markdown {label!r} on {where}"
    assert [p for p in payloads if not any(visible(p, text) for text in texts)] == []


def test_every_materialisation_carries_the_columns_its_asset_declares(event_log):
    """What the schema-change checks compare: each materialisation's columns, from the frame it
    wrote, are the ones the asset declares; evaluation's, declared by none, are its results file's."""
    from definitions import defs

    _, _, _, _, columns, _ = event_log
    declared = {
        spec.key.to_user_string(): schema
        for spec in defs.resolve_all_asset_specs()
        if (schema := columns_of(spec.metadata)) is not None
    }
    assert {"articles", "fetch_ledger", "event_database", "test_split", "leaderboard", "live_resolution"} <= set(
        declared
    )
    assert [(key, i) for key, schema in declared.items() for i, c in enumerate(columns[key]) if c != schema] == []
    results = {column.name for schema in columns["evaluation"] if schema for column in schema.columns}
    assert {"query_id", "gold", "prediction", "level2_f1"} <= results


@pytest.mark.parametrize(
    ("where", "label"),
    [
        ("unmapped_codes", "codes"),  # GDELT actor country codes
        ("gdelt_files", "problems"),  # GDELT zip member names, quoted in the slot ledger
        ("gdelt_files:gdelt_files_all_green", "details"),
        ("live_leaderboard", "cumulative"),  # live submitters' models
    ],
)
def test_hostile_text_is_still_shown_in_the_tables_as_plain_text(event_log, where, label):
    """A table cell is plain text: the payload is there as it came (no Markdown escapes), its
    hidden characters shown, or quoted as a repr where a reason quotes a file name."""
    *_, cells = event_log
    texts = [text for w, key, text in cells if (w, key) == (where, label)]
    assert texts, f"no table {label!r} on {where}"
    forms = [(hidden_shown(flat(p)), repr(p)[1:-1]) for p in PAYLOADS]
    assert [p for p, f in zip(PAYLOADS, forms) if not any(form in text for form in f for text in texts)] == []
