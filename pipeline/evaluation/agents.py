"""The LLM agents: Direct, zero-shot CoT and ReAct (MIRAI, arXiv:2407.01231, §3, Appendices H and I)
over a chat client.

ReAct runs turns of "Thought: ... / Action: ..." against a date-gated Environment. Both action
types (``single_function``, one API call checked with ``ast``; ``code_block``, a fenced block) go
through ``Environment.run_code``, the sandboxed child process, so text a model writes is never
executed in this process. An episode ends in one of the ``end_state`` values of Appendix D.1/H;
one without a final answer gets one more request to the same model for it. Every model call is a
step in the trajectory. Actions, end states and the final-answer request: docs/evaluation.md,
"LLM agents". Mode ``mirai`` runs MIRAI's loop instead (agents/react_agents.py in
github.com/yecchen/MIRAI; pipeline/evaluation/mirai_mode.py): docs/mirai.md, "The `mirai` mode".
A reply is read by pipeline/evaluation/replies.py; the episode's records are in
pipeline/evaluation/trajectory.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date

from pipeline.agent_api.sandbox import SandboxError, installed_libraries, layers
from pipeline.agent_api.types import DateGateError
from pipeline.evaluation.llm import ChatClient, LLMError
from pipeline.evaluation.mirai_mode import mirai_extraction, mirai_turns
from pipeline.evaluation.prompts import final_request_messages, query_prompt, system_prompt
from pipeline.evaluation.replies import Action, execution_error, parse_action, read_answer, split_reply
from pipeline.evaluation.trajectory import (
    CONSECUTIVE_LIMIT,
    AgentSpec,
    Query,
    Step,
    Trajectory,
    call_model,
    llm_failure,
    record_reply,
)

OBSERVATION_CHARS = 4000  # of an observation shown to the model (the trajectory keeps it whole)


def code_libraries(spec: AgentSpec) -> tuple[str, ...]:
    """Libraries the agent's code blocks may import besides the standard-library modules: in mode
    mirai the ones MIRAI's prompt offers (numpy, pandas; networkx, scikit-learn when installed),
    none in native mode, whose sandbox starts without their import cost (docs/mirai.md)."""
    return installed_libraries() if spec.mode == "mirai" and spec.action_type == "code_block" else ()


def react_environment(database, spec: AgentSpec, query_date: date, distance: int):
    """The Environment a ReAct episode of ``spec`` gets: its tool subset, and in mode mirai MIRAI's
    entity counting, observation text and code-block libraries (docs/mirai.md)."""
    return database.environment(
        query_date,
        distance,
        tools=spec.tools,
        count_both_actors=spec.mode == "mirai",
        dialect=spec.mode,
        code_libraries=code_libraries(spec),
        memory_mb=spec.memory_mb,
    )


# --- episodes -----------------------------------------------------------------------------------


def _finish(client: ChatClient, spec: AgentSpec, system: str, text: str, trajectory: Trajectory, first_day) -> None:
    """Mode native: the final-answer request when there is no final answer yet. Mode mirai: the
    answer is always extracted by a separate request, as MIRAI does."""
    if spec.mode == "mirai":
        tools = spec.tools if trajectory.strategy == "react" else None
        mirai_extraction(client, spec, text, trajectory, tools, first_day)
    elif trajectory.end_state != "final_answer":
        _final_request(client, spec, system, text, trajectory)


def _notes(steps: list[Step]) -> str:
    """The work so far as text, for the final-answer request."""
    parts = []
    for step in steps:
        parts.append(step.reply.strip())
        if step.observation is not None:
            parts.append(f"Observation: {step.observation.strip()}")
        elif step.error:
            parts.append(f"Error: {step.error}")
    return "\n".join(p for p in parts if p)


def _final_request(client: ChatClient, spec: AgentSpec, system: str, query_text: str, trajectory: Trajectory) -> None:
    """The one extra request for a final answer (MIRAI's answer extraction step, Appendix H)."""
    step = Step(index=len(trajectory.steps), kind="final_request", reply="")
    trajectory.steps.append(step)
    messages = final_request_messages(system, query_text, _notes(trajectory.steps[:-1]))
    try:
        record_reply(step, call_model(client, messages, spec))
    except LLMError as exc:
        step.error = str(exc)
        trajectory.failed(llm_failure(exc))
        return
    answer = read_answer(step.reply)
    if answer is not None:
        trajectory.answer, trajectory.answer_source = answer, "final_request"


def _act(env, action: Action, action_type: str, step: Step) -> str:
    """Run a call or code block in the sandbox, or refuse an invalid action; record the
    observation and any error on the step; return the Observation message for the model."""
    if action.kind == "invalid":
        step.error = f"invalid action: {action.problem}"
        return f"Observation: Invalid action: {action.problem}."
    started = time.perf_counter()
    step.observation = env.run_code(action.code)
    step.env_s = time.perf_counter() - started
    step.error = execution_error(step.observation, action_type)
    return f"Observation: {_clip(step.observation)}"


def _react_turns(client: ChatClient, spec: AgentSpec, env, messages: list[dict], trajectory: Trajectory) -> str:
    """Run ReAct turns until an end state; return it."""
    invalid = repeated = 0
    previous = None
    for index in range(spec.max_steps):
        step = Step(index=index, kind="react", reply="")
        trajectory.steps.append(step)
        record_reply(step, call_model(client, messages, spec))
        step.thought, step.action, action = parse_action(step.reply, spec.action_type)
        step.action_kind = action.kind
        messages.append({"role": "assistant", "content": step.reply.strip()})
        if action.kind == "final":
            trajectory.answer, trajectory.answer_source = action.answer, "final_answer"
            return "final_answer"
        feedback = _act(env, action, spec.action_type, step)
        ok = step.error is None
        repeated = repeated + 1 if action.key and action.key == previous else 0
        previous = action.key or None
        if repeated:
            feedback += "\n(You took this same action in your previous step.)"
        invalid = 0 if ok else invalid + 1
        if invalid >= CONSECUTIVE_LIMIT:
            return "invalid_actions"
        if repeated + 1 >= CONSECUTIVE_LIMIT:
            return "repeated_actions"
        messages.append({"role": "user", "content": feedback})
    return "max_steps"


def _clip(observation: str) -> str:
    if len(observation) <= OBSERVATION_CHARS:
        return observation
    return observation[:OBSERVATION_CHARS] + f"\n[observation cut at {OBSERVATION_CHARS} characters]"


def run_react(
    client: ChatClient,
    spec: AgentSpec,
    query: Query,
    cutoff: date,
    env_factory: Callable[[], object],
    *,
    first_day: date,
) -> Trajectory:
    """One ReAct episode. ``env_factory`` opens the query's Environment (visible up to
    ``cutoff``, with the spec's tools); it is closed, and its sandbox stopped, when the episode
    ends. ``first_day``: the database's first day, which the prompt states."""
    trajectory = Trajectory(query.query_id, "react", spec.action_type)
    started = time.perf_counter()
    text = query_prompt(query.date, query.s, query.o, query.s_name, query.o_name, cutoff)
    system = system_prompt(
        "react",
        spec.action_type,
        spec.max_steps,
        tools=spec.tools,
        first_day=first_day,
        libraries=code_libraries(spec),
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    turns = mirai_turns if spec.mode == "mirai" else _react_turns
    try:
        with env_factory() as env:
            try:
                trajectory.end_state = turns(client, spec, env, messages, trajectory)
            finally:
                trajectory.sandbox = layers(env.sandbox_report)
    except (LLMError, SandboxError, DateGateError) as exc:
        # DateGateError: the query's cutoff is before the database starts, so no environment.
        trajectory.end_state, trajectory.error = "error", f"{type(exc).__name__}: {exc}"
        trajectory.failed(llm_failure(exc) if isinstance(exc, LLMError) else "environment")
        if trajectory.steps and trajectory.steps[-1].error is None:
            trajectory.steps[-1].error = trajectory.error
    _finish(client, spec, system, text, trajectory, first_day)
    trajectory.wall_s = time.perf_counter() - started
    return trajectory


def run_single_turn(client: ChatClient, spec: AgentSpec, query: Query, cutoff: date) -> Trajectory:
    """A Direct or zero-shot CoT episode: one reply from the model's own knowledge, no tools."""
    trajectory = Trajectory(query.query_id, spec.strategy, None)
    started = time.perf_counter()
    text = query_prompt(query.date, query.s, query.o, query.s_name, query.o_name, cutoff)
    system = system_prompt(spec.strategy)
    step = Step(index=0, kind="answer", reply="")
    trajectory.steps.append(step)
    try:
        record_reply(
            step, call_model(client, [{"role": "system", "content": system}, {"role": "user", "content": text}], spec)
        )
    except LLMError as exc:
        step.error = trajectory.error = f"{type(exc).__name__}: {exc}"
        trajectory.end_state = "error"
        trajectory.failed(llm_failure(exc))
    else:
        step.thought, _ = split_reply(step.reply)
        answer = read_answer(step.reply)
        if answer is None:
            trajectory.end_state = "no_answer"
        else:
            trajectory.answer, trajectory.answer_source, trajectory.end_state = answer, "final_answer", "final_answer"
    _finish(client, spec, system, text, trajectory, None)
    trajectory.wall_s = time.perf_counter() - started
    return trajectory
