"""The dataset card of a monthly split: its README.md and the two figures it embeds.

The card follows the Hugging Face dataset-card layout (YAML front matter, then Markdown) with the
datasheet sections of Gebru et al. (2021), adapted from MIRAI's own datasheet (paper, Appendix J).
Everything in it comes from the manifest and the query frames, never from the clock, so rebuilding
a split rebuilds the same card and the same PNG bytes, and the release's checksums stay stable.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import matplotlib.style
import numpy as np
import polars as pl
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pipeline.reference.tables import relation_table
from pipeline.release.layout import PAIRS_FIGURE, RELATION_FIGURE  # names a release may hold
from pipeline.storage import atomic_write_bytes

TOP_COUNTRIES = 20
LONG_ANSWER = 10
# A line width PyYAML never reaches: the front matter's strings stay on one line each.
UNWRAPPED = 2**31 - 1

# MIRAI's grouping of the 20 root codes (mirai_quad_class), not GDELT's QuadClass: the two differ
# on 05, 09, 15 and 16, and MIRAI's quad-level metrics use this one.
QUAD_NAMES = {1: "Verbal cooperation", 2: "Material cooperation", 3: "Verbal conflict", 4: "Material conflict"}
# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
QUAD_COLOURS = {1: "#56B4E9", 2: "#0072B2", 3: "#E69F00", 4: "#D55E00"}

GDELT_TERMS = "https://www.gdeltproject.org/about.html#termsfuse"

FIELD_DESCRIPTIONS = {
    "query_id": 'Identifier "YYYY-MM-NNNNN", numbered in (date, s, o) order',
    "date": "Day t the query asks about (UTC)",
    "s": "Subject country, ISO 3166-1 alpha-3 (XKX for Kosovo)",
    "o": "Object country, ISO 3166-1 alpha-3",
    "s_name": "Subject country name",
    "o_name": "Object country name",
    "s_region": "Subject country's region",
    "o_region": "Object country's region",
    "query_code": 'The query as MIRAI writes it, e.g. "(2024-01-03, USA, ?, CHN)"',
    "answer_list": "Sorted unique CAMEO level-2 codes s took toward o on day t (the label)",
    "answer_level1": "Sorted unique CAMEO level-1 codes of answer_list",
    "answer_dict": 'JSON {"01": ["010", "013"], ...}: level-2 codes under their level-1 code, MIRAI\'s answer format',
    "daily_mentions": "GDELT mentions summed over the query's quads in the event database",
    "n_articles": "Distinct kept articles over the query's quads",
    "min_articles": "Fewest kept articles of any test-grade quad of the query",
}

ARTICLE_COUNT_DESCRIPTIONS = {
    "fetched": "pages fetched",
    "failed": "fetches that failed for good",
    "stored": "articles extracted and stored",
    "kept": "articles that passed the OBELICS filters",
    "linked": "kept articles linked to an event of the database",
}

THRESHOLD_DESCRIPTIONS = {
    "database_min_mentions": "a (date, s, r, o) quad enters the event database with at least this many daily mentions",
    "test_min_mentions": "a quad is test-grade with at least this many daily mentions",
    "test_min_articles": "a test-grade quad also needs at least this many kept (OBELICS-filtered) articles",
}

# ---------------------------------------------------------------------------------------------
# Counting (shared by the figures and the card)
# ---------------------------------------------------------------------------------------------


def _level1_table() -> pl.DataFrame:
    """The 20 root codes with their name and MIRAI quad class, in code order."""
    return relation_table().select("level1", "level1_name", "mirai_quad_class").unique().sort("level1")


def level1_counts(queries: pl.DataFrame) -> pl.DataFrame:
    """Queries whose answer includes each level-1 code; all 20 codes, zero when absent."""
    counts = (
        queries.select(pl.col("answer_level1").explode().alias("level1"))
        .drop_nulls()
        .group_by("level1")
        .agg(pl.len().alias("queries"))
    )
    return (
        _level1_table()
        .join(counts, on="level1", how="left")
        .with_columns(pl.col("queries").fill_null(0).cast(pl.Int64))
    )


def quad_counts(queries: pl.DataFrame) -> pl.DataFrame:
    """Queries whose answer includes at least one relation of each quad class (a query with
    relations in two classes counts in both, so the column can sum to more than the queries)."""
    per_query = (
        queries.select(pl.int_range(pl.len()).alias("row"), pl.col("answer_level1").alias("level1"))
        .explode("level1")
        .join(_level1_table(), on="level1")
        .select("row", "mirai_quad_class")
        .unique()
        .group_by("mirai_quad_class")
        .agg(pl.len().alias("queries"))
    )
    return (
        pl.DataFrame({"mirai_quad_class": list(QUAD_NAMES)}, schema={"mirai_quad_class": pl.Int8})
        .join(per_query, on="mirai_quad_class", how="left")
        .with_columns(pl.col("queries").fill_null(0).cast(pl.Int64))
    )


def country_involvement(queries: pl.DataFrame) -> pl.DataFrame:
    """Queries per country as s or o, most involved first (ties by code, for a stable order)."""
    return (
        pl.concat([queries.select(country="s"), queries.select(country="o")])
        .group_by("country")
        .agg(pl.len().alias("queries"))
        .sort(["queries", "country"], descending=[True, False])
    )


def pair_matrix(queries: pl.DataFrame, countries: list[str]) -> np.ndarray:
    """Query counts by (s, o) over the given countries: rows are s, columns o."""
    index = {code: i for i, code in enumerate(countries)}
    pairs = (
        queries.filter(pl.col("s").is_in(countries) & pl.col("o").is_in(countries))
        .group_by("s", "o")
        .agg(pl.len().alias("n"))
        .with_columns(
            pl.col("s").replace_strict(index, return_dtype=pl.Int64).alias("i"),
            pl.col("o").replace_strict(index, return_dtype=pl.Int64).alias("j"),
        )
    )
    matrix = np.zeros((len(countries), len(countries)), dtype=np.int64)
    matrix[pairs["i"].to_numpy(), pairs["j"].to_numpy()] = pairs["n"].to_numpy()
    return matrix


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def render_figures(queries: pl.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Write relation_distribution.png and country_pairs.png into out_dir; {file name: path}.

    The same frame gives byte-identical files, so their sha256 in the manifest is reproducible.
    """
    out_dir = Path(out_dir)
    paths = {}
    # matplotlib's built-in defaults for drawing and saving, so a matplotlibrc on the machine
    # cannot change the published bytes.
    with matplotlib.style.context("default"):
        for name, draw in ((RELATION_FIGURE, _relation_figure), (PAIRS_FIGURE, _pairs_figure)):
            paths[name] = out_dir / name
            atomic_write_bytes(paths[name], _png_bytes(draw(queries)))
    return paths


