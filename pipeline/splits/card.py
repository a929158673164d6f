"""The dataset card of a monthly split: its README.md and the five figures it embeds.

The card follows the Hugging Face dataset-card layout (YAML front matter, then Markdown) with the
datasheet sections of Gebru et al. (2021), adapted from MIRAI's own datasheet (paper, Appendix J).
Everything in it comes from the manifest and the query frames (the figures also from the month's
stored slot ledgers and articles tables), never from the clock, so rebuilding
a split rebuilds the same card and the same PNG bytes, and the release's checksums stay stable.

This module assembles the card and writes its sections; the figures and their counts are
card_figures.py, the Composition section card_composition.py, the value formatting both share
card_format.py (split so that no module passes ~500 lines).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml

from pipeline.release.layout import (
    FUNNEL_FIGURE,
    LEDGER_FIGURE,
    MONTHS_FIGURE,
    PAIRS_FIGURE,
    RELATION_FIGURE,
    release_configs,
)  # names a release may hold
from pipeline.release.tables import GDELT_TERMS
from pipeline.splits.card_composition import composition_section
from pipeline.splits.card_format import manifest_value, markdown_table, number_text

# A line width PyYAML never reaches: the front matter's strings stay on one line each.
UNWRAPPED = 2**31 - 1

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
        composition_section(manifest, queries, sample),
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
        "configs": release_configs(),
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
        f"**Released with a manual override** of the pipeline's release checks by {manifest_value(override, 'by')} "
        f"at {manifest_value(override, 'at')}. Reason: {manifest_value(override, 'reason')}"
    )


def _intro(manifest: dict) -> str:
    month = manifest["month"]
    generated = _generated(manifest)
    facts = [
        ("month", month),
        ("source", _source_line(manifest)),
        ("dataset version", manifest_value(manifest, "dataset_version")),
        ("split version", manifest_value(manifest, "split_version")),
        ("history cutoff", manifest_value(manifest, "history_cutoff")),
        ("temporal distance (days)", manifest_value(manifest, "distance_days")),
        ("sampler", manifest_value(manifest, "sampler_version")),
        ("seed", manifest_value(manifest, "seed")),
        ("pipeline version", manifest_value(manifest, "versions", "code")),
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
{markdown_table(("", ""), facts)}
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


def _slot_counts(manifest: dict) -> str:
    slots = manifest_value(manifest, "counts", "slots", default={})
    if not slots:
        return "not recorded"
    return ", ".join(f"{number_text(n)} {status}" for status, n in slots.items())


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
    articles = manifest_value(manifest, "counts", "articles", default={})
    article_rows = [(key, number_text(n), ARTICLE_COUNT_DESCRIPTIONS.get(key, "")) for key, n in articles.items()]
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

{markdown_table(("articles", "count", "meaning"), article_rows or [("–", "not recorded", "")])}

**Who was involved?** No people: the pipeline runs unattended on a schedule. **Does the dataset
relate to people?** No; subjects and objects are countries.
"""


def _preprocessing(manifest: dict) -> str:
    versions = manifest.get("versions") or {}
    version_rows = [(f"`{key}`", f"`{value}`") for key, value in versions.items()] or [("–", "not recorded")]
    thresholds = manifest.get("thresholds") or {}
    threshold_rows = [
        (f"`{key}`", number_text(value), THRESHOLD_DESCRIPTIONS.get(key, "")) for key, value in thresholds.items()
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

Events follow MIRAI's cleaning rules, made exact (rules version `{manifest_value(versions, "rules")}`):
each GDELT event id once; an event is kept only on the day it was first reported, and each article
URL only on its first day; actor codes are mapped to ISO 3166-1 alpha-3 countries through a
versioned table (regions and outdated codes excluded); domestic events are dropped; the relation is
the event's CAMEO base code and must be one of MIRAI's level-2 codes. Daily `(date, s, r, o)` quads
sum the events' mentions. Article texts pass the OBELICS paragraph and document filters (English
only; threshold profile `{manifest_value(versions, "article_profile")}`).

Versions (data built under different versions are not comparable):

{markdown_table(("component", "version"), version_rows)}

Thresholds:

{markdown_table(("threshold", "value", "meaning"), threshold_rows)}

A query `(t, s, o)` comes from the test-grade quads of day `t`; its answer lists every level-2
relation `s` took toward `o` on day `t` in the event database. The balanced sample
(`{manifest_value(manifest, "sampler_version")}`, seed {manifest_value(manifest, "seed")}) is built greedily: each step
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
({manifest_value(manifest, "distance_days")} day(s)). A model whose knowledge cutoff is not before
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
`{manifest_value(manifest, "dataset_version")}`, built by pipeline version `{manifest_value(manifest, "versions", "code")}`.
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
    MONTHS_FIGURE: "Queries per month of every split through this one, by MIRAI quad class and by the subject's region",
    LEDGER_FIGURE: "The month's GDELT slot ledger: each day's 96 15-minute slots, by the worst status of their two files",
    FUNNEL_FIGURE: "The month's OBELICS funnel: the stored articles left after each extraction and filter step",
}
# What a figure shows that its caption cannot say, printed under it: the months figure draws other
# splits than this one; the ledger and the funnel are the operators' pictures of how the month was collected.
FIGURE_NOTES = {
    MONTHS_FIGURE: (
        "How this month's queries compare with the earlier months': the queries of every split up to this one "
        "(those built when this one was; no later month is read), stacked by the MIRAI quad classes of the "
        "answer (a query with relations in two classes counts in both) and by the subject's region "
        "(the number above a bar is the month's queries)."
    ),
    LEDGER_FIGURE: (
        "How completely the month's GDELT 15-minute files were collected: one row per day, one cell per "
        "15-minute slot, green where both the export and the mentions file landed (on time or late), other "
        "colours for GDELT's gaps and for failed, corrupt or quarantined files, grey where no ledger was written."
    ),
    FUNNEL_FIGURE: (
        "How many articles each OBELICS step dropped, summed over the month's daily articles tables: those "
        "tables hold only the pages that were fetched and stored, so the funnel starts at the stored pages; "
        "the selected URLs whose fetch failed are counted only in the Collection process table above."
    ),
}


def _figure_link(path: Path) -> str:
    path = Path(path)
    return path.name if path.is_absolute() else path.as_posix()


def _figures(figures: dict[str, Path]) -> str:
    if not figures:
        return "## Figures\n\nNo figures."
    images = [
        "\n\n".join(
            filter(
                None, [f"![{FIGURE_CAPTIONS.get(name, Path(name).stem)}]({_figure_link(path)})", FIGURE_NOTES.get(name)]
            )
        )
        for name, path in sorted(figures.items())
    ]
    return "## Figures\n\n" + "\n\n".join(images)


def _files(manifest: dict) -> str:
    files = manifest.get("files") or {}
    rows = [
        (
            f"`{name}`",
            number_text(manifest_value(meta, "rows", default="–")),
            number_text(manifest_value(meta, "bytes")),
            f"`{manifest_value(meta, 'sha256')}`",
        )
        for name, meta in sorted(files.items())
    ]
    return "## Files\n\n" + (
        markdown_table(("file", "rows", "bytes", "sha256"), rows) if rows else "No files recorded."
    )


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
