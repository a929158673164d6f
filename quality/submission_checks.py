"""The check on a submission's record: a run that refused a submission says so on the asset,
not only in its metadata (the run itself succeeds: refusing bad input is the pipeline working)."""

import dagster as dg

from assets.resources import Dataset, compose
from assets.submissions import submission, submission_partitions
from pipeline.evaluation.submissions import read_record
from pipeline.live.submissions import read_live_record
from pipeline.markdown import markdown_text

# How many refusal reasons the description quotes (the metadata counts them all).
SHOWN_REASONS = 5


@dg.asset_check(
    asset=submission,
    partitions_def=submission_partitions,
    blocking=False,
    description="Warns when the submission was rejected (its metadata was invalid, its predictions "
    "did not score strictly, a live one came after the deadline...), quoting the reasons; passes when "
    "it was scored, contaminated (scored, not ranked) or accepted for a live round.",
)
def submission_accepted(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    name, data_dir = context.partition_key, compose(dataset).dataset.data_dir
    record = read_record(data_dir, name) or read_live_record(data_dir, name)
    if record is None:  # the asset wrote no record: its run failed, and says why
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.WARN, description="no record: the submission was not processed"
        )
    reasons = record["reasons"]
    metadata = {"status": record["status"], "reasons": len(reasons)}
    if record["status"] != "rejected":
        return dg.AssetCheckResult(passed=True, metadata=metadata)
    # Reasons quote submitter text (file names, fields): inert Markdown, as in the asset's metadata.
    quoted = "; ".join(markdown_text(r) for r in reasons[:SHOWN_REASONS])
    more = f" (and {len(reasons) - SHOWN_REASONS} more)" if len(reasons) > SHOWN_REASONS else ""
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"rejected: {quoted}{more}",
        metadata=metadata,
    )
