"""The LLM agents: Direct, zero-shot CoT and ReAct (MIRAI, arXiv:2407.01231, §3, Appendices H and I)
over a chat client.

ReAct runs turns of "Thought: ... / Action: ..." against a date-gated Environment. Both action
types (``single_function``, one API call checked with ``ast``; ``code_block``, a fenced block) go
through ``Environment.run_code``, the sandboxed child process, so text a model writes is never
executed in this process. An episode ends in one of the ``end_state`` values of Appendix D.1/H;
one without a final answer gets one more request to the same model for it. Every model call is a
step in the trajectory. Actions, end states and the final-answer request: docs/evaluation.md,
"LLM agents". Mode ``mirai`` runs MIRAI's loop instead (agents/react_agents.py in
github.com/yecchen/MIRAI): docs/mirai.md, "The `mirai` mode".
"""

from __future__ import annotations

import ast
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date

from pipeline.agent_api.environment import API_FUNCTIONS
from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB, SandboxError, installed_libraries, layers
from pipeline.agent_api.types import DateGateError
from pipeline.evaluation.llm import ChatClient, LLMError, Reply
from pipeline.evaluation.metrics import parse_answer
from pipeline.evaluation.prompts import (
    extraction_messages,
    final_request_messages,
    query_prompt,
    system_prompt,
)

CONSECUTIVE_LIMIT = 3  # MIRAI D.1: three consecutive invalid (or repeated) actions end an episode
OBSERVATION_CHARS = 4000  # of an observation shown to the model (the trajectory keeps it whole)
STOP = ["Observation:"]  # the model must not write the environment's reply itself

_FINAL = re.compile(r"final\s+answer\s*:", re.IGNORECASE)
_ACTION = re.compile(r"^\s*\**action\**\s*:\s*", re.IGNORECASE | re.MULTILINE)
_THOUGHT = re.compile(r"^\s*\**thought\**\s*:\s*", re.IGNORECASE)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_BACKTICKS = re.compile(r"^`+|`+$")
_EMPTY_OBJECT = re.compile(r"\{\s*\}")
# How the sandbox reports an exception: "ErrorType: message" at the start of a line.
_ERROR_LINE = re.compile(r"^[A-Z][A-Za-z]*(?:Error|Exception): ", re.MULTILINE)