def _new_figure(width: float, height: float) -> Figure:
    # A bare Figure on an Agg canvas: no pyplot, so no global figure registry or backend switch
    # in the Dagster process, and nothing ever tries to open a window.
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # Agg PNGs carry no timestamp; "Software" would carry the matplotlib version, which would
    # change the bytes (and the published sha256) on a mere library upgrade.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _no_queries(fig: Figure, title: str) -> Figure:
    fig.suptitle(title, fontsize=13)
    fig.text(0.5, 0.5, "no queries", ha="center", va="center", fontsize=18, color="0.4")
    return fig


def _relation_figure(queries: pl.DataFrame) -> Figure:
    fig = _new_figure(12, 7)
    title = f"Answer relations by CAMEO level-1 code ({queries.height:,} queries)"
    if queries.is_empty():
        return _no_queries(fig, title)
    left, right = fig.subplots(1, 2, width_ratios=[3, 1])
    _level1_panel(left, level1_counts(queries))
    _quad_panel(right, quad_counts(queries))
    fig.suptitle(title, fontsize=13)
    # Below both panels, where no bar can run into it.
    handles = [Patch(color=QUAD_COLOURS[q], label=f"{q} {name}") for q, name in QUAD_NAMES.items()]
    fig.legend(handles=handles, title="MIRAI quad class", loc="outside lower center", ncols=4, fontsize=9)
    return fig


