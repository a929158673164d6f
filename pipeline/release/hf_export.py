"""`mirai export hf`: several monthly releases as one Hugging Face dataset repository.

The repository holds each month's split once and each database month once (a release repeats every
earlier database month; here a month's table is one file, whichever releases carried it):

    README.md                                  the card: front matter with every config, then the months
    export.json                                every file with its sha256, and each release's manifest sha256
    splits/YYYY-MM/queries.parquet, queries_sample.parquet, README.md (the month's card), figures,
                   manifest.json (the release's manifest)
    database/{events,news}/month=YYYY-MM.parquet

Configs (https://huggingface.co/docs/hub/datasets-manual-configuration): ``queries-YYYY-MM``,
``queries_sample-YYYY-MM``, ``events-YYYY-MM`` and ``news-YYYY-MM`` for each month, and ``queries``,
``queries_sample``, ``events``, ``news`` over every month. Each source file is verified against its
release's manifest while it is copied; the repository is built beside ``out`` and swapped in whole,
and a re-run with the same releases changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.release.layout import (
    CARD_FIGURES,
    CARD_NAME,
    DATABASE_SPLIT,
    DATABASE_TABLES,
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    SPLIT_FILES,
    ReleaseError,
    check_inside,
    check_manifest,
    hf_config,
    is_month,
    load_json,
)
from pipeline.release.tables import GDELT_TERMS
from pipeline.storage import staged_directory

EXPORT_FORMAT = "mirai-hf-export-v1"
EXPORT_MANIFEST = "export.json"
# What a month contributes under splits/YYYY-MM/: the split, its card and figures, its manifest.
MONTH_FILES = (*SPLIT_FILES, CARD_NAME, *CARD_FIGURES)
# A line width PyYAML never reaches: each front matter string stays on one line.
UNWRAPPED = 2**31 - 1


class HfExportError(ReleaseError):
    """The releases cannot be exported as asked; the message says why."""


@dataclass(frozen=True)
class HfExport:
    directory: Path
    months: list[str]  # the releases' months
    database_months: list[str]
    configs: list[str]
    changed: bool


def release_dirs(sources: list[Path]) -> dict[str, Path]:
    """{month: release directory} of ``sources``: each a release directory (it holds manifest.json)
    or a directory of them (``mirai download --dest``, a local store's ``releases/``)."""
    found: dict[str, Path] = {}
    for source in sources:
        candidates = (
            [source]
            if (source / MANIFEST_NAME).is_file()
            else sorted(p for p in source.iterdir() if is_month(p.name) and (p / MANIFEST_NAME).is_file())
            if source.is_dir()
            else []
        )
        if not candidates:
            raise HfExportError(f"{source} is neither a release directory (no {MANIFEST_NAME}) nor a directory of them")
        for directory in candidates:
            manifest = load_json((directory / MANIFEST_NAME).read_bytes()[: MAX_JSON_BYTES + 1], str(directory))
            month = manifest.get("release") if isinstance(manifest, dict) else None
            if not is_month(month):
                raise HfExportError(f"{directory / MANIFEST_NAME} names no release month")
            if month in found and found[month] != directory:
                raise HfExportError(f"release {month} is given twice: {found[month]} and {directory}")
            found[month] = directory
    return dict(sorted(found.items()))


def _copy_verified(src: Path, target: Path, sha256: str) -> None:
    """Copy ``src`` to ``target``, hashing as it goes; a file that does not match its release's
    manifest is refused."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(src, "rb") as fh, open(target, "wb") as out:
        while chunk := fh.read(2**20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise HfExportError(
            f"{src} does not match its release's manifest (sha256 {digest.hexdigest()}, listed {sha256})"
        )


def _configs(months: list[str], database_months: list[str]) -> list[dict]:
    """Every config: the all-months ones first (``queries`` the default), then one per month."""
    configs = [
        *(
            hf_config(name.removesuffix(".parquet"), "test", f"splits/*/{name}", default=i == 0)
            for i, name in enumerate(SPLIT_FILES)
        ),
        *(hf_config(table, DATABASE_SPLIT, f"database/{table}/*.parquet") for table in DATABASE_TABLES),
    ]
    for month in months:
        configs += [
            hf_config(f"{n.removesuffix('.parquet')}-{month}", "test", f"splits/{month}/{n}") for n in SPLIT_FILES
        ]
    for month in database_months:
        configs += [
            hf_config(f"{table}-{month}", DATABASE_SPLIT, f"database/{table}/month={month}.parquet")
            for table in DATABASE_TABLES
        ]
    return configs


def _count(manifest: dict, name: str) -> str:
    """The split's count ``name`` as the card's table shows it: a whole number, else "–". The
    manifest is the store's (which may be hostile, docs/releases.md, "Threat model"), and check_manifest
    holds only its files to a shape: any other value would be Markdown on the Hub's dataset page."""
    split = manifest.get("split")
    counts = split.get("counts") if isinstance(split, dict) else None
    value = counts.get(name) if isinstance(counts, dict) else None
    return str(value) if type(value) is int else "–"


def _card(manifests: dict[str, dict], database_months: list[str], configs: list[dict], files: dict[str, dict]) -> str:
    months = list(manifests)
    generated = sorted(
        {
            str(m["source"].get("description"))
            for m in manifests.values()
            if isinstance(m.get("source"), dict) and m["source"].get("generated")
        }
    )
    meta = {
        "pretty_name": f"MIRAI test splits {months[0]}..{months[-1]}"
        + (f" (GENERATED data, not GDELT: {'; '.join(generated)})" if generated else " (rebuilt from GDELT 2.0)"),
        "license": "other",
        "license_name": "gdelt-terms-of-use",
        "license_link": GDELT_TERMS,
        "language": ["en"],
        "task_categories": ["question-answering", "text-classification"],
        "configs": configs,
        "tags": ["forecasting", "event-forecasting", "gdelt", "cameo", "mirai", *(["synthetic"] if generated else [])],
    }
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, default_flow_style=False, width=UNWRAPPED)
    rows = "\n".join(
        f"| {m} | {_count(manifests[m], 'queries')} | {_count(manifests[m], 'sample')} "
        f"| `{files[f'splits/{m}/{MANIFEST_NAME}']['sha256']}` |"
        for m in months
    )
    return f"""---
{front}---

# MIRAI test splits {months[0]}..{months[-1]}

Monthly test splits in the format of [MIRAI](https://arxiv.org/abs/2407.01231) (Ye et al., 2024),
built by mirai-pipeline, with the event and news database an agent searches. Each month's own
dataset card (its datasheet: sources, thresholds, versions, deviations) is `splits/YYYY-MM/README.md`,
and its release manifest `splits/YYYY-MM/manifest.json`.{" **Generated data, not GDELT: use them to try the tools, never to measure forecasting.**" if generated else ""}

```python
from datasets import load_dataset

queries = load_dataset("<this repository>", "queries-{months[-1]}", split="test")  # one month's queries
events = load_dataset("<this repository>", "events", split="{DATABASE_SPLIT}")  # every database month
```

Configs: `queries`, `queries_sample`, `events` and `news` hold every month; `<table>-YYYY-MM` holds
one. A query on day `t` of month M may only use database rows up to `t` minus the temporal distance
of the month's card: filter `events` and `news` by `date` accordingly.

| month | queries | sample | release manifest sha256 |
|---|---|---|---|
{rows}

Database months: {", ".join(database_months)}. `{EXPORT_MANIFEST}` lists every file with its sha256.
The event data come from the GDELT Project ([terms of use]({GDELT_TERMS})): cite it and MIRAI.
"""


