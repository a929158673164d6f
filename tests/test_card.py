"""The dataset card and its figures: valid, reproducible PNGs and a README that says what the split is."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import matplotlib
import matplotlib.image
import numpy as np
import polars as pl
import pytest
import yaml

from pipeline.splits import card, card_composition, card_figures
from pipeline.splits.card import dataset_card
from pipeline.splits.card_figures import render_figures
from pipeline.splits.schema import QUERIES_SCHEMA
from pipeline.storage import DataLayout

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NOV, DEC, JAN, FEB = date(2023, 11, 1), date(2023, 12, 1), date(2024, 1, 1), date(2024, 2, 1)
NO_DATA = DataLayout(ROOT / "tests" / "no-such-data-dir")  # a data directory without ledgers or articles
SECTIONS = (
    "## Motivation",
    "## Composition",
    "## Collection process",
    "## Preprocessing",
    "## Uses",
    "## Evaluate your agent",
    "## Distribution",
    "## Maintenance",
    "## Known deviations from MIRAI and OBELICS",
    "## Figures",
    "## Files",
)


def query(i: int, day: int, s: str, o: str, answers: list[str]) -> dict:
    answers = sorted(set(answers))
    level1 = sorted({code[:2] for code in answers})
    return {
        "query_id": f"2024-01-{i:05d}",
        "date": date(2024, 1, day),
        "s": s,
        "o": o,
        "s_name": s.title(),
        "o_name": o.title(),
        "s_region": "Region",
        "o_region": "Region",
        "query_code": f"(2024-01-{day:02d}, {s}, ?, {o})",
        "answer_list": answers,
        "answer_level1": level1,
        "answer_dict": json.dumps({k: [c for c in answers if c[:2] == k] for k in level1}),
        "daily_mentions": 150,
        "n_articles": 6,
        "min_articles": 5,
    }


@pytest.fixture
def queries() -> pl.DataFrame:
    rows = [
        query(0, 3, "USA", "CHN", ["010", "036", "042"]),  # quads 1, 1, 1
        query(1, 3, "CHN", "USA", ["111", "130"]),  # 3, 3
        query(2, 5, "RUS", "UKR", ["190", "173", "051"]),  # 4, 4, 2
        query(3, 9, "USA", "CHN", ["040"]),  # 1
        query(4, 17, "ISR", "PSE", ["190", "193"]),  # 4 (one level-1 code, two level-2)
        query(5, 31, "UKR", "RUS", ["010", "112"]),  # 1, 3
    ]
    return pl.DataFrame(rows, schema=QUERIES_SCHEMA)


@pytest.fixture
def manifest() -> dict:
    return {
        "month": "2024-01",
        "dataset_version": "2024-01",
        "history_cutoff": "2023-12-31",
        "distance_days": 1,
        "seed": 0,
        "sample_size": 3,
        "sampler_version": "balanced-greedy-v1",
        "thresholds": {"database_min_mentions": 50, "test_min_mentions": 100, "test_min_articles": 5},
        "versions": {"rules": "rules-v1", "country_table": "countries-v1", "code": "0.1.0+g1234abc"},
        "counts": {
            "queries": 6,
            "sample": 3,
            "test_grade_quads": 2301,
            "database_events": 40211,
            "database_articles": 98311,
            "slots": {"landed": 5952, "late": 3, "missing": 1, "corrupt": 0},
            "articles": {"fetched": 120000, "failed": 8000, "kept": 98311},
        },
        "override": {
            "by": "alice",
            "reason": "GDELT outage 2024-01-17, slots confirmed lost",
            "at": "2024-02-04T10:00:00+00:00",
        },
        "deviations": ["Article ids are md5 hashes of the URL.", "Regions are GeoNames continents."],
        "files": {
            "queries.parquet": {"sha256": "a" * 64, "bytes": 12345, "rows": 6},
            "queries_sample.parquet": {"sha256": "b" * 64, "bytes": 2345, "rows": 3},
            "relation_distribution.png": {"sha256": "c" * 64, "bytes": 50000},
            "country_pairs.png": {"sha256": "d" * 64, "bytes": 40000},
        },
    }


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    block, _, _ = text[4:].partition("\n---\n")
    return yaml.safe_load(block)


# --- counting -----------------------------------------------------------------------------------


def test_level1_counts_cover_all_twenty_codes(queries):
    counts = card_figures.level1_counts(queries)
    assert counts["level1"].to_list() == [f"{i:02d}" for i in range(1, 21)]
    got = dict(counts.select("level1", "queries").iter_rows())
    # "01" in queries 0 and 5; "19" in 2 and 4 (twice in 4, counted once); "08" nowhere
    assert (got["01"], got["19"], got["08"], got["11"]) == (2, 2, 0, 2)


def test_quad_counts_count_each_query_once_per_class(queries):
    got = dict(card_figures.quad_counts(queries).iter_rows())
    assert got == {1: 3, 2: 1, 3: 2, 4: 2}


def test_country_involvement_and_pair_matrix(queries):
    involvement = card_figures.country_involvement(queries)
    assert involvement.rows()[:2] == [("CHN", 3), ("USA", 3)]  # ties in code order, so the figure is stable
    top = involvement["country"].to_list()
    matrix = card_figures.pair_matrix(queries, top)
    assert matrix[top.index("USA"), top.index("CHN")] == 2
    assert matrix[top.index("CHN"), top.index("USA")] == 1
    assert matrix.sum() == queries.height and np.trace(matrix) == 0


def month_split(month: date, rows: list[tuple[list[str], str | None]]) -> pl.DataFrame:
    """A month's queries from (answer codes, subject's region) pairs."""
    return pl.DataFrame(
        [
            query(i, 3, "USA", "CHN", answers) | {"date": month.replace(day=3), "s_region": region}
            for i, (answers, region) in enumerate(rows)
        ],
        schema=QUERIES_SCHEMA,
    )


@pytest.fixture
def months(tmp_path) -> DataLayout:
    """A data directory with the splits of 2023-11, a stale 2024-01 (the month being rebuilt) and
    2024-02 (later than it); 2023-12 has none."""
    layout = DataLayout(tmp_path / "data")
    splits = {
        NOV: [(["010"], "Europe"), (["190", "042"], "Asia"), (["111"], "Europe")],  # quads 1 | 4, 1 | 3
        JAN: [(["190"], "Asia")] * 5,
        FEB: [(["190"], "Asia")] * 7,
    }
    for month, rows in splits.items():
        layout.split_dir(month).mkdir(parents=True)
        month_split(month, rows).write_parquet(layout.split_dir(month) / "queries.parquet")
    (layout.root / "splits" / ".2023-12.123.abcdef").mkdir()  # a staging directory left behind: no split
    month_split(DEC, [(["010"], "Asia")]).write_parquet(
        layout.root / "splits" / ".2023-12.123.abcdef" / "queries.parquet"
    )
    return layout


@pytest.fixture
def january() -> pl.DataFrame:
    """The month being split: quads 4, 2 | 1 (two codes of one class, counted once) | 3."""
    return month_split(JAN, [(["173", "051"], "Africa"), (["010", "013"], "Europe"), (["130"], None)])


def earlier_splits(layout: DataLayout, month: date) -> dict[date, Path]:
    return {m: layout.split_dir(m) / "queries.parquet" for m in layout.split_months(before=month)}


def test_split_months_lists_only_earlier_splits(months):
    assert months.split_months(before=JAN) == [NOV]  # not the stale 2024-01, nor 2024-02, nor a staging directory
    assert months.split_months(before=date(2024, 2, 15)) == [NOV, JAN]
    assert months.split_months(before=NOV) == []


def test_months_composition_counts_each_split_month(months, january):
    composition = card_figures.months_composition(january, JAN, earlier_splits(months, JAN))
    assert composition.months == [NOV, JAN]  # the split's own frame, never the stale file; no later month
    assert composition.quads.rows() == [
        (NOV, 1, 2), (NOV, 2, 0), (NOV, 3, 1), (NOV, 4, 1),
        (JAN, 1, 1), (JAN, 2, 1), (JAN, 3, 1), (JAN, 4, 1),
    ]  # fmt: skip
    # Europe 3, then Africa and Asia 1 each (ties by name); the subject without a region is Other.
    assert composition.regions.rows() == [
        (NOV, "Europe", 2), (NOV, "Africa", 0), (NOV, "Asia", 1), (NOV, "Other", 0),
        (JAN, "Europe", 1), (JAN, "Africa", 1), (JAN, "Asia", 0), (JAN, "Other", 1),
    ]  # fmt: skip
    top_two = card_figures.months_composition(january, JAN, earlier_splits(months, JAN), top_regions=2)
    assert top_two.regions.rows() == [
        (NOV, "Europe", 2), (NOV, "Africa", 0), (NOV, "Other", 1),
        (JAN, "Europe", 1), (JAN, "Africa", 1), (JAN, "Other", 1),
    ]  # fmt: skip
    without_other = card_figures.months_composition(january.head(2), JAN, earlier_splits(months, JAN))
    assert "Other" not in without_other.regions["region"].to_list()


def test_months_composition_refuses_a_later_split(months, january):
    with pytest.raises(ValueError, match="given the split of 2024-02"):
        card_figures.months_composition(january, JAN, {FEB: months.split_dir(FEB) / "queries.parquet"})


def test_months_figure_is_a_png_of_every_month(months, january, tmp_path):
    earlier = earlier_splits(months, JAN)
    path = render_figures(january, tmp_path / "a", JAN, earlier, NO_DATA)["queries_by_month.png"]
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (800, 1200)  # 12 x 8 inches at 100 dpi
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10  # drawn, not one colour
    assert (
        path.read_bytes()
        == render_figures(january, tmp_path / "b", JAN, earlier, NO_DATA)["queries_by_month.png"].read_bytes()
    )
    figure = card_figures._months_figure(card_figures.months_composition(january, JAN, earlier))
    top, bottom = figure.axes[:2]
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["2023-11", "2023-12", "2024-01"]
    for panel in (top, bottom):  # 2023-12 keeps its place, empty
        assert "no split" in [t.get_text() for t in panel.texts]
    assert [t.get_text() for t in bottom.texts if t.get_text()[:1].isdigit()] == ["3", "3"]  # the months' queries
    assert figure.get_suptitle().endswith("(2 split(s), 6 queries)")


# --- figures ------------------------------------------------------------------------------------


def test_figures_are_valid_pngs(queries, tmp_path):
    figures = render_figures(queries, tmp_path, JAN, {}, NO_DATA)
    assert set(figures) == {
        "relation_distribution.png",
        "country_pairs.png",
        "queries_by_month.png",
        "slot_ledger.png",
        "obelics_funnel.png",
    }
    for name, path in figures.items():
        assert path == tmp_path / name
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] >= 400 and image.shape[1] >= 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(figures)  # no temp files left behind


def test_figures_are_byte_identical_across_renders(queries, tmp_path):
    first = render_figures(queries, tmp_path / "a", JAN, {}, NO_DATA)
    second = render_figures(queries, tmp_path / "b", JAN, {}, NO_DATA)
    for name in first:
        assert first[name].read_bytes() == second[name].read_bytes()
        assert b"Matplotlib" not in first[name].read_bytes()  # no version string in the metadata


def test_figures_ignore_the_callers_rc_settings(queries, tmp_path):
    plain = render_figures(queries, tmp_path / "plain", JAN, {}, NO_DATA)
    with matplotlib.rc_context({"font.size": 20, "lines.linewidth": 5, "savefig.dpi": 40, "axes.facecolor": "red"}):
        styled = render_figures(queries, tmp_path / "styled", JAN, {}, NO_DATA)
    for name in plain:
        assert plain[name].read_bytes() == styled[name].read_bytes()


def test_empty_input_renders_no_queries(queries, tmp_path):
    empty = queries.clear()
    figures = render_figures(empty, tmp_path, JAN, {}, NO_DATA)
    for path in figures.values():
        assert path.read_bytes().startswith(PNG_SIGNATURE)
        matplotlib.image.imread(path)
    for draw in (card_figures._relation_figure, card_figures._pairs_figure):
        assert "no queries" in [t.get_text() for t in draw(empty).texts]
    nothing = card_figures.months_composition(empty, JAN, {})
    assert "no queries" in [t.get_text() for t in card_figures._months_figure(nothing).texts]


def test_one_query_renders(queries, tmp_path):
    figures = render_figures(queries.head(1), tmp_path, JAN, {}, NO_DATA)
    assert all(p.read_bytes().startswith(PNG_SIGNATURE) for p in figures.values())


# --- the card -----------------------------------------------------------------------------------


def test_card_front_matter(manifest, queries, tmp_path):
    text = dataset_card(manifest, queries, queries.head(3), render_figures(queries, tmp_path, JAN, {}, NO_DATA))
    meta = front_matter(text)
    assert meta["pretty_name"].startswith("MIRAI test split 2024-01")
    assert meta["license"] == "other" and "gdeltproject.org" in meta["license_link"]
    assert meta["language"] == ["en"]
    assert meta["size_categories"] == ["n<1K"]
    assert meta["task_categories"]
    paths = [f["path"] for config in meta["configs"] for f in config["data_files"]]
    assert paths == [
        "queries.parquet",
        "queries_sample.parquet",
        "database/events/*.parquet",
        "database/news/*.parquet",
    ]
    assert "gdelt" in meta["tags"]


def test_front_matter_keeps_a_generated_description_that_looks_like_yaml(queries):
    """A description is free text: YAML syntax in it (": ", "#", quotes, "yes", a date, non-ASCII)
    stays a string, and the first line still names the whole split however long it is."""
    tricky = 'yes: it\'s # not a comment, 2024-01 "quoted" — Zürich ' + "long " * 30
    manifest = {"month": "2024-01", "source": {"generated": True, "description": tricky}}
    text = dataset_card(manifest, queries, queries.head(2), {})
    assert front_matter(text)["pretty_name"] == f"MIRAI test split 2024-01 (GENERATED data, not GDELT: {tricky})"
    assert "GENERATED data, not GDELT" in text.splitlines()[1] and "Zürich" in text.splitlines()[1]
    assert front_matter(text)["tags"][-1] == "synthetic"


def test_card_sections_and_manifest_values(manifest, queries, tmp_path):
    text = dataset_card(manifest, queries, queries.head(3), render_figures(queries, tmp_path, JAN, {}, NO_DATA))
    for section in SECTIONS:
        assert f"\n{section}\n" in text
    assert "alice" in text and "GDELT outage 2024-01-17, slots confirmed lost" in text
    for deviation in manifest["deviations"]:
        assert f"- {deviation}" in text
    for name, meta in manifest["files"].items():
        assert f"`{name}`" in text and meta["sha256"] in text
    assert "5,952 landed, 3 late, 1 missing, 0 corrupt" in text
    assert "| fetched | 120,000 |" in text and "| kept | 98,311 |" in text
    assert "| `test_min_mentions` | 100 |" in text and "`rules-v1`" in text
    assert "](relation_distribution.png)" in text and "](country_pairs.png)" in text
    assert "](queries_by_month.png)\n\nHow this month's queries compare with the earlier months'" in text
    assert "articles are copyright of their outlets" in text


def test_card_points_a_newcomer_at_the_evaluation_path(manifest, queries):
    """The card travels without the repository: it names the commands, this month's contamination
    date and the page that explains the rest, and that page exists."""
    text = dataset_card(manifest, queries, queries.head(3), {})
    section = " ".join(text.split("\n## Evaluate your agent\n", 1)[1].split("\n## ", 1)[0].split())
    assert "mirai download 2024-01 " in section and "--split mirai-releases/2024-01" in section
    assert "not before 2024-01-01 is contaminated" in section and "(1 day(s))" in section
    assert "mirai submit" in section and "releases/leaderboard.html" in section
    assert f"`{card.EVALUATE_DOC}`" in section and (ROOT / card.EVALUATE_DOC).is_file()


def test_card_numbers_come_from_the_frames(manifest, queries):
    sample = queries.filter(pl.col("s").is_in(["USA", "RUS"]))
    manifest["counts"]["sample"] = sample.height
    text = dataset_card(manifest, queries, sample, {})
    assert "| queries | 6 | 3 |" in text
    assert "| distinct countries (s or o) | 6 | 4 |" in text  # USA CHN RUS UKR ISR PSE | USA CHN RUS UKR
    assert "| distinct (s, o) pairs | 5 | 2 |" in text
    assert "| first date | 2024-01-03 | 2024-01-03 |" in text
    assert "| last date | 2024-01-31 | 2024-01-09 |" in text
    assert "| level-1 relations in answers (of 20) | 8 | 6 |" in text
    assert "min 1, median 2, mean 2.17, max 3" in text
    assert "| 1 | Verbal cooperation | 3 |" in text
    assert "| 2 | 3 | 2 |" in text  # two level-2 codes: queries 1, 4, 5; two level-1 codes: 1, 5


def test_card_without_optional_keys(queries):
    text = dataset_card({"month": "2024-01"}, queries, queries.head(2), {})
    assert "Released without a manual override" in text
    assert "None recorded for this split." in text
    assert "No files recorded." in text
    assert "not recorded" in text
    front_matter(text)


def test_card_for_an_empty_month(manifest, queries, tmp_path):
    empty = queries.clear()
    manifest["counts"].update(queries=0, sample=0)
    text = dataset_card(manifest, empty, empty, render_figures(empty, tmp_path, JAN, {}, NO_DATA))
    assert "| queries | 0 | 0 |" in text
    assert front_matter(text)["size_categories"] == ["n<1K"]


def test_card_is_deterministic(manifest, queries, tmp_path):
    figures = render_figures(queries, tmp_path, JAN, {}, NO_DATA)
    assert dataset_card(manifest, queries, queries.head(3), figures) == dataset_card(
        manifest, queries, queries.head(3), figures
    )


def test_card_refuses_counts_that_disagree_with_the_frames(manifest, queries):
    with pytest.raises(ValueError, match="queries=6"):
        dataset_card(manifest, queries.head(5), queries.head(3), {})


def test_relative_figure_paths_are_kept(manifest, queries):
    text = dataset_card(manifest, queries, queries.head(3), {"country_pairs.png": Path("figures/country_pairs.png")})
    assert "](figures/country_pairs.png)" in text


def test_size_categories():
    assert [card._size_category(n) for n in (0, 999, 1000, 99_999, 100_000)] == [
        "n<1K",
        "n<1K",
        "1K<n<10K",
        "10K<n<100K",
        "100K<n<1M",
    ]


def test_long_answers_share_one_row(queries):
    codes = [f"{i:02d}0" for i in range(1, 13)]  # 12 level-2 codes in 12 level-1 codes
    long = pl.DataFrame([query(9, 2, "FRA", "DEU", codes)], schema=QUERIES_SCHEMA)
    lengths = card_composition.answer_lengths(pl.concat([queries, long]))
    assert lengths.row(-1) == ("10+", 1, 1)
    assert lengths["level2"].sum() == queries.height + 1
