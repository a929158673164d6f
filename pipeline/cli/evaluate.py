"""`mirai evaluate`: an LLM agent run through the evaluation harness (pipeline/evaluation/run.py)
on a downloaded release, its flags turned into one agents.yaml entry."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from datetime import timedelta
from pathlib import Path

import polars as pl

from pipeline.cli.common import CommandError, count_arg
from pipeline.config import Settings
from pipeline.evaluation.throughput import RateLimiter
from pipeline.release.layout import ReleaseError
from pipeline.storage import DataLayout, atomic_write_bytes

# The evaluation harness, its registry, clients and prompts, and the agent API are imported by the
# functions that use them, not at start: together they would add ~250 ms to every `mirai --help`.

# `mirai evaluate`'s flags for the agents.yaml fields they fill (docs/evaluation.md, "The agent
# registry"): the registry validates them, and its messages name the field, said here as the flag.
_ENDPOINT_FLAGS = {
    "base_url": "endpoint",
    "model": "model",
    "api_key_env": "api_key_env",
    "requests_per_minute": "requests_per_minute",
    "tokens_per_minute": "tokens_per_minute",
}
# The llm entry's other fields are flags of the same name (dashes for underscores), but those the
# command sets itself (name, kind, distances from --distance, endpoint from the flags above) and
# gguf (a local model file, not an endpoint).
_NOT_FLAGS = {"name", "kind", "distances", "endpoint", "gguf"}


def _agent_flags() -> list[str]:
    from pipeline.evaluation.registry import LLM_FIELDS

    return sorted(LLM_FIELDS - _NOT_FLAGS)


EVALUATE_AGENT_NAME = "agent"  # names the stored run's directory under --run-dir
# The exit status of a run stored and its predictions written, with episodes that failed on
# transport left to run again (1: nothing ran; 2: bad flags; docs/evaluate-your-agent.md).
TRANSPORT_FAILED_STATUS = 3


def _as_flags(message: str) -> str:
    """A registry message with each field it names said as the `mirai evaluate` flag."""
    names = {f"endpoint.{field}": flag for field, flag in _ENDPOINT_FLAGS.items()} | {f: f for f in _agent_flags()}
    names["distances"] = names["every distance"] = "distance"
    pattern = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.sub(rf"(?<![\w.]){pattern}(?![\w])", lambda m: "--" + names[m.group(0)].replace("_", "-"), message)


def evaluate_registry_entry(args: argparse.Namespace) -> dict:
    """The agents.yaml entry the flags describe; flags not given are left out, so the registry's
    defaults apply as they do to a written entry."""
    endpoint = {field: getattr(args, flag) for field, flag in _ENDPOINT_FLAGS.items()}
    entry = {field: getattr(args, field) for field in _agent_flags()}
    entry |= {"endpoint": {k: v for k, v in endpoint.items() if v is not None}, "distances": [args.distance]}
    return {"name": EVALUATE_AGENT_NAME, "kind": "llm"} | {k: v for k, v in entry.items() if v is not None}


def _stored_run(directory: Path, agent, client_settings, query_ids: list[str]) -> dict | None:
    """The scores.json record of the run ``directory`` holds when it is a finished run of this
    agent entry and harness on these queries, so that a re-run need not redo its episodes; else None."""
    from pipeline.evaluation.agent_config import agent_config_hash
    from pipeline.evaluation.prompts import PROMPT_VERSION

    try:
        record = json.loads((directory / "scores.json").read_text())
        stored_ids = pl.read_parquet(directory / "results.parquet", columns=["query_id"]).get_column("query_id")
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None
    harness = record.get("harness") or {}
    matches = (
        record.get("agent_config_hash") == agent_config_hash(agent)
        and harness.get("prompt_version") == PROMPT_VERSION
        and harness.get("max_tokens") == client_settings.max_tokens
        and harness.get("seed") == client_settings.seed
        and sorted(stored_ids.unique().to_list()) == sorted(query_ids)
    )
    return record if matches else None


def _to_run_again(record: dict, retry_failed: bool) -> int:
    """How many of a stored run's episodes a re-run runs again: those that failed on transport,
    with ``retry_failed`` every failed one (end state "error" in a run stored before failures were
    counted)."""
    failures = record.get("failures")
    if failures is None:
        return record.get("end_states", {}).get("error", 0) if retry_failed else 0
    return sum(failures.values()) if retry_failed else failures.get("transport", 0)


def _failures_line(record: dict) -> str | None:
    """The run's failed episodes, by kind (trajectory.FAILURES), or None when none failed."""
    failures = record.get("failures") or {}
    if not failures:
        return None
    kinds = ", ".join(f"{kind} {n}" for kind, n in failures.items())
    episodes = record["n"] * record["rounds"]
    return f"failed episodes: {sum(failures.values())} of {episodes} ({kinds}); their trajectories say why"


