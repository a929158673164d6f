"""Alerts: a JSON POST to a webhook (MIRAI_ALERT_WEBHOOK_URL), and how fresh the landed data is.

The payload has a Slack-compatible ``text`` line plus the alert's fields, so a Slack, Mattermost or
Teams-style incoming webhook shows it as is and anything else can route on ``kind``. The webhook
URL carries its own token: it is never logged and never part of a payload; text that could quote a
URL with credentials in it (an exception message) has them masked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import polars as pl
import requests

from pipeline.config import AlertSettings
from pipeline.gdelt.ledger import GREEN, read_ledger
from pipeline.http import RetryLog, TransientHTTPError, raise_for_transient, with_retries
from pipeline.storage import DataLayout

SOURCE = "mirai-pipeline"
MAX_TEXT = 1000
# scheme://user:password@host → scheme://***@host
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_LEDGER_NAME = re.compile(r"date=(\d{4}-\d{2}-\d{2})\.parquet$")


@dataclass(frozen=True)
class Alert:
    kind: str  # run_failure | freshness_breach | freshness_recovered | pool_slot_held | articles_fetch_failing
    title: str
    fields: dict[str, str | int | float | None] = field(default_factory=dict)

    def payload(self) -> dict[str, object]:
        return {
            "text": f"[{SOURCE}] {scrub(self.title)}",
            "source": SOURCE,
            "kind": self.kind,
            **{k: scrub(v) if isinstance(v, str) else v for k, v in self.fields.items()},
        }


def scrub(text: str) -> str:
    """Mask URL credentials and cap the length (a failure message can be a whole traceback)."""
    masked = _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)
    return masked if len(masked) <= MAX_TEXT else masked[: MAX_TEXT - 1] + "…"


def send_alert(
    alert: Alert,
    alerts: AlertSettings,
    user_agent: str,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """POST the alert to ``alerts``' webhook as ``user_agent``, retrying transient failures. Returns "sent"; "logged" when no webhook is
    set (the log line is the alert); "failed" when every attempt failed (the caller may try again
    on a later tick)."""
    log(f"alert {alert.kind}: {scrub(alert.title)}")
    if not alerts.webhook_url:
        return "logged"
    retry_log = RetryLog()

    def post() -> None:
        response = requests.post(
            alerts.webhook_url,
            json=alert.payload(),
            timeout=alerts.timeout_s,
            headers={"User-Agent": user_agent},
        )
        raise_for_transient(response)
        response.raise_for_status()

    try:
        with_retries(post, attempts=alerts.attempts, backoff_base_s=1.0, backoff_max_s=10.0, log=retry_log, sleep=sleep)
    except TransientHTTPError as exc:
        reason = f"HTTP {exc.status}"
    except requests.RequestException as exc:
        # requests puts the URL in its messages: report the error class and status only.
        status = exc.response.status_code if exc.response is not None else None
        reason = type(exc).__name__ + (f" (HTTP {status})" if status else "")
    else:
        return "sent"
    log(f"alert {alert.kind} not delivered after {retry_log.attempts} attempt(s): {reason}")
    return "failed"


def newest_landed_slot(layout: DataLayout) -> datetime | None:
    """The newest slot whose file landed (landed or late), from the newest ledger that has one.
    Reads ledgers newest day first and stops at the first hit: normally one small file."""
    directory = layout.slot_ledger_path(datetime.now(UTC).date()).parent  # DataLayout owns where ledgers live
    if not directory.is_dir():
        return None
    days = sorted((m.group(1) for p in directory.iterdir() if (m := _LEDGER_NAME.search(p.name))), reverse=True)
    for day in days:
        green = read_ledger(layout, date.fromisoformat(day)).filter(pl.col("status").is_in(GREEN))
        if green.height:
            return green["slot"].max()
    return None


@dataclass(frozen=True)
class Freshness:
    newest: datetime | None
    age: timedelta | None
    limit: timedelta

    @property
    def stale(self) -> bool:
        # Nothing landed yet is a deployment that has not started, not a breach.
        return self.age is not None and self.age > self.limit

    def describe(self) -> str:
        if self.newest is None:
            return "no GDELT slot has landed yet"
        hours = self.age.total_seconds() / 3600
        return f"newest landed GDELT slot {self.newest:%Y-%m-%d %H:%M} UTC is {hours:.1f} h old (limit {self.limit.total_seconds() / 3600:g} h)"


def freshness(layout: DataLayout, alerts: AlertSettings, now: datetime) -> Freshness:
    newest = newest_landed_slot(layout)
    return Freshness(newest, None if newest is None else now - newest, timedelta(hours=alerts.freshness_hours))