# Mode mirai (MIRAI's agents/react_agents.py): its extractor model ran at temperature 0.2; an action
# that starts with a fence runs the fence's content, any other action runs whole; the answer is the
# JSON object between <answer> tags once all whitespace is removed; the extraction request shows
# the last two useful steps, at most 4,000 words.
EXTRACTION_TEMPERATURE = 0.2
EXTRACTION_STEPS = 2
EXTRACTION_WORDS = 4000
_LEADING_FENCE = re.compile(r"```(?:\w+\n)?(.*?)```", re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>")
_WHITESPACE = re.compile(r"\s+")
# Mode mirai, single function: the harness asks the sandbox for the expression's str() (MIRAI's
# observation), or, as MIRAI does, a note (ours) for an empty list or dict.
_EMPTY_VALUE_NOTE = "Empty result: the call returned an empty list or dict."
_SHOW_VALUE = (
    "_mirai_value = ({expression})\n"
    f"print({_EMPTY_VALUE_NOTE!r} if isinstance(_mirai_value, (list, dict)) and not _mirai_value else _mirai_value)"
)
_MIRAI_NOTES = {
    "single_function": "The action must be one valid, executable expression calling the API with correct arguments.",
    "code_block": "To collect data, the action must be valid, executable Python that print()s what it finds; to "
    "forecast, start the action with 'Final Answer:' and do not put it in a code fence.",
}


@dataclass(frozen=True)
class Query:
    query_id: str
    date: date
    s: str
    o: str
    s_name: str
    o_name: str


@dataclass
class Step:
    """One model call. ``kind``: "react" (a ReAct turn), "answer" (the Direct/CoT reply),
    "final_request" (the extra request for a final answer) or "extraction" (mode mirai's answer
    extraction). ``action_kind``: "call", "code", "final", "invalid", in mode mirai also
    "repeated" (not run) and "null" (an empty action), or "" when the step has no action."""

    index: int
    kind: str
    reply: str
    thought: str = ""
    action: str = ""
    action_kind: str = ""
    observation: str | None = None
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0  # the model call
    env_s: float = 0.0  # the environment (sandbox) call


@dataclass
class Trajectory:
    query_id: str
    strategy: str
    action_type: str | None
    end_state: str = ""
    answer: dict = field(default_factory=dict)
    answer_source: str = "none"  # "final_answer", "final_request", "extraction" (mode mirai) or "none"
    steps: list[Step] = field(default_factory=list)
    error: str | None = None  # what ended an episode in state "error"
    wall_s: float = 0.0
    sandbox: dict | None = None  # the confinement layers of the episode's sandbox; None: no code ran

    @property
    def n_actions(self) -> int:
        return sum(s.kind == "react" for s in self.steps)

    def record(self) -> dict:
        """The trajectory as stored in trajectories.jsonl (JSON-ready)."""
        return asdict(self) | {
            "n_actions": self.n_actions,
            "tokens_in": sum(s.tokens_in for s in self.steps),
            "tokens_out": sum(s.tokens_out for s in self.steps),
            "model_s": sum(s.latency_s for s in self.steps),
            "env_s": sum(s.env_s for s in self.steps),
        }


@dataclass(frozen=True)
class AgentSpec:
    """What the harness needs of a registry entry (pipeline.evaluation.registry.Agent)."""

    strategy: str
    action_type: str | None
    temperature: float
    max_steps: int | None
    max_tokens: int
    mode: str = "native"  # registry.MODES
    tools: str = "full"  # the API subset (environment.TOOL_SUBSETS); react only
    memory_mb: int = DEFAULT_MEMORY_MB  # what each code block's sandbox may allocate; react only


def code_libraries(spec: AgentSpec) -> tuple[str, ...]:
    """Libraries the agent's code blocks may import besides the standard-library modules: in mode
    mirai the ones MIRAI's prompt offers (numpy, pandas; networkx, scikit-learn when installed),
    none in native mode, whose sandbox starts without their import cost (docs/mirai.md)."""
    return installed_libraries() if spec.mode == "mirai" and spec.action_type == "code_block" else ()


def react_environment(database, spec: AgentSpec, query_date: date, distance: int):
    """The Environment a ReAct episode of ``spec`` gets: its tool subset, and in mode mirai MIRAI's
    entity counting and code-block libraries (docs/mirai.md)."""
    return database.environment(
        query_date,
        distance,
        tools=spec.tools,
        count_both_actors=spec.mode == "mirai",
        code_libraries=code_libraries(spec),
        memory_mb=spec.memory_mb,
    )


# --- parsing a reply ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    kind: str  # "call", "code", "final" or "invalid"
    code: str = ""  # what run_code executes ("call", "code")
    key: str = ""  # the normalised action, for repeat detection
    answer: dict | None = None  # "final"
    problem: str = ""  # "invalid": what was wrong, shown to the model


def split_reply(text: str) -> tuple[str, str]:
    """(thought, action): the action is what follows the last "Action:" line, the thought what
    precedes it without its "Thought:" label; with no "Action:" the whole reply is the action."""
    marks = list(_ACTION.finditer(text))
    if not marks:
        return "", text.strip()
    last = marks[-1]
    return _THOUGHT.sub("", text[: last.start()].strip(), count=1), text[last.end() :].strip()


def read_answer(text: str) -> dict | None:
    """The JSON object in the text (parse_answer), or None when there is none: parse_answer's
    {} means "nothing readable" unless the text really holds an empty object."""
    answer = parse_answer(text)
    return answer if answer or _EMPTY_OBJECT.search(text) else None


def _final(text: str) -> Action | None:
    match = _FINAL.search(text)
    if match is None:
        return None
    answer = read_answer(text[match.end() :])
    if answer is None:
        return Action("invalid", problem='"Final Answer:" must be followed by the JSON object, e.g. {"04": ["042"]}')
    return Action("final", answer=answer)


def parse_call(action: str) -> Action:
    """A single-function action: exactly one call of an API function (any arguments; they are
    evaluated in the sandbox)."""
    code = _BACKTICKS.sub("", action.strip()).strip()
    fenced = _FENCE.search(action)
    if fenced:
        code = fenced.group(1).strip()
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError:
        return Action(
            "invalid",
            problem="the action must be one Python call of an API function on one line, "
            'e.g. count_events(head_entities=["USA"])',
        )
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in API_FUNCTIONS):
        return Action("invalid", problem="the action must call one of the API functions: " + ", ".join(API_FUNCTIONS))
    normal = ast.unparse(tree)
    return Action("call", code=normal, key=normal)