def _file_entry(path: Path) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(2**20):
            digest.update(chunk)
    return {"sha256": digest.hexdigest(), "bytes": path.stat().st_size}


def export_hf(sources: list[Path], out: Path) -> HfExport:
    """Write the dataset repository of the releases in ``sources`` to ``out``: absent, empty, or an
    earlier export (it is replaced whole, so never another directory of the user's)."""
    out = Path(out)
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / EXPORT_MANIFEST).is_file())):
        raise HfExportError(
            f"{out} exists and is not an earlier export (no {EXPORT_MANIFEST}); give a new or empty directory"
        )
    releases = release_dirs([Path(s) for s in sources])
    if not releases:
        raise HfExportError("no release to export")
    manifests: dict[str, dict] = {}
    database: dict[str, tuple[Path, str]] = {}  # name -> (source file, sha256)
    for month, directory in releases.items():
        where = str(directory / MANIFEST_NAME)
        manifest = load_json((directory / MANIFEST_NAME).read_bytes()[: MAX_JSON_BYTES + 1], where)
        files = check_manifest(month, manifest, where)
        manifests[month] = manifest
        for name, meta in files.items():
            if not name.startswith("database/"):
                continue
            if name in database and database[name][1] != meta["sha256"]:
                raise HfExportError(
                    f"{name} differs between releases (sha256 {database[name][1]} and {meta['sha256']} in release {month}): "
                    "export releases built from the same database"
                )
            database.setdefault(name, (check_inside(directory, directory / name), meta["sha256"]))
    database_months = sorted({name.rsplit("month=", 1)[1].removesuffix(".parquet") for name in database})
    configs = _configs(list(releases), database_months)
    with staged_directory(out) as staging:
        for month, directory in releases.items():
            files = manifests[month]["files"]
            for name in MONTH_FILES:
                if name in files:
                    _copy_verified(
                        check_inside(directory, directory / name),
                        staging / "splits" / month / name,
                        files[name]["sha256"],
                    )
            (staging / "splits" / month / MANIFEST_NAME).write_bytes((directory / MANIFEST_NAME).read_bytes())
        for name, (path, sha256) in sorted(database.items()):
            _copy_verified(path, staging / name, sha256)
        files = {str(p.relative_to(staging)): _file_entry(p) for p in sorted(staging.rglob("*")) if p.is_file()}
        (staging / CARD_NAME).write_text(_card(manifests, database_months, configs, files))
        files[CARD_NAME] = _file_entry(staging / CARD_NAME)
        record = {
            "format": EXPORT_FORMAT,
            "releases": {m: hashlib.sha256((d / MANIFEST_NAME).read_bytes()).hexdigest() for m, d in releases.items()},
            "database_months": database_months,
            "configs": [c["config_name"] for c in configs],
            "files": dict(sorted(files.items())),
        }
        (staging / EXPORT_MANIFEST).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        changed = not (
            (out / EXPORT_MANIFEST).is_file()
            and (out / EXPORT_MANIFEST).read_bytes() == (staging / EXPORT_MANIFEST).read_bytes()
        )
        if not changed:
            shutil.rmtree(staging)  # a re-run with the same releases changes nothing
        elif out.exists() and not any(out.iterdir()):
            out.rmdir()
    return HfExport(out, list(releases), database_months, record["configs"], changed)
