"""Release benchmark: upload and download throughput of a ~500 MB release against a local
SeaweedFS, ours versus boto3's transfer defaults (what `aws s3 cp --recursive` does), same run.

    flock /tmp/mirai-bench.lock .venv/bin/python bench/release.py [--mb 500] [--rounds 3]

The release is synthetic but laid out exactly as the pipeline writes it: a split directory with
its manifest (queries, sample, two figures, card) and 14 months of event database (events ~30 MB,
news ~5 MB per month, incompressible bytes, as parquet is already compressed), sealed as
``write_database_month`` seals them (digests/database/.../month=YYYY-MM.parquet.sha256).

- *ours, upload*: ``publish_release`` into a fresh prefix, end to end: planning (the files with a
  recorded sha256, here all but the card, are not read; a file over the 64 MiB multipart threshold
  would be hashed part by part), HEAD of every key (immutability), the uploads, each PUT or part
  carrying its SHA-256 for the server to check (and, as botocore does over HTTPS for such
  requests, UNSIGNED-PAYLOAD instead of a second SHA-256 for SigV4), the manifest, index.json and
  latest.json. MIRAI_RELEASE_* settings at their defaults. ``--hash-all`` drops the database
  digests: every file is then hashed before it goes up, as before sealed database months.
- *defaults, upload*: one boto3 TransferManager with ``TransferConfig()`` defaults (8 MB
  threshold and parts, 10 concurrent requests) uploading every file at once, as `aws s3 cp
  --recursive` does; botocore's default checksum (CRC32, "when_supported") is on.
- *ours, download*: ``download_release`` (anonymous, MIRAI_RELEASE_CONCURRENCY files at a time
  as `mirai download`) of the whole release into an empty directory: every file streamed,
  sha256-verified against the manifest and renamed, as `mirai download` does by default (without
  ``--fsync``).
- *defaults, download*: a default TransferManager downloading every file (ranged GETs in 8 MB
  parts, 10 concurrent), no sha256 check.

Both sides use the same server, data and retry settings ("standard", MIRAI_S3_MAX_ATTEMPTS), and
both get their boto3 clients before the clock starts.
Rounds alternate which side goes first (uploads, then downloads), each step starting after an
untimed ``sync``; the median of each is reported with the load average.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import machine as machine_summary  # noqa: E402
from pipeline.config import DatasetSettings, ReleaseSettings, Settings  # noqa: E402
from pipeline.release.download import download_release  # noqa: E402
from pipeline.release.publish import plan_release, publish_release  # noqa: E402
from pipeline.release.store_uri import open_store  # noqa: E402
from pipeline.storage import DataLayout, write_sealed_bytes  # noqa: E402
from tests.s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3  # noqa: E402

MONTH = date(2024, 2, 1)
DB_MONTHS = 14


def _write_random(path: Path, size: int) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = os.urandom(size)
    path.write_bytes(data)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": size}


def build_release(data_dir: Path, total_mb: int, *, sealed: bool = True) -> None:
    layout = DataLayout(data_dir)
    split = layout.split_dir(MONTH)
    files = {
        "queries.parquet": _write_random(split / "queries.parquet", 3 * 2**20),
        "queries_sample.parquet": _write_random(split / "queries_sample.parquet", 40_000),
        "relation_distribution.png": _write_random(split / "relation_distribution.png", 60_000),
        "country_pairs.png": _write_random(split / "country_pairs.png", 80_000),
        "queries_by_month.png": _write_random(split / "queries_by_month.png", 60_000),
    }
    (split / "manifest.json").write_text(json.dumps({"month": "2024-02", "files": files}))
    (split / "README.md").write_text("# MIRAI test split 2024-02 (benchmark)\n" * 200)
    per_month = (total_mb * 10**6 - sum(f["bytes"] for f in files.values())) // DB_MONTHS
    for i in range(DB_MONTHS):
        month = date(2023 + i // 12, i % 12 + 1, 1)  # 2023-01 .. 2024-02
        for table, size in (("events", per_month * 6 // 7), ("news", per_month - per_month * 6 // 7)):
            if sealed:
                write_sealed_bytes(layout, os.urandom(size), layout.database_path(table, month))
            else:
                _write_random(layout.database_path(table, month), size)


def ours_upload(settings: Settings, store) -> None:
    publish_release(MONTH, settings.dataset, settings.release, store)


def ours_download(settings: Settings, store, dest: Path) -> None:
    # As `mirai download`: anonymous, MIRAI_RELEASE_CONCURRENCY files at a time.
    download_release(store, "2024-02", dest, workers=settings.release.concurrency, bar=False)


def defaults_upload(client, bucket: str, prefix: str, objects) -> None:
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    with create_transfer_manager(client, TransferConfig()) as manager:
        futures = [manager.upload(str(o.path), bucket, f"{prefix}/{o.name}") for o in objects]
        for future in futures:
            future.result()


def defaults_download(client, bucket: str, prefix: str, objects, dest: Path) -> None:
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    with create_transfer_manager(client, TransferConfig()) as manager:
        futures = []
        for o in objects:
            (dest / o.name).parent.mkdir(parents=True, exist_ok=True)
            futures.append(manager.download(bucket, f"{prefix}/{o.name}", str(dest / o.name)))
        for future in futures:
            future.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hash-all", action="store_true", help="no database digests: ours hashes every file")
    args = parser.parse_args()
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        }
    )
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    print(machine_summary({"boto3": boto3.__version__}))
    work = Path(tempfile.mkdtemp(prefix="mirai-bench-release-"))
    try:
        data_dir = work / "data"
        build_release(data_dir, args.mb, sealed=not args.hash_all)
        objects = plan_release(MONTH, DatasetSettings(data_dir=data_dir), ReleaseSettings()).objects
        total = sum(o.size for o in objects)
        print(f"release: {len(objects)} files, {total / 1e6:.1f} MB; load average before: {os.getloadavg()}")
        with SeaweedS3(work / "seaweedfs", volume_size_limit_mb=1024) as server:
            # Both sides retry alike (ours: MIRAI_S3_MAX_ATTEMPTS, "standard" mode).
            same = Config(
                retries={"max_attempts": ReleaseSettings().s3_max_attempts, "mode": "standard"},
                s3={"addressing_style": "path"},
            )
            client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", config=same)
            anonymous = boto3.client(
                "s3",
                endpoint_url=server.endpoint,
                region_name="us-east-1",
                config=same.merge(Config(signature_version=UNSIGNED)),
            )
            client.create_bucket(Bucket="bench")
            times: dict[str, list[float]] = {k: [] for k in ("ours_up", "def_up", "ours_down", "def_down")}
            for r in range(args.rounds):
                settings = Settings(
                    dataset=DatasetSettings(data_dir=data_dir),
                    release=ReleaseSettings(
                        uri=f"s3://bench/ours{r}", s3_endpoint_url=server.endpoint, s3_region="us-east-1"
                    ),
                )
                dest = work / f"dl{r}"
                # Clients are made before the clock starts, on both sides (a boto3 client costs
                # 5-80 ms to create): the transfers are what is compared.
                store, anonymous_store = (
                    open_store(settings.dataset, settings.network, settings.release),
                    open_store(settings.dataset, settings.network, settings.release, signed=False),
                )
                steps = {
                    "ours_up": partial(ours_upload, settings, store),
                    "def_up": partial(defaults_upload, client, "bench", f"defaults{r}/releases/2024-02", objects),
                    "ours_down": partial(ours_download, settings, anonymous_store, dest / "ours"),
                    "def_down": partial(
                        defaults_download,
                        anonymous,
                        "bench",
                        f"defaults{r}/releases/2024-02",
                        objects,
                        dest / "defaults",
                    ),
                }
                # Who goes first alternates (the page cache and the server's state still carry
                # over from one step to the next).
                order = (
                    ("ours_up", "def_up", "ours_down", "def_down")
                    if r % 2 == 0
                    else ("def_up", "ours_up", "def_down", "ours_down")
                )
                for name in order:
                    # Every step starts with the previous one's writes on disk (not timed), so no
                    # side pays for the other's writeback; who goes first still alternates.
                    os.sync()
                    started = time.perf_counter()
                    steps[name]()
                    times[name].append(time.perf_counter() - started)
                shutil.rmtree(dest)
                print(
                    f"round {r + 1}: "
                    + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items())
                    + f"; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        median = {k: statistics.median(v) for k, v in times.items()}
        mb = total / 1e6
        for what in ("up", "down"):
            ours, default = median[f"ours_{what}"], median[f"def_{what}"]
            print(
                f"{what}load: ours {mb / ours:.0f} MB/s ({ours:.2f}s), defaults {mb / default:.0f} MB/s "
                f"({default:.2f}s), ratio {default / ours:.2f}x"
            )
        print(f"load average after: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
