"""What a release may contain, and the one check of it that every reader and writer applies.

A release store may be hostile (docs/releases.md, "Threat model"): whoever controls the bucket
controls every byte of ``latest.json``, ``index.json`` and each manifest, and publishes sha256s
that match its own files. So a file name from a manifest is never trusted as a path: it must be
one of the names this module says a release holds, spelled as a relative POSIX path of safe
segments, and the release id must be a real month equal to the manifest's own. ``mirai download``
checks every name before it writes anything; planning and publishing check the same names (a
release we publish is always one ``mirai download`` accepts), and ``LocalStore`` checks every key.

This module is the layout's single source of truth (docs/releases.md, "Layout"), imported by
pipeline.release.store, pipeline.release.publish, pipeline.release.download and pipeline.splits.card;
it imports nothing of theirs.
"""

from __future__ import annotations

import json
import os
import re
from datetime import date
from pathlib import Path

from pipeline.storage import outside_or_not_regular

RELEASE_FORMAT = "mirai-release-v1"
RELEASES_DIR = "releases"
INDEX_KEY = f"{RELEASES_DIR}/index.json"
LATEST_KEY = f"{RELEASES_DIR}/latest.json"
LEADERBOARD_KEYS = {
    "parquet": f"{RELEASES_DIR}/leaderboard.parquet",
    "png": f"{RELEASES_DIR}/leaderboard.png",
    "html": f"{RELEASES_DIR}/leaderboard.html",
}
MANIFEST_NAME = "manifest.json"
# Submitted predictions (docs/evaluation.md, "Submissions"): submissions/<name>/ holds one
# predictions file and submission.json (uploaded last: its presence means the upload is complete);
# the pipeline adds rejection.json beside a refused one. Written by strangers: the names are
# checked as strictly as a release's.
SUBMISSIONS_DIR = "submissions"
SUBMISSION_META = "submission.json"
SUBMISSION_REJECTION = "rejection.json"
PREDICTION_NAMES = ("predictions.jsonl", "predictions.csv", "predictions.parquet")
SUBMISSION_FILES = frozenset({SUBMISSION_META, SUBMISSION_REJECTION, *PREDICTION_NAMES})
# Live rounds (docs/live.md): live/rounds/<YYYY-MM-DD>/ holds the round's questions.jsonl and
# manifest.json (written last, once), then answers-<YYYY-MM-DD>.jsonl per resolved target date;
# live/index.json lists the rounds and live/leaderboard.{json,html} scores them. Each is a
# revalidated pointer or an object written once.
LIVE_DIR = "live"
LIVE_ROUNDS_DIR = f"{LIVE_DIR}/rounds"
LIVE_INDEX_KEY = f"{LIVE_DIR}/index.json"
LIVE_LEADERBOARD_KEYS = {"json": f"{LIVE_DIR}/leaderboard.json", "html": f"{LIVE_DIR}/leaderboard.html"}
LIVE_QUESTIONS = "questions.jsonl"
# The event database a live participant may forecast from (pipeline/live/history.py, docs/live.md,
# "The history a participant may use"): live/history/<YYYY-MM-DD>/ holds the day's events.parquet
# and news.parquet, then manifest.json (written last, once); live/history/index.json lists the days.
LIVE_HISTORY_DIR = f"{LIVE_DIR}/history"
LIVE_HISTORY_INDEX_KEY = f"{LIVE_HISTORY_DIR}/index.json"
# live/status/<name>.json: a live submission's public status (pipeline/live/status.py): live/ is
# public-read, submissions/ is not (a submission's metadata holds its contact).
LIVE_STATUS_DIR = f"{LIVE_DIR}/status"
# releases/status/<name>.json: a monthly submission's public status (pipeline/evaluation/
# submission_status.py), public-read with the releases; "status" is not a month, so no release's.
SUBMISSION_STATUS_DIR = f"{RELEASES_DIR}/status"
LIVE_ANSWERS = re.compile(r"answers-([0-9]{4}-[0-9]{2}-[0-9]{2})\.jsonl")
# A submission's name is one short path segment: letters, digits and "._-", starting with a
# letter or digit (so never "." or ".."), at most 64 characters.
_SUBMISSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# Every file a release holds, relative to releases/YYYY-MM/ (what release_sources publishes):
CARD_NAME = "README.md"  # the dataset card (pipeline/splits/card.py)
SPLIT_FILES = ("queries.parquet", "queries_sample.parquet")  # the split (pipeline/splits/split.py)
RELATION_FIGURE = "relation_distribution.png"  # the card's figures (pipeline/splits/card.py)
PAIRS_FIGURE = "country_pairs.png"
MONTHS_FIGURE = "queries_by_month.png"  # every split through the month (pipeline/splits/card_figures.py)
# The month's operator pictures, on the card too (pipeline/splits/card_figures.py): its GDELT slot
# ledger (pipeline/gdelt/ledger_figure.py) and its OBELICS funnel (pipeline/articles/funnel.py).
LEDGER_FIGURE = "slot_ledger.png"
FUNNEL_FIGURE = "obelics_funnel.png"
DATABASE_TABLES = ("events", "news")  # database/<table>/month=YYYY-MM.parquet, every month up to the release's
CROISSANT_NAME = "croissant.json"  # the release's Croissant metadata (pipeline/release/croissant.py)
CARD_FIGURES = (RELATION_FIGURE, PAIRS_FIGURE, MONTHS_FIGURE, LEDGER_FIGURE, FUNNEL_FIGURE)
TOP_LEVEL_FILES = frozenset({CARD_NAME, *SPLIT_FILES, *CARD_FIGURES, CROISSANT_NAME})
# Hugging Face's dataset configs of a release (the card's front matter, pipeline/splits/card.py;
# https://huggingface.co/docs/hub/datasets-manual-configuration): the two query sets as the "test"
# split, and each database table's months as one "database" split, so
# `datasets.load_dataset(<release>, "events")` reads every month the release holds.
DATABASE_SPLIT = "database"


