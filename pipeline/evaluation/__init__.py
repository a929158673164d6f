"""Scoring forecasts against a monthly split: MIRAI's metrics, model-free baselines, the agent
registry and the evaluation records behind the leaderboard (docs/evaluation.md)."""