def parse_code_block(action: str) -> Action:
    """A code-block action: the first ```python fenced block."""
    fenced = _FENCE.search(action)
    if fenced is None or not fenced.group(1).strip():
        return Action("invalid", problem="the action must be a Python code block between ```python and ```")
    code = fenced.group(1).strip("\n")
    key = "\n".join(line.rstrip() for line in code.strip().splitlines() if line.strip())
    return Action("code", code=code, key=key)


def parse_action(text: str, action_type: str) -> tuple[str, str, Action]:
    """(thought, action text, parsed action) of one ReAct reply. A final answer written outside
    the action part still counts, but only when the action itself is not a valid one ("Thought:
    before the Final Answer: I need data" must not spoil the call that follows)."""
    thought, action = split_reply(text)
    final = _final(action)
    if final is not None:
        return thought, action, final
    parsed = (parse_call if action_type == "single_function" else parse_code_block)(action)
    if parsed.kind == "invalid" and (elsewhere := _final(text)) is not None and elsewhere.kind == "final":
        return thought, action, elsewhere
    return thought, action, parsed


def execution_error(observation: str, action_type: str) -> str | None:
    """The error the sandbox reported, if any: a single call's whole output is either its value
    or the error; a code block's error follows whatever it printed."""
    if action_type == "single_function":
        return observation.strip() if _ERROR_LINE.match(observation) else None
    match = _ERROR_LINE.search(observation)
    return observation[match.start() :].strip() if match else None


# --- episodes -----------------------------------------------------------------------------------


def _call(client: ChatClient, messages: list[dict], spec: AgentSpec) -> Reply:
    return client.chat(messages, temperature=spec.temperature, max_tokens=spec.max_tokens, stop=STOP)


def _finish(client: ChatClient, spec: AgentSpec, system: str, text: str, trajectory: Trajectory, first_day) -> None:
    """Mode native: the final-answer request when there is no final answer yet. Mode mirai: the
    answer is always extracted by a separate request, as MIRAI does."""
    if spec.mode == "mirai":
        tools = spec.tools if trajectory.strategy == "react" else None
        _extraction(client, spec, text, trajectory, tools, first_day)
    elif trajectory.end_state != "final_answer":
        _final_request(client, spec, system, text, trajectory)


def _model_step(step: Step, reply: Reply) -> None:
    step.reply, step.tokens_in, step.tokens_out, step.latency_s = (
        reply.text,
        reply.tokens_in,
        reply.tokens_out,
        reply.latency_s,
    )


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
        _model_step(step, _call(client, messages, spec))
    except LLMError as exc:
        step.error = str(exc)
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
        _model_step(step, _call(client, messages, spec))
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


def mirai_answer(text: str) -> dict | None:
    """The answer MIRAI's extraction step reads: with all whitespace removed, the first
    <answer>...</answer> holding a JSON object; None when there is none (MIRAI's '')."""
    match = _ANSWER_TAG.search(_WHITESPACE.sub("", text))
    if match is None:
        return None
    try:
        answer = json.loads(match.group(1))
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _extraction_info(trajectory: Trajectory) -> str:
    """The last EXTRACTION_STEPS steps that did something (a valid action or the final answer),
    oldest first, cut to their last EXTRACTION_WORDS words; a Direct/CoT reply as it is."""
    if trajectory.strategy != "react":
        return trajectory.steps[0].reply if trajectory.steps else ""
    useful = [
        s
        for s in trajectory.steps
        if s.kind == "react" and s.error is None and s.action_kind in ("call", "code", "final")
    ]
    parts = []
    for step in useful[-EXTRACTION_STEPS:]:
        parts.append(f"Thought: {step.thought}\nAction: {step.action}")
        if step.observation is not None:
            parts.append(f"Observation: {step.observation}")
    words = "\n".join(parts).split(" ")
    return " ".join(words[-EXTRACTION_WORDS:])


def _extraction(client: ChatClient, spec: AgentSpec, text: str, trajectory: Trajectory, tools, first_day) -> None:
    step = Step(index=len(trajectory.steps), kind="extraction", reply="")
    messages = extraction_messages(text, _extraction_info(trajectory), tools, first_day)
    trajectory.steps.append(step)
    try:
        reply = client.chat(messages, temperature=EXTRACTION_TEMPERATURE, max_tokens=spec.max_tokens, stop=[])
    except LLMError as exc:
        step.error = str(exc)
        trajectory.answer, trajectory.answer_source = {}, "none"  # the answer is only ever the extracted one
        return
    _model_step(step, reply)
    answer = mirai_answer(step.reply)
    # The extracted answer replaces the episode's own, as in MIRAI; none extracted means {}.
    trajectory.answer, trajectory.answer_source = (answer, "extraction") if answer is not None else ({}, "none")


