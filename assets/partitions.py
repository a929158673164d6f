"""Partitions, defined once. Ingestion is daily (a 15-minute partitions definition since 2023
would pass Dagster's ~100k-partition guidance within three years); each daily run lands every
15-minute slot of its day. end_offset=1 makes today's (still open) day a partition."""

import dagster as dg

from pipeline.config import Settings

daily_partitions = dg.DailyPartitionsDefinition(
    start_date=Settings.from_env().start_date.isoformat(), timezone="UTC", end_offset=1
)

# Monthly assets (event database, test split) cover whole months: the partition for a month
# exists once the month has ended (end_offset=0), and the split additionally waits for the
# slot ledger to settle and the grace period (pipeline.splits.month_closure).
monthly_partitions = dg.MonthlyPartitionsDefinition(
    start_date=Settings.from_env().start_date.replace(day=1).isoformat(), timezone="UTC", end_offset=0
)
