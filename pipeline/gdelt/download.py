"""Download one GDELT file so that only verified bytes ever reach the raw store.

The body streams to a temp file next to its target while size and md5 are computed; the file is
renamed into place only when both match GDELT's index and the zip opens. Anything else is moved to
quarantine with a JSON note saying why, and never parsed. The zip is checked from disk by inflating
its member as a stream (CRC and size cap included), so a small zip that inflates hugely costs one
chunk of memory, not the member.

A zip whose bytes are exactly what the index lists but which does not open (or inflates past the
cap) is ``quarantined``, not ``corrupt``: GDELT serves those very bytes, so fetching again cannot
help, and the slot is left alone until the index lists other bytes for it. So is a file the index
lists larger than a zip of a member at the cap can be (``archive.max_zip_bytes``), without being
downloaded: the listed size bounds what is written to disk and what parsing reads whole.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from pipeline.config import GdeltSettings, NetworkSettings
from pipeline.gdelt.archive import CorruptArchiveError, max_zip_bytes, verify_gdelt_zip
from pipeline.http import (
    RETRYABLE_EXCEPTIONS,
    RetryLog,
    TransientHTTPError,
    describe,
    raise_for_transient,
    with_retries,
)
from pipeline.storage import commit_temp, quarantine_file, temp_path_for

CHUNK = 64 * 1024


class CorruptDownload(Exception):
    """The bytes received are not the bytes GDELT's index lists (size or md5)."""


@dataclass
class FetchResult:
    status: str  # landed | corrupt | quarantined | not_found | failed
    attempts: int
    http_status: int | None = None
    error: str | None = None
    size: int | None = None
    quarantined: list[str] = field(default_factory=list)


def md5_of_file(path: Path) -> tuple[int, str]:
    digest = hashlib.md5()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


def already_landed(target: Path, expected_size: int, expected_md5: str) -> bool:
    """A verified file can be on disk without a ledger row (a crash between the rename and the
    ledger write); re-verify it locally instead of downloading it again."""
    return target.exists() and md5_of_file(target) == (expected_size, expected_md5)


def fetch_verified(
    session: requests.Session,
    url: str,
    target: Path,
    expected_size: int,
    expected_md5: str,
    network: NetworkSettings,
    gdelt: GdeltSettings,
    quarantine_dir: Path,
) -> FetchResult:
    limit = max_zip_bytes(gdelt.max_uncompressed_bytes)
    if expected_size > limit:  # the same bytes would be refused once downloaded (or parsed whole)
        return FetchResult(
            "quarantined",
            0,
            error=f"zip: listed at {expected_size:,} bytes, more than a zip of one member of at most "
            f"{gdelt.max_uncompressed_bytes:,} bytes can take ({limit:,}); not downloaded",
        )
    log = RetryLog()
    quarantined: list[str] = []
    target.parent.mkdir(parents=True, exist_ok=True)

    def attempt() -> FetchResult:
        deadline = time.monotonic() + gdelt.download_deadline_s
        resp = session.get(url, stream=True, timeout=(network.connect_timeout_s, network.read_timeout_s))
        with resp:
            raise_for_transient(resp)
            log.last_status = resp.status_code
            if resp.status_code in (404, 410):
                return FetchResult("not_found", log.attempts, resp.status_code, f"HTTP {resp.status_code}")
            if resp.status_code != 200:
                return FetchResult("failed", log.attempts, resp.status_code, f"HTTP {resp.status_code}")
            temp = temp_path_for(target, sweep=False)  # the caller swept the directory (ingest_day)
            try:
                size, got_md5 = _receive(resp, temp, expected_size, deadline, gdelt.download_deadline_s)
                refused = _refusal(temp, url, size, got_md5, expected_size, expected_md5, gdelt)
                if refused is not None:
                    status, note = refused
                    quarantined.append(str(quarantine_file(temp, quarantine_dir, target.name, note)))
                    if status == "corrupt":
                        raise CorruptDownload(note["reason"])
                    return FetchResult("quarantined", log.attempts, 200, note["reason"], size)
                commit_temp(temp, target)
                return FetchResult("landed", log.attempts, 200, None, size)
            finally:
                temp.unlink(missing_ok=True)

    try:
        result = with_retries(
            attempt,
            attempts=gdelt.download_attempts,
            backoff_base_s=gdelt.backoff_base_s,
            backoff_max_s=gdelt.backoff_max_s,
            log=log,
            retry_on=(CorruptDownload,),
        )
    except CorruptDownload as exc:
        result = FetchResult("corrupt", log.attempts, log.last_status, f"CorruptDownload: {exc}")
    except TransientHTTPError as exc:
        result = FetchResult("failed", log.attempts, exc.status, str(exc))
    except RETRYABLE_EXCEPTIONS as exc:
        result = FetchResult("failed", log.attempts, None, describe(exc))
    result.attempts = log.attempts
    result.quarantined = quarantined
    if result.error is None and log.errors and result.status != "landed":
        result.error = log.errors[-1]
    elif result.status == "landed" and log.errors:
        result.error = f"landed after: {log.errors[-1]}"
    return result


# fetch_verified's steps within one attempt, apart so that the retry logic reads as one page (the
# issue's ~80-line rule).


def _receive(
    resp: requests.Response, temp: Path, expected_size: int, deadline: float, deadline_s: float
) -> tuple[int, str]:
    """Stream the body into ``temp``: the size received and the md5 of what was written. Reading
    stops one chunk past ``expected_size``; past ``deadline`` it raises ``requests.Timeout``."""
    digest, size = hashlib.md5(), 0
    with open(temp, "wb") as fh:
        for chunk in resp.iter_content(CHUNK):
            size += len(chunk)
            if size > expected_size:
                break  # more than the index lists: already wrong, stop reading
            digest.update(chunk)
            fh.write(chunk)
            if time.monotonic() > deadline:
                raise requests.Timeout(f"total deadline of {deadline_s:.0f}s exceeded")
    return size, digest.hexdigest()


def _refusal(
    temp: Path, url: str, size: int, got_md5: str, expected_size: int, expected_md5: str, gdelt: GdeltSettings
) -> tuple[str, dict] | None:
    """None when the bytes in ``temp`` may land; else the slot's status and the note to quarantine
    them with: ``corrupt`` when they are not what the index lists (fetched again), ``quarantined``
    when they are but the zip does not open or inflates past the cap."""
    problem = None
    if size != expected_size:
        problem = f"size {'>' if size > expected_size else ''}{size} != listed {expected_size}"
    elif got_md5 != expected_md5:
        problem = f"md5 {got_md5} != listed {expected_md5}"
    if problem is None:
        try:
            verify_gdelt_zip(temp, max_uncompressed_bytes=gdelt.max_uncompressed_bytes)
        except CorruptArchiveError as exc:
            # The bytes are exactly what GDELT lists, so fetching again won't help.
            return "quarantined", {
                "url": url,
                "reason": f"zip: {exc}",
                "size": size,
                "md5": got_md5,
                "action": "not fetched again until GDELT's index lists other bytes for it",
            }
        return None
    return "corrupt", {
        "url": url,
        "reason": problem,
        "expected_size": expected_size,
        "expected_md5": expected_md5,
        "received_size": size,
        "received_md5": got_md5 if size <= expected_size else None,
    }
