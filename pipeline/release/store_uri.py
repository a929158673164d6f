"""Opening the release store MIRAI_RELEASE_URI names (``open_store``): s3://bucket/prefix opens an
``S3Store``, file:///path or a plain path a ``LocalStore``, and an empty URI the embedded default,
<data_dir>/releases-bucket. Apart from the stores so that the store interface imports no store
that implements it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pipeline.config import Settings
from pipeline.release.layout import ReleaseError
from pipeline.release.s3_store import S3Store
from pipeline.release.store import LocalStore, ReleaseStore


def open_store(settings: Settings, *, uri: str | None = None, signed: bool = True) -> ReleaseStore:
    """The store MIRAI_RELEASE_URI names: s3://bucket/prefix, file:///path or a path; empty means
    <data_dir>/releases-bucket."""
    uri = uri if uri is not None else settings.release.uri
    if not uri:
        return LocalStore(settings.dataset.data_dir / "releases-bucket", settings.release.public_url)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ReleaseError(f"MIRAI_RELEASE_URI={uri!r}: expected s3://bucket/prefix")
        return S3Store(parsed.netloc, parsed.path, settings.release, settings.network, signed=signed)
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.path), settings.release.public_url)
    if parsed.scheme:
        raise ReleaseError(f"MIRAI_RELEASE_URI={uri!r}: only s3://, file:// and plain paths are supported")
    return LocalStore(Path(uri), settings.release.public_url)
