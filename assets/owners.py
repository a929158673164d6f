"""Who answers for what, named once: every asset and job lists one of these as its owners (the UI's
Owner column and filter, and what an alert's reader looks up). Dagster takes an e-mail address or
"team:<name>"."""

# GDELT ingestion through the monthly release: the data the benchmark is built from.
DATA_OWNERS = ["team:data-pipeline"]
# What is scored and ranked: evaluations, submissions, the leaderboards and live rounds.
BENCHMARK_OWNERS = ["team:benchmark-maintainers"]
