"""One pipeline stage in its own process, so a test can SIGKILL it: ``python -m tests.reliability.driver
<stage> <args…>`` with the settings in the environment (pipeline.config names).

Stages: ``ingest DAY NOW`` (ingest_day + parse_day of both kinds), ``normalise DAY…`` (build_events
then build_daily_quads per day, in order), ``articles DAY NOW``, ``split MONTH NOW`` (the event
database, then the split), ``release MONTH STORE_DIR|s3`` (publish_release).

``RELIABILITY_KILL_AT=N`` makes the process SIGKILL itself just before its N-th commit: the N-th
``os.replace``/``os.rename``/``os.link`` (every atomic write, download, split swap and LocalStore
link goes through one of them) or the N-th object sent to a release store. The temp file of that
commit is written and fsynced but not renamed, which is the worst moment for a crash: it is what
an orphan looks like. Counting commits instead of waiting a time makes the kill point exact and
reproducible from the test's seed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import date, datetime
from pathlib import Path

KILL_ENV = "RELIABILITY_KILL_AT"
# The manifest records `git describe --dirty`; the lead may commit while a test runs, which would
# make two otherwise identical runs differ. The version is not what these tests are about.
FIXED_CODE_VERSION = "reliability-test"


COMMITS = [0]


def _arm_kill(limit: int | None) -> None:
    """Count commits (printed at the end, so a test can pick a kill point inside a clean run's
    range) and, with a limit, SIGKILL this process just before the limit-th one."""
    lock = threading.Lock()  # downloads commit from a thread pool
    count = COMMITS

    def counted(original):
        def wrapper(*args, **kwargs):
            with lock:
                count[0] += 1
                if limit is not None and count[0] >= limit:
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        return wrapper

    for name in ("replace", "rename", "link"):
        setattr(os, name, counted(getattr(os, name)))

    # Uploads to S3 never touch the local filesystem: count each object sent instead.
    from pipeline.release import s3_store

    for cls in (s3_store.S3Store,):
        put_files, put_bytes = cls.put_files, cls.put_bytes

        def one_by_one(self, files, *, cache_control, progress, _orig=put_files):
            for item in files:
                counted(lambda: None)()
                _orig(self, [item], cache_control=cache_control, progress=progress)

        def bytes_counted(self, key, data, *, cache_control, if_absent, _orig=put_bytes):
            counted(lambda: None)()
            return _orig(self, key, data, cache_control=cache_control, if_absent=if_absent)

        cls.put_files, cls.put_bytes = one_by_one, bytes_counted


def main(argv: list[str]) -> None:
    import pipeline.splits.split
    from pipeline.config import Settings

    pipeline.splits.split.code_version = lambda: FIXED_CODE_VERSION
    _arm_kill(int(os.environ[KILL_ENV]) if os.environ.get(KILL_ENV) else None)
    settings = Settings.from_env()
    stage, args = argv[0], argv[1:]
    if stage == "ingest":
        from pipeline.gdelt.ingest import ingest_day, parse_day

        day, now = date.fromisoformat(args[0]), datetime.fromisoformat(args[1])
        ingest_day(day, settings.dataset, settings.network, settings.gdelt, now=now)
        for kind in ("export", "mentions"):
            parse_day(day, kind, settings.dataset, settings.gdelt)
    elif stage == "normalise":
        from pipeline.events.daily import build_daily_quads, build_events

        for arg in args:
            build_events(date.fromisoformat(arg), settings.dataset)
            build_daily_quads(date.fromisoformat(arg), settings.dataset)
    elif stage == "articles":
        from pipeline.articles.day import build_articles

        build_articles(
            date.fromisoformat(args[0]),
            settings.dataset,
            settings.network,
            settings.articles,
            now=datetime.fromisoformat(args[1]),
        )
    elif stage == "split":
        from pipeline.splits.database import build_event_database
        from pipeline.splits.split import build_split

        month = date.fromisoformat(args[0])
        build_event_database(month, settings.dataset, settings.articles)
        build_split(month, settings.dataset, settings.gdelt, now=datetime.fromisoformat(args[1]))
    elif stage == "release":
        from pipeline.release.publish import publish_release
        from pipeline.release.store import LocalStore
        from pipeline.release.store_uri import open_store

        month = date.fromisoformat(args[0])
        # A fixed public URL: the index's links must not depend on where the test put the store.
        store = (
            open_store(settings.dataset, settings.network, settings.release)
            if args[1] == "s3"
            else LocalStore(Path(args[1]), "https://releases.test/mirai")
        )
        publish_release(month, settings.dataset, settings.release, store)
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    print(f"done commits={COMMITS[0]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
