"""Checks on the monthly split.

``split_leakage_audit`` is blocking: a split through which an agent could see a record dated
after t − distance (or whose month does not start after its history cutoff) stops everything
downstream in the run — the release above all (docs/splits.md, pipeline.agent_api.audit.leakage_audit).
"""

from datetime import date

import dagster as dg

from assets.partitions import monthly_partitions
from assets.resources import Dataset
from assets.splits import test_split
from pipeline.agent_api.audit import leakage_audit
from pipeline.markdown import markdown_text

# How many violations the check's metadata lists in full (the count is always exact).
SHOWN_VIOLATIONS = 20


@dg.asset_check(
    asset=test_split,
    partitions_def=monthly_partitions,
    blocking=True,
    description="Zero records after t − distance visible through "
    "any agent API function (code blocks included) for every query date; month after the history cutoff.",
)
def split_leakage_audit(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    month = date.fromisoformat(context.partition_key)
    audit = leakage_audit(dataset.settings(), month)
    return dg.AssetCheckResult(
        passed=not audit.violations,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "month": f"{audit.month:%Y-%m}",
            "query dates audited": audit.dates_audited,
            "sandbox probed on": ", ".join(d.isoformat() for d in audit.sandbox_dates) or "none",
            "violations": len(audit.violations),
            "first violations": dg.MetadataValue.md(
                "\n".join(f"- {markdown_text(v)}" for v in audit.violations[:SHOWN_VIOLATIONS]) or "none"
            ),
        },
    )