def _level1_panel(ax, counts: pl.DataFrame) -> None:
    labels = [f"{code}  {name}" for code, name in counts.select("level1", "level1_name").iter_rows()]
    values = counts["queries"].to_list()
    colours = [QUAD_COLOURS[q] for q in counts["mirai_quad_class"].to_list()]
    y = np.arange(len(labels))
    bars = ax.barh(y, values, color=colours)
    ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_yticks(y, labels, fontsize=9)
    ax.invert_yaxis()  # 01 at the top, as CAMEO lists them
    ax.set_xlabel("queries whose answer includes the code")
    ax.margins(x=0.1)


def _quad_panel(ax, counts: pl.DataFrame) -> None:
    classes = counts["mirai_quad_class"].to_list()
    y = np.arange(len(classes))
    bars = ax.barh(y, counts["queries"].to_list(), color=[QUAD_COLOURS[q] for q in classes])
    ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_yticks(y, [QUAD_NAMES[q].replace(" ", "\n") for q in classes], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("queries with a relation\nin the class")
    ax.set_title("By quad class", fontsize=11)
    ax.margins(x=0.15)


def _pairs_figure(queries: pl.DataFrame) -> Figure:
    fig = _new_figure(10, 9)
    if queries.is_empty():
        return _no_queries(fig, "Queries by (subject, object) country")
    countries = country_involvement(queries).head(TOP_COUNTRIES)["country"].to_list()
    matrix = pair_matrix(queries, countries)
    ax = fig.subplots()
    # The diagonal (s == o) cannot hold queries (domestic events are dropped): grey, not "zero".
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="0.8")
    image = ax.imshow(np.ma.masked_where(np.eye(len(countries), dtype=bool), matrix), cmap=cmap, vmin=0)
    ax.set_xticks(range(len(countries)), countries, rotation=90, fontsize=9)
    ax.set_yticks(range(len(countries)), countries, fontsize=9)
    ax.set_xlabel("object o")
    ax.set_ylabel("subject s")
    _annotate_cells(ax, matrix)
    fig.colorbar(image, ax=ax, shrink=0.8, label="queries", ticks=MaxNLocator(integer=True))  # counts: no 0.2
    ax.set_title(
        f"Queries by (s, o) for the {len(countries)} countries in most queries\n"
        f"(these cells hold {int(matrix.sum()):,} of {queries.height:,} queries)",
        fontsize=12,
    )
    return fig


def _annotate_cells(ax, matrix: np.ndarray) -> None:
    # Counts in the non-empty cells; white on the dark half of the colour scale to stay legible.
    dark = matrix.max() / 2
    for i, j in zip(*np.nonzero(matrix)):
        ax.text(
            j,
            i,
            str(matrix[i, j]),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if matrix[i, j] > dark else "black",
        )


# ---------------------------------------------------------------------------------------------
# The card
# ---------------------------------------------------------------------------------------------


def dataset_card(manifest: dict, queries: pl.DataFrame, sample: pl.DataFrame, figures: dict[str, Path]) -> str:
    """The split's README.md. Figure links are relative: an absolute path is linked by its file
    name (the README is written next to the figures), a relative one as given.

    Raises ValueError when the manifest's query counts disagree with the frames: a card must
    describe the files it ships with.
    """
    counts = manifest.get("counts") or {}
    for key, frame in (("queries", queries), ("sample", sample)):
        if key in counts and counts[key] != frame.height:
            raise ValueError(f"manifest counts {key}={counts[key]} but the frame has {frame.height} rows")
    sections = [
        _front_matter(manifest, queries),
        _intro(manifest),
        _motivation(manifest),
        _composition(manifest, queries, sample),
        _collection(manifest),
        _preprocessing(manifest),
        _uses(manifest),
        _evaluate(manifest),
        _distribution(),
        _maintenance(manifest),
        _deviations(manifest),
        _figures(figures),
        _files(manifest),
        _citation(),
    ]
    return "\n\n".join(s.strip("\n") for s in sections) + "\n"


def _get(mapping: dict | None, *keys: str, default: str = "not recorded"):
    """A nested optional manifest value, or a placeholder saying it was not recorded."""
    for key in keys:
        if not isinstance(mapping, dict) or mapping.get(key) is None:
            return default
        mapping = mapping[key]
    return mapping