class _TerminalBar:
    """`mirai evaluate`'s progress on a terminal (throughput.EpisodeBar): tqdm's bar on stderr with
    the episodes' rate and the time left, reckoned from the episodes run now (not resumed ones),
    and the tokens so far."""

    def start(self, done: int, total: int) -> None:
        from tqdm import tqdm

        self._shown = done
        self._bar = tqdm(total=total, initial=done, unit="episode", dynamic_ncols=True, file=sys.stderr)

    def update(self, progress) -> None:
        self._bar.set_postfix_str(f"tokens in/out {progress.tokens_in}/{progress.tokens_out}", refresh=False)
        self._bar.update(progress.done - self._shown)
        self._shown = progress.done

    def close(self) -> None:
        self._bar.close()


def _write_predictions(directory: Path, out: Path) -> int:
    """The stored run's predictions as `mirai score` and `mirai submit` read them: one JSONL line
    per query ({query_id, answer, ranked}) for a .jsonl ``out`` (one round), else MIRAI's
    round<N>/<QueryId>.json files under ``out``. Written atomically; returns the predictions."""
    from pipeline.evaluation.mirai_predictions import export_predictions

    if out.suffix != ".jsonl":
        return sum(len(paths) for paths in export_predictions(directory, out).values())
    results = pl.read_parquet(directory / "results.parquet", columns=["query_id", "prediction", "ranked"])
    lines = [
        json.dumps({"query_id": query_id, "answer": json.loads(prediction), "ranked": list(ranked)})
        for query_id, prediction, ranked in results.iter_rows()
    ]
    atomic_write_bytes(out, ("\n".join(lines) + "\n").encode())
    return len(lines)


def _checked_agent(args: argparse.Namespace, query_set: str):
    """The registry's agent entry the flags make, once the release directory, the flags and the
    API key's variable are checked: each problem is a CommandError, before any episode runs."""
    from pipeline.evaluation.registry import RegistryError, parse_agents

    release, out = args.release, args.out
    if not (release / f"{query_set}.parquet").is_file() or not (release / "database" / "events").is_dir():
        raise CommandError(
            f"{release} is not a downloaded release month (it needs {query_set}.parquet and database/): "
            "`mirai download YYYY-MM` fetches one (without --only)"
        )
    try:
        (agent,) = parse_agents({"agents": [evaluate_registry_entry(args)]}, source="flags")
    except RegistryError as exc:
        message = _as_flags(str(exc).split(": ", 2)[-1])
        if args.api_key_env is not None:  # a key given in its place is not echoed
            message = message.replace(repr(args.api_key_env), "a value not shown (it may be a key)")
        raise CommandError(message, status=2) from None
    if args.api_key_env is not None and args.api_key_env not in os.environ:
        raise CommandError(
            "--api-key-env names an environment variable that is not set: export the key in it "
            "(the name is not shown, in case it is the key itself)",
            status=2,
        )
    if out.suffix == ".jsonl" and agent.rounds > 1:
        raise CommandError(
            f"--rounds {agent.rounds} gives one prediction per query per round: give --out a directory "
            "(MIRAI's round<N>/ files) instead of a .jsonl file",
            status=2,
        )
    return agent


