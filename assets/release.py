"""The monthly public release: split files, event database snapshot, manifest and dataset card,
published once to MIRAI_RELEASE_URI (S3, any S3-compatible store, or a local directory)."""

from datetime import date

import dagster as dg

from assets.owners import DATA_OWNERS
from assets.partitions import monthly_partitions
from assets.resources import Dataset, Network, ReleaseBucket, compose
from assets.splits import test_split
from pipeline.release.layout import MANIFEST_NAME, RELEASE_FORMAT, ReleaseError, release_key
from pipeline.release.publish import ReleaseConflict, publish_release
from pipeline.release.store_uri import open_store


@dg.asset(
    partitions_def=monthly_partitions,
    # In the same run as test_split, Dagster skips this step when a blocking check of test_split
    # fails, so only a split that passed its checks is ever published.
    deps=[test_split],
    group_name="releases",
    owners=DATA_OWNERS,
    kinds={"s3"},
    code_version=RELEASE_FORMAT,
    description="releases/YYYY-MM/ in MIRAI_RELEASE_URI: the split, the event database through the month, "
    "manifest.json (written last) and the dataset card; then releases/index.json and latest.json. "
    "Immutable: a re-run verifies the published objects and changes nothing.",
)
def release(
    context: dg.AssetExecutionContext, dataset: Dataset, network: Network, release_store: ReleaseBucket
) -> dg.MaterializeResult:
    month = date.fromisoformat(context.partition_key)
    settings = compose(dataset, network, release_store)
    try:
        store = open_store(settings.dataset, settings.network, settings.release)
        result = publish_release(month, settings.dataset, settings.release, store, log=context.log.info)
    except ReleaseConflict as exc:
        # Retrying cannot help: an operator must decide what the bucket should hold.
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except ReleaseError as exc:
        raise dg.Failure(description=str(exc)) from exc
    manifest_key = release_key(result.month, MANIFEST_NAME)
    metadata = {
        # Where only: the store's description never carries credentials.
        "store": result.store,
        "manifest_key": manifest_key,
        "manifest_sha256": result.manifest_sha256,
        "uploaded": len(result.uploaded),
        "verified": len(result.verified),
        "bytes_uploaded": result.bytes_uploaded,
        "published_now": result.manifest_written,
        "index_updated": result.index_written,
        "latest_updated": result.latest_written,
        "aborted_uploads": len(result.aborted_uploads),  # left open by an interrupted run
    }
    # A link only under MIRAI_RELEASE_PUBLIC_URL: the store's own address may be gone tomorrow (the
    # demo's S3 server listens on a new port each run), the key stays valid.
    public = store.configured_url(manifest_key)
    if public is not None:
        metadata["manifest_url"] = dg.MetadataValue.url(public)
    return dg.MaterializeResult(metadata=metadata)