def _num(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _size_category(rows: int) -> str:
    """Hugging Face's size_categories bucket for a row count."""
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")]
    return next((label for bound, label in bounds if rows < bound), "1M<n<10M")


def _generated(manifest: dict) -> str | None:
    """The description of the generated data the split was built from, or None for GDELT's feed."""
    source = manifest.get("source")
    return (
        str(source.get("description") or "generated data")
        if isinstance(source, dict) and source.get("generated")
        else None
    )


def _source_line(manifest: dict) -> str:
    source = manifest.get("source")
    return str(source.get("description", "not recorded")) if isinstance(source, dict) else "not recorded"


def _front_matter(manifest: dict, queries: pl.DataFrame) -> str:
    generated = _generated(manifest)
    meta = {
        # The card's first lines say when the data are not GDELT's (a demo release must not pass
        # for a real one).
        "pretty_name": (
            f"MIRAI test split {manifest['month']} (GENERATED data, not GDELT: {generated})"
            if generated
            else f"MIRAI test split {manifest['month']} (rebuilt from GDELT 2.0)"
        ),
        # GDELT's terms are not an SPDX licence, hence "other" with a name and a link.
        "license": "other",
        "license_name": "gdelt-terms-of-use",
        "license_link": GDELT_TERMS,
        "language": ["en"],
        "annotations_creators": ["machine-generated"],
        "source_datasets": ["original"],
        "task_categories": ["question-answering", "text-classification"],
        "task_ids": ["multi-label-classification"],
        "size_categories": [_size_category(queries.height)],
        "configs": [
            {"config_name": "queries", "default": True, "data_files": [{"split": "test", "path": "queries.parquet"}]},
            {"config_name": "queries_sample", "data_files": [{"split": "test", "path": "queries_sample.parquet"}]},
        ],
        "tags": [
            "forecasting",
            "event-forecasting",
            "international-relations",
            "gdelt",
            "cameo",
            "llm-agents",
            "mirai",
            *(["synthetic"] if generated else []),
        ],
    }
    # Block style in insertion order, as huggingface_hub's CardData.to_yaml writes it
    # (src/huggingface_hub/repocard_data.py);
    # unwrapped so that the first line names the split whole. safe_dump quotes every string YAML
    # would read as something else ("yes", "2024-01").
    block = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, default_flow_style=False, width=UNWRAPPED)
    return "---\n" + block + "---"


def _override_note(manifest: dict) -> str:
    override = manifest.get("override")
    if not override:
        return "Released without a manual override of the pipeline's release checks."
    return (
        f"**Released with a manual override** of the pipeline's release checks by {_get(override, 'by')} "
        f"at {_get(override, 'at')}. Reason: {_get(override, 'reason')}"
    )


def _intro(manifest: dict) -> str:
    month = manifest["month"]
    generated = _generated(manifest)
    facts = [
        ("month", month),
        ("source", _source_line(manifest)),
        ("dataset version", _get(manifest, "dataset_version")),
        ("split version", _get(manifest, "split_version")),
        ("history cutoff", _get(manifest, "history_cutoff")),
        ("temporal distance (days)", _get(manifest, "distance_days")),
        ("sampler", _get(manifest, "sampler_version")),
        ("seed", _get(manifest, "seed")),
        ("pipeline version", _get(manifest, "versions", "code")),
    ]
    override = f"\n> {_override_note(manifest)}\n" if manifest.get("override") else ""
    if generated:
        heading = f"# MIRAI test split {month}: GENERATED data, not GDELT"
        origin = (
            f"> **Generated data, not GDELT.** Built from {generated}: its events, articles and queries\n"
            "> are synthetic. Use it to try the pipeline and its tools, never to measure forecasting.\n\n"
            f"Forecasting queries for {month} in the format of [MIRAI](https://arxiv.org/abs/2407.01231)\n"
            "(Ye et al., 2024), built by mirai-pipeline from generated data in the format of the\n"
            "[GDELT](https://www.gdeltproject.org/) 2.0 event feed."
        )
    else:
        heading = f"# MIRAI test split {month}"
        origin = (
            f"Forecasting queries for {month} in the format of [MIRAI](https://arxiv.org/abs/2407.01231)\n"
            "(Ye et al., 2024), rebuilt by mirai-pipeline from the [GDELT](https://www.gdeltproject.org/) 2.0\n"
            "event feed."
        )
    return f"""
{heading}

{origin} A query `(t, s, ?, o)` asks which CAMEO relations country `s` took toward country `o`
on day `t`; an agent answers from the event and news database as it stood a few days earlier
(the temporal distance below).
{override}
{_table(("", ""), facts)}
"""