def _run_episodes(
    args, agent, query_set: str, frame: pl.DataFrame, run_dir: Path, directory: Path, client_settings, limiter
) -> dict:
    """Run (or resume) the agent's episodes on the release's queries; ``directory`` is where the
    harness stores the run under ``run_dir``. Returns the run's scores.json record."""
    from pipeline.agent_api import EventDatabase
    from pipeline.agent_api.event_database import DatabaseFileError
    from pipeline.evaluation.clients import client_for
    from pipeline.evaluation.llm import ModelUnavailable, OpenAIChatClient
    from pipeline.evaluation.run import checkpoint_path, evaluate_agent
    from pipeline.evaluation.subsets import limit_queries

    release, distance = args.release, agent.distances[0]
    resumed = checkpoint_path(directory).is_file()
    queries = limit_queries(frame, args.limit).height
    subset = f" (the --limit subset of {frame.height})" if queries < frame.height else ""
    print(
        f"{release.name} {query_set}: {queries} queries{subset} x {agent.rounds} round(s) = "
        f"{agent.rounds * queries} episodes of {agent.endpoint.model} at {agent.endpoint.base_url}, "
        f"distance {distance}" + (f"; resuming from {checkpoint_path(directory)}" if resumed else ""),
        flush=True,
    )
    database = None
    if agent.strategy == "react":
        sandbox = Settings.from_env().sandbox
        database = EventDatabase(
            release,
            allow_unconfined_sandbox=sandbox.allow_unconfined,
            sandbox_handover_grid_s=sandbox.handover_grid_s,
            untrusted_files=True,
        )
        try:  # every month the run reads, loaded and checked now: a bad file refuses the run, not its episodes
            database.gated_tables(frame.get_column("date").max() - timedelta(days=distance))
        except DatabaseFileError as exc:
            raise CommandError(str(exc)) from None
    try:
        with contextlib.closing(client_for(agent, client_settings, limiter)) as client:
            if isinstance(client, OpenAIChatClient):  # before any episode: a server that is not there
                client.check_reachable()
            # On a terminal a bar; elsewhere (CI, a Dagster run's log, a file) a line now and then.
            bar = _TerminalBar() if sys.stderr.isatty() else None
            _, record = evaluate_agent(
                frame,
                run_dir,
                agent,
                distance,
                query_set=query_set,
                force=True,  # a contaminated run is still scored; said below, and on the leaderboard
                client=client,
                client_settings=client_settings,
                database=database,
                progress=None if bar else lambda line: print(line, flush=True),
                progress_interval_s=args.progress_every,
                limit=args.limit,
                reuse_stored=True,  # its failed episodes only are run again (cmd_evaluate says which)
                retry_failed=args.retry_failed,
                bar=bar,
            )
    except ModelUnavailable as exc:
        kept = checkpoint_path(directory)
        raise CommandError(f"{exc}" + (f"; finished episodes are kept in {kept}" if kept.is_file() else "")) from None
    return record


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Run an LLM agent through the evaluation harness (pipeline/evaluation/run.py) on a downloaded
    release, with no Dagster and no agents.yaml (docs/evaluate-your-agent.md, "3. Run an agent")."""
    from pipeline.evaluation.agent_config import endpoint_limits
    from pipeline.evaluation.llm import ClientSettings
    from pipeline.evaluation.queries import InvalidQueries, release_queries
    from pipeline.evaluation.subsets import limit_ids

    release, out = args.release, args.out
    query_set = {"sample": "queries_sample", "all": "queries"}[args.queries]
    agent = _checked_agent(args, query_set)
    run_dir = args.run_dir or out.with_name(out.name + ".run")
    try:  # the directory may be one anyone handed over, not `mirai download`'s: checked before use
        frame = release_queries(release, query_set)
    except (InvalidQueries, ReleaseError) as exc:
        raise CommandError(str(exc)) from None
    distance = agent.distances[0]
    harness = {"max_tokens": args.max_tokens, "seed": args.seed}
    client_settings = ClientSettings(**{k: v for k, v in harness.items() if v is not None})
    directory = DataLayout(run_dir).evaluation_dir(
        frame.get_column("date").min().replace(day=1), agent.name, query_set, distance
    )
    limiter = RateLimiter(endpoint_limits(agent))  # here, not in the harness, so the run can say what it waited
    query_ids = limit_ids(frame.get_column("query_id").to_list(), args.limit)
    stored = _stored_run(directory, agent, client_settings, query_ids)
    again = _to_run_again(stored, args.retry_failed) if stored is not None else 0
    if stored is not None and not again:
        record = stored
        print(f"{release.name} {query_set}: already evaluated with these settings in {directory}; no episode re-run")
    else:
        if again:
            print(f"{release.name} {query_set}: {again} failed episode(s) of the run in {directory} are run again")
        record = _run_episodes(args, agent, query_set, frame, run_dir, directory, client_settings, limiter)
    written = _write_predictions(directory, out)
    if record["contaminated"]:
        print(f"contaminated: {record['eligibility']}", file=sys.stderr)
    cost = f", cost ${record['cost_usd']:.4f}" if record.get("cost_usd") is not None else ""
    print(
        f"{written} predictions in {out}; end states {record['end_states']}; tokens in/out "
        f"{record['tokens_in']}/{record['tokens_out']}{cost}; trajectories and scores.json in {directory}"
    )
    if limiter.throttles or limiter.waited_s:
        print(
            f"rate limits: waited {limiter.waited_s:.1f} s in all, {limiter.throttles} 429 response(s) from the endpoint"
        )
    failed = _failures_line(record)
    if failed:
        print(failed)
    transport = (record.get("failures") or {}).get("transport", 0)
    if transport:
        raise CommandError(
            f"{transport} episode(s) failed on transport (no completion came through: the endpoint refused or "
            "dropped the connection, timed out, or answered 429/5xx after the retries); they are not recorded as "
            "done: run the same command again to run them (and only them) again",
            status=TRANSPORT_FAILED_STATUS,
        )
    sample = " --sample" if query_set == "queries_sample" else ""
    limit = f" --limit {len(query_ids)}" if record.get("subset") else ""
    print(f"next: mirai score {out} --split {release}{sample}{limit} --distance {distance}")
    return 0


def add_evaluate(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "evaluate",
        parents=[debug],
        help="run an LLM agent through the evaluation harness on a downloaded release (no Dagster, no agents.yaml)",
        epilog="The flags fill an agents.yaml entry (docs/evaluation.md); unset ones take the registry's defaults.",
    )
    p.add_argument("release", type=Path, help="a release month's directory from `mirai download` (not --only split)")
    p.add_argument("--endpoint", required=True, help="an OpenAI-compatible base URL, e.g. http://host:8000/v1")
    p.add_argument("--model", required=True, help="the model name the endpoint serves")
    p.add_argument(
        "--api-key-env", help="the environment variable holding the API key (never the key itself; default: no key)"
    )
    p.add_argument(
        "--knowledge-cutoff",
        required=True,
        help="YYYY-MM-DD or YYYY-MM, the model's training-data end: a month not after it is run but contaminated",
    )
    p.add_argument("--queries", choices=("sample", "all"), default="sample", help="queries_sample (default) or all")
    p.add_argument("--distance", type=int, default=1, help="days between the visible history's end and the query")
    p.add_argument("--rounds", type=int, help="runs of every query (default 1; more need --out DIR)")
    p.add_argument("--strategy", help="react (default), direct or cot")
    p.add_argument("--action-type", help="react: single_function (default) or code_block")
    p.add_argument("--mode", help="native (default) or mirai (MIRAI's own loop, docs/mirai.md)")
    p.add_argument("--tools", help="react: full (default), kg or news")
    p.add_argument("--temperature", type=float, help="default 0.4, as MIRAI")
    p.add_argument("--max-steps", type=int, help="react: tool calls per episode (default 20)")
    p.add_argument("--concurrency", type=int, help="episodes at once (default 8)")
    p.add_argument("--requests-per-minute", type=int, help="the endpoint's request limit (default: none)")
    p.add_argument("--tokens-per-minute", type=int, help="the endpoint's token limit (default: none)")
    p.add_argument("--sandbox-memory-mb", type=int, help="react: what each episode's code sandbox may allocate")
    p.add_argument("--price-per-million-input-tokens", type=float, help="USD, for the cost (with the output price)")
    p.add_argument("--price-per-million-output-tokens", type=float, help="USD, for the cost (with the input price)")
    p.add_argument("--max-tokens", type=count_arg(1), help="per model reply (default 1024)")
    p.add_argument("--seed", type=int, help="sent with every request (default 0)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("predictions.jsonl"),
        help="a .jsonl file (default predictions.jsonl), or a directory for MIRAI's round<N>/ files",
    )
    p.add_argument(
        "--run-dir", type=Path, help="the checkpoint, trajectories and scores.json (default: OUT.run beside OUT)"
    )
    p.add_argument(
        "--limit",
        type=count_arg(1),
        help="only N of the queries, the same N on every machine (by a hash of their ids; `mirai score --limit N`)",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run every failed episode of the stored run again (those that failed on transport always are)",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=10.0,
        help="seconds between progress lines when stderr is not a terminal (a bar when it is; default 10)",
    )
    p.set_defaults(func=cmd_evaluate)
