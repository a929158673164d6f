"""Opening the release store MIRAI_RELEASE_URI names (``open_store``): s3://bucket/prefix opens an
``S3Store``, file:///path or a plain path a ``LocalStore``, and an empty URI the embedded default,
<data_dir>/releases-bucket. Apart from the stores so that the store interface imports no store
that implements it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pipeline.config import DatasetSettings, NetworkSettings, ReleaseSettings
from pipeline.release.layout import ReleaseError
from pipeline.release.s3_store import S3Store
from pipeline.release.store import LocalStore, ReleaseStore


def open_store(
    dataset: DatasetSettings,
    network: NetworkSettings,
    release: ReleaseSettings,
    *,
    uri: str | None = None,
    signed: bool = True,
) -> ReleaseStore:
    """The store MIRAI_RELEASE_URI names: s3://bucket/prefix, file:///path or a path; empty means
    <data_dir>/releases-bucket."""
    uri = uri if uri is not None else release.uri
    if not uri:
        return LocalStore(dataset.data_dir / "releases-bucket", release.public_url)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ReleaseError(f"MIRAI_RELEASE_URI={uri!r}: expected s3://bucket/prefix")
        return S3Store(parsed.netloc, parsed.path, release, network, signed=signed)
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.path), release.public_url)
    if parsed.scheme:
        raise ReleaseError(f"MIRAI_RELEASE_URI={uri!r}: only s3://, file:// and plain paths are supported")
    return LocalStore(Path(uri), release.public_url)