def _motivation(manifest: dict) -> str:
    return f"""
## Motivation

**For what purpose was the dataset created?** To evaluate LLM agents as forecasters of
international events, as MIRAI does, on a test month later than a model's training cutoff. MIRAI's
own splits stop at 2024-02; this split ({manifest["month"]}) is one of the monthly splits rebuilt with
the same construction, so newly released models can be evaluated without contamination.

**Who created the dataset?** It is built automatically by mirai-pipeline, an open re-implementation
of MIRAI's data construction; MIRAI itself was created by university researchers (Ye et al., 2024).
The underlying events are coded by the GDELT Project from worldwide news.

**Who funded it?** The pipeline records no funding; MIRAI's datasheet names its authors' academic
institutions.
"""


def frame_stats(df: pl.DataFrame) -> dict[str, object]:
    """The composition numbers of one query frame (queries or sample)."""
    row = df.select(
        pl.len().alias("queries"),
        pl.concat_list("s", "o").explode().n_unique().alias("countries"),
        pl.struct("s", "o").n_unique().alias("pairs"),
        pl.col("answer_level1").explode().drop_nulls().n_unique().alias("level1"),
        pl.col("answer_list").explode().drop_nulls().n_unique().alias("level2"),
        pl.col("date").min().cast(pl.String).alias("first"),
        pl.col("date").max().cast(pl.String).alias("last"),
        pl.col("date").n_unique().alias("days"),
    ).row(0, named=True)
    return {key: "–" if value is None else value for key, value in row.items()}  # dates of an empty frame


def answer_lengths(df: pl.DataFrame) -> pl.DataFrame:
    """Queries per number of relations in the answer, at level 2 and level 1; lengths from
    LONG_ANSWER up share one row ("10+") so a few huge answers do not stretch the table."""

    def by_length(column: str) -> pl.DataFrame:
        length = pl.col(column).list.len().clip(upper_bound=LONG_ANSWER).alias("relations")
        return df.group_by(length).agg(pl.len().alias(column))

    return (
        by_length("answer_list")
        .join(by_length("answer_level1"), on="relations", how="full", coalesce=True)
        .with_columns(pl.col("answer_list", "answer_level1").fill_null(0))
        .sort("relations")
        .select(
            pl.when(pl.col("relations") == LONG_ANSWER)
            .then(pl.lit(f"{LONG_ANSWER}+"))
            .otherwise(pl.col("relations").cast(pl.String))
            .alias("relations"),
            pl.col("answer_list").alias("level2"),
            pl.col("answer_level1").alias("level1"),
        )
    )


def _length_summary(df: pl.DataFrame) -> str:
    if df.is_empty():
        return "no queries"
    lengths = df.select(pl.col("answer_list").list.len())
    stats = lengths.select(
        pl.all().min().alias("min"),
        pl.all().median().alias("median"),
        pl.all().mean().alias("mean"),
        pl.all().max().alias("max"),
    ).row(0, named=True)
    return f"min {stats['min']}, median {stats['median']:g}, mean {stats['mean']:.2f}, max {stats['max']}"


def _missing_note(queries: pl.DataFrame) -> str:
    nulls = queries.null_count().unpivot(variable_name="field", value_name="nulls").filter(pl.col("nulls") > 0)
    if nulls.is_empty():
        return "No field is null."
    return "Null values: " + ", ".join(f"`{f}` {_num(n)}" for f, n in nulls.iter_rows()) + "."


