"""Submitted predictions, one partition per submissions/<name>/ in the release store (the
submission sensor adds them): checked, scored and recorded by pipeline/evaluation/submissions.py, a live
round's accepted or refused by pipeline/live/submissions.py (whose ``process`` handles both)."""

from datetime import date

import dagster as dg
import polars as pl

from assets.live import live_round
from assets.metadata import frame_table
from assets.owners import BENCHMARK_OWNERS
from assets.resources import Dataset, Network, ReleaseBucket, compose
from assets.splits import test_split
from pipeline.evaluation.scoring import TABLE_METRICS, scope
from pipeline.evaluation.submissions import RECORD_FORMAT, NotReady, SubmissionError, record_path
from pipeline.live.submissions import LIVE_RECORD_FORMAT, live_record_path, process
from pipeline.markdown import markdown_text, visible_text
from pipeline.release.layout import ReleaseError
from pipeline.release.store_uri import open_store
from pipeline.storage import LockTimeout

submission_partitions = dg.DynamicPartitionsDefinition(name="submissions")
HEADLINE = ("level2_f1", "level1_f1", "mrr")


def _metrics_frame(card: dict) -> pl.DataFrame:
    """The scorecard's metric table (pipeline.evaluation.scoring.markdown's first): value and 95% interval."""
    rows = [
        {"metric": m, "value": e["value"], "ci95_low": e["ci95"][0], "ci95_high": e["ci95"][1]}
        for m in TABLE_METRICS
        for e in [card["metrics"][m]]
    ]
    return pl.DataFrame(
        rows, schema={"metric": pl.String, **dict.fromkeys(("value", "ci95_low", "ci95_high"), pl.Float64)}
    )


def _by_level1_frame(card: dict) -> pl.DataFrame:
    rows = [
        {
            "level-1 code": code,
            "queries": r["queries"],
            "level1_f1": r["level1_f1"],
            "level2_f1": r["level2_f1"],
            "mrr": r["mrr"],
        }
        for code, r in card["by_level1"].items()
    ]
    schema = {"level-1 code": pl.String, "queries": pl.Int64}
    return pl.DataFrame(rows, schema={**schema, **dict.fromkeys(("level1_f1", "level2_f1", "mrr"), pl.Float64)})


@dg.asset(
    partitions_def=submission_partitions,
    # A monthly submission is scored against its month's test_split, a live one checked against its
    # round: which one is in the upload's metadata, so the edges name every partition. Dagster
    # does not follow them for staleness (an AllPartitionMapping from time partitions), so a
    # new month or round leaves earlier submissions as they are.
    deps=[
        dg.AssetDep(test_split, partition_mapping=dg.AllPartitionMapping()),
        dg.AssetDep(live_round, partition_mapping=dg.AllPartitionMapping()),
    ],
    group_name="evaluation",
    owners=BENCHMARK_OWNERS,
    code_version=RECORD_FORMAT,
    description="A submission from the release store's `submissions/<name>/`: scored (strict), contaminated "
    "(scored, never ranked: cutoff not before the month) or rejected (rejection.json written beside it); "
    "one for a live round is accepted (by its deadline, on the store's clock) or rejected. "
    "Recorded in `<data_dir>/submissions/<name>/record.json`; a re-run returns the record unchanged.",
)
def submission(
    context: dg.AssetExecutionContext, dataset: Dataset, network: Network, release_store: ReleaseBucket
) -> dg.MaterializeResult:
    settings = compose(dataset, network, release_store)
    try:
        record = process(
            open_store(settings.dataset, settings.network, settings.release),
            context.partition_key,
            settings.dataset.data_dir,
        )
    except (NotReady, LockTimeout) as exc:  # a later materialisation can succeed: nothing was written
        raise dg.Failure(description=str(exc)) from exc
    except SubmissionError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except ReleaseError as exc:  # the store is unreachable or refused a request
        raise dg.Failure(description=str(exc)) from exc
    card = record.get("scorecard")
    metadata = {
        "status": record["status"],
        "reasons": dg.MetadataValue.md("\n".join(f"- {markdown_text(r)}" for r in record["reasons"]) or "none"),
        # Plain text in the UI, which shows a bidi override or a zero-width space as it acts: shown.
        "model": visible_text(record["model"] or ""),
        "month": record.get("month") or "",
        "record": dg.MetadataValue.path(str(record_path(settings.dataset.data_dir, context.partition_key))),
    }
    if record["format"] == LIVE_RECORD_FORMAT:  # a live round's: accepted or rejected, scored at resolution
        metadata.pop("month")
        metadata["record"] = dg.MetadataValue.path(
            str(live_record_path(settings.dataset.data_dir, date.fromisoformat(record["round"]), context.partition_key))
        )
        metadata.update(
            {
                "round": record["round"],
                "baseline": record["baseline"],
                "submitted_at": record["submitted_at"] or "",
                "deadline": record["deadline"] or "",
            }
        )
    if card is not None:
        metadata["scorecard"] = frame_table(_metrics_frame(card))
        metadata["scorecard by level-1 code"] = frame_table(_by_level1_frame(card))
        metadata["scored"] = scope(card)
        metadata.update({m: card["metrics"][m]["value"] for m in HEADLINE})
        metadata["queries"] = card["queries"]
        metadata["missing"] = card["missing"]["count"]
    return dg.MaterializeResult(metadata=metadata)
