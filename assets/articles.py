"""News articles of the well-reported quads: fetched once ever, extracted, OBELICS-filtered."""

from datetime import date

import dagster as dg

from assets.events import daily_quads
from assets.metadata import column_schema, png_bytes_metadata
from assets.owners import DATA_OWNERS
from assets.partitions import daily_partitions
from assets.resources import ArticleFetcher, Dataset, Network, compose
from pipeline.articles.day import ARTICLES_COLUMNS, ARTICLES_VERSION, build_articles
from pipeline.articles.ledger import FETCH_LEDGER_COLUMNS, read_ledger, summarize
from pipeline.storage import DataLayout

# The fetch ledger spans every day (an article is fetched once ever), so it is an asset of its
# own, unpartitioned; each articles run records a new materialisation of it with its counts.
fetch_ledger = dg.AssetSpec(
    "fetch_ledger",
    description="One row per normalised article URL ever selected: status, HTTP code, final URL, "
    "error class, attempts, next retry time (widening schedule), the stored HTML.",
    kinds={"parquet"},
    metadata=column_schema(FETCH_LEDGER_COLUMNS),
    group_name="articles",
    owners=DATA_OWNERS,
)


@dg.asset(
    partitions_def=daily_partitions,
    deps=[daily_quads],
    group_name="articles",
    owners=DATA_OWNERS,
    kinds={"http", "polars", "parquet"},
    code_version=ARTICLES_VERSION,
    metadata=column_schema(ARTICLES_COLUMNS),
    # Fetching talks to thousands of news sites: one articles run at a time per deployment.
    pool="article_fetch",
    description="The day's selected articles (quads with daily_mentions ≥ MIRAI_ARTICLE_MIN_MENTIONS): "
    "title, filtered text, abstract, language, and the OBELICS decision with its first failing filter.",
)
def articles(
    context: dg.AssetExecutionContext, dataset: Dataset, network: Network, fetcher: ArticleFetcher
) -> dg.MaterializeResult:
    settings = compose(dataset, network, fetcher)
    result = build_articles(
        date.fromisoformat(context.partition_key), settings.dataset, settings.network, settings.articles
    )
    profile = settings.articles.article_profile
    from pipeline.articles.funnel import funnel_frame, funnel_png  # with matplotlib: see assets/ingest.py

    funnel = funnel_frame(result.selected, result.articles, profile)
    ledger = read_ledger(DataLayout(settings.dataset.data_dir))
    ledger_counts = summarize(ledger)
    context.log_event(
        dg.AssetMaterialization(
            asset_key="fetch_ledger",
            metadata={
                **column_schema(FETCH_LEDGER_COLUMNS, ledger.schema),
                **{f"urls_{k}" if k != "urls" else k: v for k, v in ledger_counts.items()},
            },
        )
    )
    return dg.MaterializeResult(
        metadata={
            **column_schema(ARTICLES_COLUMNS, result.articles.schema),
            "dagster/row_count": result.articles.height,
            "profile": profile,
            **result.counts,
            "obelics_funnel": png_bytes_metadata("obelics_funnel", funnel_png(funnel, profile)),
        }
    )