def _composition(manifest: dict, queries: pl.DataFrame, sample: pl.DataFrame) -> str:
    full, sub = frame_stats(queries), frame_stats(sample)
    n_level2 = relation_table().height
    rows = [
        ("queries", _num(full["queries"]), _num(sub["queries"])),
        ("distinct countries (s or o)", full["countries"], sub["countries"]),
        ("distinct (s, o) pairs", full["pairs"], sub["pairs"]),
        ("level-1 relations in answers (of 20)", full["level1"], sub["level1"]),
        (f"level-2 relations in answers (of {n_level2})", full["level2"], sub["level2"]),
        ("first date", full["first"], sub["first"]),
        ("last date", full["last"], sub["last"]),
        ("days with queries", full["days"], sub["days"]),
        ("level-2 relations per answer", _length_summary(queries), _length_summary(sample)),
    ]
    database = [
        ("test-grade quads", _num(_get(manifest, "counts", "test_grade_quads"))),
        ("event database rows (quads)", _num(_get(manifest, "counts", "database_events"))),
        ("news database articles", _num(_get(manifest, "counts", "database_articles"))),
    ]
    lengths = answer_lengths(queries)
    quads = quad_counts(queries).with_columns(
        pl.col("mirai_quad_class").replace_strict(QUAD_NAMES, return_dtype=pl.String).alias("name")
    )
    # From the frame: the card describes the file as it was written.
    fields = [(f"`{name}`", f"`{dtype}`", FIELD_DESCRIPTIONS.get(name, "")) for name, dtype in queries.schema.items()]
    return f"""
## Composition

**What do the instances represent?** Each row is one forecasting query `(t, s, ?, o)` about the
month {manifest["month"]}: a day, a subject country and an object country between which GDELT
recorded well-reported events that day. The label is the set of CAMEO level-2 relations `s` took
toward `o` on day `t` (MIRAI's multi-label answer), also given grouped by level-1 code.

**How many instances are there?** `queries.parquet` holds every query of the month;
`queries_sample.parquet` is MIRAI's balanced sample of {_num(_get(manifest, "sample_size"))} queries
(sampler `{_get(manifest, "sampler_version")}`, seed {_get(manifest, "seed")}), spread over dates,
countries and relation types, for evaluations that cannot afford the full set.

{_table(("", "queries.parquet", "queries_sample.parquet"), rows)}

Agents query a database built from the same pipeline (not part of this split):

{_table(("", "count"), database)}

Queries by number of relations in the answer:

{_table(("relations", "queries (level 2)", "queries (level 1)"), [tuple(r) for r in lengths.iter_rows()])}

Queries whose answer includes each MIRAI quad class (a query can count in several):

{_table(("quad class", "name", "queries"), [tuple(r) for r in quads.select("mirai_quad_class", "name", "queries").iter_rows()])}

Fields:

{_table(("field", "type", "description"), fields)}

**Is any information missing?** {_missing_note(queries)} Article texts are not in the split (see
Distribution); the news database links each event to its article URLs.

**Recommended splits.** This is a test split. For a query on day `t`, an agent sees events and news
dated up to `t` minus the temporal distance ({_get(manifest, "distance_days")} day(s), MIRAI's `l`).
The history cutoff ({_get(manifest, "history_cutoff")}) is the last day before the test month: data up
to it precede every query and can be used freely for training or validation.

**Errors, noise, redundancy.** GDELT codes events automatically from news text, so relations and
actors carry coding errors, and one real-world event can appear under several relations. The
mention thresholds keep widely reported events only, which favours countries with large news
coverage (see the country-pair figure).

**Self-contained?** The split is. The news database it is meant to be used with stores article URLs
and the filtered texts of the articles.

**Confidential or offensive content?** No confidential data: everything comes from public news.
Queries are about states, not people. Relations include conflict (threats, assaults, fighting,
mass violence), which some readers may find distressing.
"""


def _slot_counts(manifest: dict) -> str:
    slots = _get(manifest, "counts", "slots", default={})
    if not slots:
        return "not recorded"
    return ", ".join(f"{_num(n)} {status}" for status, n in slots.items())


def _closure_note(manifest: dict) -> str:
    closure = manifest.get("closure")
    if not closure:
        return ""
    if closure.get("closed"):
        return "The month was closed when the split was built: every slot had landed or was confirmed missing."
    reasons = "; ".join(closure.get("reasons") or []) or "no reason recorded"
    return f"The month was **not closed** when the split was built: {reasons}."


