"""Partitions, defined once. Ingestion is daily (a 15-minute partitions definition since 2023
would pass Dagster's ~100k-partition guidance within three years); each daily run lands every
15-minute slot of its day. end_offset=1 makes today's (still open) day a partition."""

from datetime import timedelta

import dagster as dg

from pipeline.config import Settings

# Read when the code location loads, by design: Dagster partitions are static, so the range cannot
# be a resource field a run overrides (docs/deploy.md, "Resources"). Change the variables and reload.
_settings = Settings.from_env()
# MIRAI_END_DATE (inclusive) closes the range, as the demo does for its own days; Dagster's
# end_date is exclusive.
_after_end = _settings.calendar.end_date + timedelta(days=1) if _settings.calendar.end_date else None

daily_partitions = dg.DailyPartitionsDefinition(
    start_date=_settings.calendar.start_date.isoformat(),
    timezone="UTC",
    end_offset=1,
    end_date=_after_end.isoformat() if _after_end else None,
)

# Monthly assets (event database, test split) cover whole months: the partition for a month
# exists once the month has ended (end_offset=0), and the split additionally waits for the
# slot ledger to settle and the grace period (pipeline.splits.split.month_closure). With an end date,
# the last month is the last one that ended by then.
monthly_partitions = dg.MonthlyPartitionsDefinition(
    start_date=_settings.calendar.start_date.replace(day=1).isoformat(),
    timezone="UTC",
    end_offset=0,
    end_date=_after_end.replace(day=1).isoformat() if _after_end else None,
)

# A live round of day D reads the daily files of D − MIRAI_LIVE_WINDOW_DAYS .. D − 1 (pipeline/live/rounds.py,
# window_days): its lineage, per partition.
LIVE_WINDOW = dg.TimeWindowPartitionMapping(start_offset=-_settings.live.window_days, end_offset=-1)