def hf_config(name: str, split: str, path: str, *, default: bool = False) -> dict:
    """One entry of a card's ``configs``: ``path`` (a file or a glob) read as ``split``."""
    return {
        "config_name": name,
        **({"default": True} if default else {}),
        "data_files": [{"split": split, "path": path}],
    }


def release_configs() -> list[dict]:
    """The ``configs`` of a release's card: one per query set (``queries`` the default) and per
    database table."""
    return [
        *(hf_config(name.removesuffix(".parquet"), "test", name, default=i == 0) for i, name in enumerate(SPLIT_FILES)),
        *(hf_config(table, DATABASE_SPLIT, f"database/{table}/*.parquet") for table in DATABASE_TABLES),
    ]


# The split and the database in MIRAI's own file layout (pipeline/splits/mirai_files.py, docs/mirai.md):
# mirai/data/ is copied into a MIRAI checkout as it is.
MIRAI_BUNDLE_DIR = "mirai"
MIRAI_BUNDLE_FILES = frozenset(
    f"{MIRAI_BUNDLE_DIR}/data/{name}"
    for name in (
        "MIRAI/data_kg.csv",
        "MIRAI/data_news.csv",
        "MIRAI/data_final.csv",
        "MIRAI/test/relation_query.csv",
        "MIRAI/test_subset/relation_query.csv",
        "info/dict_code2relation.json",
        "info/dict_iso2alternames_GeoNames.json",
        "info/ISO_country_GeoNames.txt",
        "info/CAMEO_relation.txt",
    )
)

# The longest name the layout makes is 50 characters (mirai/data/info/dict_iso2alternames_GeoNames.json).
# The bounds leave room to grow and keep a segment's ".<segment>.part" temp file under Linux's
# NAME_MAX of 255 bytes, and a key far under S3's 1,024 bytes.
MAX_NAME_CHARS = 200
MAX_SEGMENT_CHARS = 128
# A file's size must be an int in [0, MAX_FILE_BYTES]: a whole release is a few GB today.
MAX_FILE_BYTES = 2**40
# latest.json, index.json and a manifest are read whole, so never past this: a manifest is ~10 KB
# plus ~0.1 KB per database month, and index.json ~5 KB per release.
MAX_JSON_BYTES = 16 * 2**20