def _acquired_from(manifest: dict) -> str:
    generated = _generated(manifest)
    if generated:
        return f"{generated}: generated files in the format of the GDELT 2.0 event feed, served like it"
    return f"the {_source_line(manifest)}" if isinstance(manifest.get("source"), dict) else "the GDELT 2.0 event feed"


def _collection(manifest: dict) -> str:
    articles = _get(manifest, "counts", "articles", default={})
    article_rows = [(key, _num(n), ARTICLE_COUNT_DESCRIPTIONS.get(key, "")) for key, n in articles.items()]
    return f"""
## Collection process

**How was the data acquired?** From {_acquired_from(manifest)}, which publishes an export and a
mentions file every 15 minutes (96 slots a day). Every file is downloaded by name and accepted only
if its size and md5 equal GDELT's own index (`masterfilelist.txt`) and the zip opens; every slot of
every day gets a ledger row, so a gap is recorded rather than silently skipped.

{" ".join(filter(None, [f"Files of the month (an export and a mentions file per slot), by ledger status: {_slot_counts(manifest)}.", _closure_note(manifest)]))}

{_override_note(manifest)}

**Articles.** The pages of source URLs of well-reported events were fetched (robots.txt honoured,
each URL once, failures retried), their text extracted with trafilatura and filtered with the
OBELICS rules (see Preprocessing):

{_table(("articles", "count", "meaning"), article_rows or [("–", "not recorded", "")])}

**Who was involved?** No people: the pipeline runs unattended on a schedule. **Does the dataset
relate to people?** No; subjects and objects are countries.
"""


def _preprocessing(manifest: dict) -> str:
    versions = manifest.get("versions") or {}
    version_rows = [(f"`{key}`", f"`{value}`") for key, value in versions.items()] or [("–", "not recorded")]
    thresholds = manifest.get("thresholds") or {}
    threshold_rows = [
        (f"`{key}`", _num(value), THRESHOLD_DESCRIPTIONS.get(key, "")) for key, value in thresholds.items()
    ] or [("–", "not recorded", "")]
    sampler = manifest.get("sampler") or {}
    weights = ", ".join(f"{key} {value:g}" for key, value in (sampler.get("weights") or {}).items())
    sampler_note = (
        f" It draws {sampler.get('candidates_per_step', 'a number of')} candidates per step and weights the"
        f" variances of {weights}."
        if weights
        else ""
    )
    return f"""
## Preprocessing

Events follow MIRAI's cleaning rules, made exact (rules version `{_get(versions, "rules")}`):
each GDELT event id once; an event is kept only on the day it was first reported, and each article
URL only on its first day; actor codes are mapped to ISO 3166-1 alpha-3 countries through a
versioned table (regions and outdated codes excluded); domestic events are dropped; the relation is
the event's CAMEO base code and must be one of MIRAI's level-2 codes. Daily `(date, s, r, o)` quads
sum the events' mentions. Article texts pass the OBELICS paragraph and document filters (English
only; threshold profile `{_get(versions, "article_profile")}`).

Versions (data built under different versions are not comparable):

{_table(("component", "version"), version_rows)}

Thresholds:

{_table(("threshold", "value", "meaning"), threshold_rows)}

A query `(t, s, o)` comes from the test-grade quads of day `t`; its answer lists every level-2
relation `s` took toward `o` on day `t` in the event database. The balanced sample
(`{_get(manifest, "sampler_version")}`, seed {_get(manifest, "seed")}) is built greedily: each step
draws candidate queries with a seeded RNG and adds the one that minimises the weighted variances of
the counts over dates, level-1 codes, regions and countries (both actors).{sampler_note}
"""


def _uses(manifest: dict) -> str:
    return f"""
## Uses

**Intended use.** Benchmarking LLM agents (and temporal knowledge-graph or text-based forecasters)
on forecasting relations between countries, with MIRAI's metrics (precision, recall and F1 at
level 1 and level 2; KL divergence over binary and quad classes). Use a split later than the
training cutoff of every model compared: {manifest["month"]} is only contamination-free for models
whose data end before it.

**Other uses.** Studies of event-coding noise, of news coverage across countries, or of trends in
international relations, keeping GDELT's biases in mind.

**Not for.** Decisions about real people, states or conflicts (the labels are machine-coded
reports, not verified facts); claims about what happened without checking the sources; training a
model and then evaluating it on the same month; comparing scores across splits built under
different versions without saying so.
"""


