"""``refusal.json``: why an agent is not evaluated on a month (its knowledge cutoff is not before
it), stored in ``evaluations/YYYY-MM/<agent>/<query_set>/`` beside the per-distance runs, removed
once the agent is evaluated there after all, and listed for the leaderboard.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl

from pipeline.evaluation.agent_config import agent_config_hash
from pipeline.evaluation.registry import Agent
from pipeline.storage import DataLayout, atomic_write_bytes
from pipeline.version import code_version

REFUSAL_FILE = "refusal.json"


def refusal_path(data_dir: Path | str, month: date, agent_name: str, query_set: str) -> Path:
    """evaluations/YYYY-MM/<agent>/<query_set>/refusal.json: next to the per-distance runs,
    since eligibility does not depend on the distance."""
    return DataLayout(data_dir).evaluation_dir(month, agent_name, query_set, 1).parent / REFUSAL_FILE


def write_refusal(data_dir: Path | str, agent: Agent, month: date, query_set: str, reason: str) -> dict:
    """Store why the agent is not evaluated on the month; return the record."""
    record = {
        "agent": agent.name,
        "month": f"{month:%Y-%m}",
        "query_set": query_set,
        "status": "refused",
        "reason": reason,
        "knowledge_cutoff": agent.knowledge_cutoff.isoformat() if agent.knowledge_cutoff else None,
        "agent_config_hash": agent_config_hash(agent),
        "code_version": code_version(),
        "refused_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    atomic_write_bytes(
        refusal_path(data_dir, month, agent.name, query_set),
        (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(),
    )
    return record


def clear_refusal(data_dir: Path | str, month: date, agent_name: str, query_set: str) -> None:
    """Remove a refusal that no longer holds (the agent was evaluated after all)."""
    refusal_path(data_dir, month, agent_name, query_set).unlink(missing_ok=True)


def refusals(data_dir: Path | str) -> pl.DataFrame:
    """(month, query_set, agent, reason) of every stored refusal, newest month first."""
    paths = sorted((DataLayout(data_dir).root / "evaluations").glob(f"*/*/*/{REFUSAL_FILE}"))
    records = [json.loads(path.read_text()) for path in paths]
    return pl.DataFrame(
        [{k: r[k] for k in ("month", "query_set", "agent", "reason")} for r in records],
        schema={"month": pl.String, "query_set": pl.String, "agent": pl.String, "reason": pl.String},
    ).sort(["month", "query_set", "agent"], descending=[True, False, False])