_MONTH = re.compile(r"[0-9]{4}-(?:0[1-9]|1[0-2])")
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DATABASE_FILE = re.compile(rf"database/(?:{'|'.join(DATABASE_TABLES)})/month=([0-9]{{4}}-[0-9]{{2}})\.parquet")


# A live history day's tables, named as in a release's database/ (DATABASE_TABLES).
LIVE_HISTORY_FILES = tuple(f"{table}.parquet" for table in DATABASE_TABLES)


class ReleaseError(RuntimeError):
    """A release cannot be published or read as asked; the message says why."""


class UnsafeRelease(ReleaseError):
    """A manifest, pointer or key breaks the release layout (a hostile or corrupt store): refused
    before anything is written. The message is one line naming the offending entry."""


def release_key(month: str, name: str) -> str:
    return f"{RELEASES_DIR}/{month}/{name}"


def is_month(text: object) -> bool:
    """A real month spelled YYYY-MM (ASCII digits, 01-12, nothing before or after)."""
    return isinstance(text, str) and _MONTH.fullmatch(text) is not None


def parse_month(text: str) -> str:
    if not is_month(text):
        raise ReleaseError(f"expected a release month YYYY-MM or 'latest', got {shown(text)}")
    return text


def shown(value: object) -> str:
    """A value for a one-line message: its repr (control characters escaped), cut at 80 characters."""
    text = repr(value)
    return (
        text if len(text) <= 80 else f"{text[:80]}… ({len(value) if isinstance(value, str) else len(text)} characters)"
    )