EVALUATE_DOC = "docs/evaluate-your-agent.md"


def _evaluate(manifest: dict) -> str:
    # The card travels alone (a release, a Hugging Face copy), so the steps are spelled out here
    # and the full page is named by its path in the mirai-pipeline repository.
    month = manifest["month"]
    return f"""
## Evaluate your agent

With this release downloaded (`mirai download {month} --dest mirai-releases`), no other access is
needed: run your agent against the date-gated API over `database/` (`EventDatabase` in
`pipeline.agent_api`, or MIRAI's own module `pipeline.agent_api.mirai_api`), score its predictions
with `mirai score predictions.jsonl --split mirai-releases/{month} [--sample]`, and submit them
with `mirai submit`. A query on day `t` may use data up to `t` minus the temporal distance
({_get(manifest, "distance_days")} day(s)). A model whose knowledge cutoff is not before
{month}-01 is contaminated for this month: scored and shown, never ranked. Scores appear on the
leaderboard, `releases/leaderboard.html` in the store this release came from. The whole path, with a
worked example: `{EVALUATE_DOC}` in the mirai-pipeline repository.
"""


def _distribution() -> str:
    return f"""
## Distribution

The split is published with the pipeline's monthly releases, with this card, the manifest and the
checksums below. The event data come from the GDELT Project, whose [terms of use]({GDELT_TERMS})
allow unlimited and unrestricted academic, commercial and governmental use, redistribution and
rehosting, provided any use cites the GDELT Project and links to <https://www.gdeltproject.org/>.
The news articles are copyright of their outlets: their texts are **not** in this split, only in the
news database (with their URLs), for research use. No export controls apply.
"""


def _maintenance(manifest: dict) -> str:
    return f"""
## Maintenance

The pipeline ingests GDELT every 15 minutes and builds one split per month, so new splits keep
appearing after every model's training cutoff. A split is never rewritten in place: a correction
(a fixed rule, a new reference table) produces a new dataset version, and older versions stay
available with their manifests for reproducibility. This is dataset version
`{_get(manifest, "dataset_version")}`, built by pipeline version `{_get(manifest, "versions", "code")}`.
Problems and contributions go to the pipeline's issue tracker.
"""


def _deviations(manifest: dict) -> str:
    deviations = manifest.get("deviations") or []
    body = "\n".join(f"- {d}" for d in deviations) if deviations else "None recorded for this split."
    return f"""
## Known deviations from MIRAI and OBELICS

{body}
"""


FIGURE_CAPTIONS = {
    RELATION_FIGURE: "Queries whose answer includes each CAMEO level-1 relation, coloured by MIRAI quad class",
    PAIRS_FIGURE: "Queries by (subject, object) for the countries in most queries",
}


def _figure_link(path: Path) -> str:
    path = Path(path)
    return path.name if path.is_absolute() else path.as_posix()


def _figures(figures: dict[str, Path]) -> str:
    if not figures:
        return "## Figures\n\nNo figures."
    images = [
        f"![{FIGURE_CAPTIONS.get(name, Path(name).stem)}]({_figure_link(path)})"
        for name, path in sorted(figures.items())
    ]
    return "## Figures\n\n" + "\n\n".join(images)


def _files(manifest: dict) -> str:
    files = manifest.get("files") or {}
    rows = [
        (f"`{name}`", _num(_get(meta, "rows", default="–")), _num(_get(meta, "bytes")), f"`{_get(meta, 'sha256')}`")
        for name, meta in sorted(files.items())
    ]
    return "## Files\n\n" + (_table(("file", "rows", "bytes", "sha256"), rows) if rows else "No files recorded.")


def _citation() -> str:
    return """
## Citation

Cite the GDELT Project (<https://www.gdeltproject.org/>) and MIRAI:

```bibtex
@article{ye2024mirai,
  title   = {MIRAI: Evaluating LLM Agents for Event Forecasting},
  author  = {Ye, Chenchen and others},
  journal = {arXiv preprint arXiv:2407.01231},
  year    = {2024}
}
```
"""