def mirai_code(action: str, action_type: str) -> tuple[str, str | None]:
    """(code for the sandbox, problem) of a mode-mirai action: MIRAI eval()s a single-function
    action, so any one expression is accepted (run in the sandbox, its value shown with str());
    a code block runs as MIRAI exec()s it, with no echo of a final expression."""
    fenced = _LEADING_FENCE.match(action)
    code = (fenced.group(1) if fenced else action).strip()
    if action_type == "code_block":
        return code + "\npass", None  # a trailing `pass`: the sandbox echoes only a final expression
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as exc:
        return "", f"SyntaxError: {exc.msg}"
    return _SHOW_VALUE.format(expression=ast.unparse(tree.body)), None


def _mirai_act(env, action: str, action_type: str, step: Step) -> bool:
    """Run a mode-mirai action in the sandbox; record observation and error; whether it was valid
    (MIRAI's rules: an error, or a code block with no output and no print(), is invalid)."""
    code, problem = mirai_code(action, action_type)
    if problem is None:
        started = time.perf_counter()
        output = env.run_code(code)
        step.env_s = time.perf_counter() - started
        problem = execution_error(output, action_type)
        if problem is None and action_type == "code_block" and output == "":
            if "print(" in code:
                output = "No printed output: what the action printed was empty."
            else:
                problem = "the code block has no print() statement, so it shows nothing"
        step.observation = output.rstrip("\n") if action_type == "single_function" else output
    step.action_kind = "invalid" if problem else ("call" if action_type == "single_function" else "code")
    step.error = problem and f"invalid action: {problem}"
    return problem is None


def _mirai_turns(client: ChatClient, spec: AgentSpec, env, messages: list[dict], trajectory: Trajectory) -> str:
    """MIRAI's loop (agents/react_agents.py): at most max_steps actions; an empty action is
    told so and not counted; an action taken before is not run again, and its
    (CONSECUTIVE_LIMIT + 1)th occurrence ends the episode; an action containing "final answer"
    ends it; CONSECUTIVE_LIMIT invalid actions in a row end it."""
    invalid = 0
    performed: Counter[str] = Counter()
    for index in range(spec.max_steps):
        step = Step(index=index, kind="react", reply="")
        trajectory.steps.append(step)
        _model_step(step, _call(client, messages, spec))
        step.thought, step.action = split_reply(step.reply)
        messages.append({"role": "assistant", "content": step.reply.strip()})
        if not step.action:
            step.action_kind = "null"
            feedback = "Observation: No feedback: the action was empty. Write the action after 'Action:'."
        else:
            performed[step.action] += 1
            seen = performed[step.action]
            if seen > CONSECUTIVE_LIMIT:
                step.action_kind, step.error = "repeated", f"the same action for the {seen}th time"
                return "repeated_actions"
            if seen > 1:
                step.action_kind, step.error = "repeated", "the same action as before; not run again"
                feedback = (
                    "Observation: This exact action was taken before, so it was not run again. Take a different "
                    "action. " + _MIRAI_NOTES[spec.action_type]
                )
            elif "final answer" in step.action.lower():
                step.action_kind = "final"
                return "final_answer"
            elif _mirai_act(env, step.action, spec.action_type, step):
                invalid = 0
                feedback = f"Observation: {step.observation}"
            else:
                invalid += 1
                if invalid >= CONSECUTIVE_LIMIT:
                    return "invalid_actions"
                problem = step.error.removeprefix("invalid action: ")
                feedback = f"Observation: Invalid action: {problem} {_MIRAI_NOTES[spec.action_type]}"
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
    turns = _mirai_turns if spec.mode == "mirai" else _react_turns
    try:
        with env_factory() as env:
            try:
                trajectory.end_state = turns(client, spec, env, messages, trajectory)
            finally:
                trajectory.sandbox = layers(env.sandbox_report)
    except (LLMError, SandboxError, DateGateError) as exc:
        # DateGateError: the query's cutoff is before the database starts, so no environment.
        trajectory.end_state, trajectory.error = "error", f"{type(exc).__name__}: {exc}"
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
        _model_step(
            step, _call(client, [{"role": "system", "content": system}, {"role": "user", "content": text}], spec)
        )
    except LLMError as exc:
        step.error = trajectory.error = f"{type(exc).__name__}: {exc}"
        trajectory.end_state = "error"
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