def name_problem(month: str, name: object) -> str | None:
    """Why ``name`` is not a file of release ``month`` (a relative POSIX path of safe segments that
    the layout allows), or None when it is one."""
    if not isinstance(name, str):
        return "not a string"
    if len(name) > MAX_NAME_CHARS:
        return f"is longer than {MAX_NAME_CHARS} characters"
    control = next((c for c in name if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if control is not None:
        return f"contains the control character U+{ord(control):04X}"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            return f"has a {shown(segment)} path segment"
        if len(segment) > MAX_SEGMENT_CHARS:
            return f"has a path segment longer than {MAX_SEGMENT_CHARS} characters"
    if name in TOP_LEVEL_FILES or name in MIRAI_BUNDLE_FILES:
        return None
    database = _DATABASE_FILE.fullmatch(name)
    if database and is_month(database[1]) and database[1] <= month:
        return None
    return (
        f"is not a file of release {month} (the layout allows {', '.join(sorted(TOP_LEVEL_FILES))}, "
        f"database/{{{','.join(DATABASE_TABLES)}}}/month=YYYY-MM.parquet up to {month} and MIRAI's files under "
        f"{MIRAI_BUNDLE_DIR}/data/)"
    )


def check_name(month: str, name: object, where: str) -> str:
    """``name`` when it is a file of release ``month``; else UnsafeRelease naming it (``where``
    says whose entry it is)."""
    problem = name_problem(month, name)
    if problem:
        raise UnsafeRelease(f"{where}: the file name {shown(name)} {problem}; refused, nothing was written")
    return name


def check_manifest(month: str, manifest: object, where: str) -> dict[str, dict]:
    """The files of a parsed release manifest ({name: {"sha256", "bytes", ...}}) once every rule
    holds: the format is ours, its ``release`` is ``month``, every name passes check_name, every
    sha256 is 64 lowercase hex digits and every size an int in [0, MAX_FILE_BYTES]."""
    if not is_month(month):
        raise UnsafeRelease(f"{where}: the release {shown(month)} is not a month YYYY-MM; refused, nothing was written")
    found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
    if found != RELEASE_FORMAT:
        raise UnsafeRelease(
            f"{where} is not a {RELEASE_FORMAT} manifest (format {shown(found)}); refused, nothing was written"
        )
    if manifest.get("release") != month:
        raise UnsafeRelease(
            f"{where} says it is release {shown(manifest.get('release'))}, not {month}; refused, nothing was written"
        )
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise UnsafeRelease(f"{where} has no 'files' object; refused, nothing was written")
    for name, meta in files.items():
        check_name(month, name, where)
        problem = _entry_problem(meta)
        if problem:
            raise UnsafeRelease(f"{where}: the file {shown(name)} has {problem}; refused, nothing was written")
    return files


def _entry_problem(meta: object) -> str | None:
    if not isinstance(meta, dict):
        return "an entry that is not an object"
    if not (isinstance(meta.get("sha256"), str) and _SHA256.fullmatch(meta["sha256"])):
        return f"sha256 {shown(meta.get('sha256'))} (not 64 lowercase hex digits)"
    size = meta.get("bytes")
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        return f"size {shown(size)} (not an integer from 0 to {MAX_FILE_BYTES:,})"
    return None


def load_json(raw: bytes, where: str) -> object:
    """Parse a pointer or manifest from the store; malformed JSON is one line, not a traceback."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UnsafeRelease(f"{where} is not valid JSON ({type(exc).__name__}); refused, nothing was written") from exc


def check_pointer(entry: object, where: str) -> tuple[str, str]:
    """(release month, manifest sha256) of a latest.json or index.json entry, both checked."""
    if not isinstance(entry, dict):
        raise UnsafeRelease(f"{where} has an entry that is not an object; refused, nothing was written")
    month, digest = entry.get("release"), entry.get("manifest_sha256")
    if not is_month(month):
        raise UnsafeRelease(
            f"{where} names the release {shown(month)}, which is not a month YYYY-MM; refused, nothing was written"
        )
    if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
        raise UnsafeRelease(
            f"{where} gives release {month} the manifest sha256 {shown(digest)} (not 64 lowercase "
            "hex digits); refused, nothing was written"
        )
    return month, digest


def check_index(index: object, where: str) -> dict[str, str]:
    """{release month: manifest sha256} of a parsed index.json, every entry checked."""
    releases = index.get("releases") if isinstance(index, dict) else None
    if not isinstance(releases, list):
        raise UnsafeRelease(f"{where} has no 'releases' list; refused, nothing was written")
    published: dict[str, str] = {}
    for entry in releases:
        month, digest = check_pointer(entry, where)
        if month in published:
            raise UnsafeRelease(f"{where} lists release {shown(month)} twice; refused, nothing was written")
        published[month] = digest
    return published


def is_day(text: object) -> bool:
    """A real day spelled YYYY-MM-DD (ASCII digits, nothing before or after)."""
    if not (isinstance(text, str) and _DAY.fullmatch(text)):
        return False
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def live_round_key(day: str, name: str) -> str:
    return f"{LIVE_ROUNDS_DIR}/{day}/{name}"


def live_history_key(day: str, name: str) -> str:
    return f"{LIVE_HISTORY_DIR}/{day}/{name}"


def live_status_key(name: str) -> str:
    return f"{LIVE_STATUS_DIR}/{name}.json"


def submission_status_key(name: str) -> str:
    return f"{SUBMISSION_STATUS_DIR}/{name}.json"


def live_answers_name(target: str) -> str:
    """The answers file of target date ``target`` (YYYY-MM-DD) in its round's directory."""
    return f"answers-{target}.jsonl"


def live_name_problem(name: object) -> str | None:
    """Why ``name`` is not a file of a live round (questions.jsonl, manifest.json or
    answers-<YYYY-MM-DD>.jsonl of a real day), or None when it is one."""
    if name in (LIVE_QUESTIONS, MANIFEST_NAME):
        return None
    answers = LIVE_ANSWERS.fullmatch(name) if isinstance(name, str) else None
    if answers and is_day(answers[1]):
        return None
    return f"is not a file of a live round ({LIVE_QUESTIONS}, {MANIFEST_NAME} or answers-YYYY-MM-DD.jsonl)"


def is_submission_name(name: object) -> bool:
    return isinstance(name, str) and _SUBMISSION_NAME.fullmatch(name) is not None


def submission_key(name: str, file: str) -> str:
    return f"{SUBMISSIONS_DIR}/{name}/{file}"


def check_store_key(key: str) -> str:
    """``key`` when a release store may hold it: a pointer under releases/, releases/YYYY-MM/
    followed by the manifest's name or a name check_name allows, submissions/<name>/ followed by
    one of SUBMISSION_FILES, or a live round's key (live/index.json, live/leaderboard.*,
    live/rounds/YYYY-MM-DD/ followed by a name live_name_problem allows, live/status/<name>.json),
    or the live history's (live/history/index.json, live/history/YYYY-MM-DD/ followed by
    manifest.json or one of LIVE_HISTORY_FILES)."""
    pointers = (INDEX_KEY, LATEST_KEY, *LEADERBOARD_KEYS.values(), LIVE_INDEX_KEY, *LIVE_LEADERBOARD_KEYS.values())
    if key in (*pointers, LIVE_HISTORY_INDEX_KEY):
        return key
    if key.startswith(f"{LIVE_HISTORY_DIR}/"):
        day, _, name = key.removeprefix(f"{LIVE_HISTORY_DIR}/").partition("/")
        if not (is_day(day) and name in (MANIFEST_NAME, *LIVE_HISTORY_FILES)):
            raise UnsafeRelease(
                f"the store key {shown(key)} is not {LIVE_HISTORY_DIR}/YYYY-MM-DD/<file> with a file among "
                f"{MANIFEST_NAME}, {', '.join(LIVE_HISTORY_FILES)}; refused"
            )
        return key
    if key.startswith(f"{LIVE_ROUNDS_DIR}/"):
        day, _, name = key.removeprefix(f"{LIVE_ROUNDS_DIR}/").partition("/")
        problem = None if is_day(day) else "is not a day YYYY-MM-DD"
        problem = problem or live_name_problem(name)
        if problem:
            raise UnsafeRelease(
                f"the store key {shown(key)} is not {LIVE_ROUNDS_DIR}/YYYY-MM-DD/<file>: its file {problem}; refused"
            )
        return key
    for status_dir in (LIVE_STATUS_DIR, SUBMISSION_STATUS_DIR):
        if key.startswith(f"{status_dir}/"):
            name = key.removeprefix(f"{status_dir}/").removesuffix(".json")
            if not (key.endswith(".json") and is_submission_name(name)):
                raise UnsafeRelease(
                    f"the store key {shown(key)} is not {status_dir}/<name>.json with a submission's name; refused"
                )
            return key
    head, _, rest = key.partition("/")
    if head == SUBMISSIONS_DIR:
        name, _, file = rest.partition("/")
        if not is_submission_name(name) or file not in SUBMISSION_FILES:
            raise UnsafeRelease(
                f"the store key {shown(key)} is not {SUBMISSIONS_DIR}/<name>/<file> with a name of letters, digits "
                f"and '._-' (at most 64) and a file among {', '.join(sorted(SUBMISSION_FILES))}; refused"
            )
        return key
    month, _, name = rest.partition("/")
    if head != RELEASES_DIR or not is_month(month):
        raise UnsafeRelease(
            f"the store key {shown(key)} is not under {RELEASES_DIR}/YYYY-MM/; refused, nothing was written"
        )
    if name != MANIFEST_NAME:
        check_name(month, name, f"the store key {shown(key)}")
    return key


def path_inside(base: Path, name: str) -> Path:
    """base/name, once it is lexically inside base (a last guard behind check_name)."""
    base = Path(os.path.normpath(base))
    path = Path(os.path.normpath(os.path.join(base, name)))
    if path == base or not path.is_relative_to(base):
        raise UnsafeRelease(f"{shown(name)} resolves to {shown(str(path))}, outside {shown(str(base))}; refused")
    return path


def check_inside(directory: Path, path: Path) -> Path:
    """``path``, once it resolves (every link followed) to a regular file inside ``directory``; else
    UnsafeRelease. For a release directory a reader is handed rather than one `mirai download`
    wrote (which writes no link): a link within the release is harmless, one leading out of it
    would hand a file from elsewhere on the machine to whoever reads the release."""
    problem = outside_or_not_regular(directory, path)
    if problem is not None:
        raise UnsafeRelease(f"{problem}; refused")
    return path
