"""The real S3 server of the release tests and bench/release.py: testbed.s3.LocalS3
(SeaweedFS on 127.0.0.1) with fixed test credentials; the fault tests kill and restart it."""

from __future__ import annotations

from pathlib import Path

from testbed.s3 import LocalS3, weed_binary

ACCESS_KEY = "mirai-test-admin"
SECRET_KEY = "mirai-test-secret-never-logged"
# The bucket the readiness probe writes to; tests create their own buckets.
PROBE_BUCKET = "readiness-probe"

__all__ = ["ACCESS_KEY", "SECRET_KEY", "SeaweedS3", "weed_binary"]


def SeaweedS3(root: Path, *, volume_size_limit_mb: int = 256) -> LocalS3:
    return LocalS3(root, PROBE_BUCKET, credentials=(ACCESS_KEY, SECRET_KEY), volume_size_limit_mb=volume_size_limit_mb)
