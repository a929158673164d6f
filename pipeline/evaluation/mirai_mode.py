"""Mode mirai: MIRAI's own ReAct loop (agents/react_agents.py in github.com/yecchen/MIRAI) and its
answer extraction, a separate request whose reply is read as MIRAI reads it. Native ReAct and the
runs of both modes are in pipeline/evaluation/agents.py; what the two modes differ in:
docs/mirai.md, "The `mirai` mode".
"""

from __future__ import annotations

import ast
import json
import re
import time
from collections import Counter

from pipeline.evaluation.llm import ChatClient, LLMError
from pipeline.evaluation.prompts import extraction_messages
from pipeline.evaluation.replies import execution_error, split_reply
from pipeline.evaluation.trajectory import (
    CONSECUTIVE_LIMIT,
    AgentSpec,
    Step,
    Trajectory,
    call_model,
    llm_failure,
    record_reply,
)

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
# What MIRAI's loop (agents/react_agents.py, ReactAgent.step) shows the model, word for word, so an
# agent in mode mirai reads what it would read there: the observation of an empty list or dict, of
# a code block that printed an empty object, of an empty, a repeated or an invalid action (the
# exception's message, then the note of the action type).
EMPTY_VALUE = "Empty output from the function call."
EMPTY_PRINT = "No printed output from the action because you are printing an empty object."
NULL_ACTION = "No feedback from the environment due to the null action."
_FINAL_HINT = (
    "If you are making the final forecast, please start the action immediately with 'Final Answer:' "
    "without enclosing within triple backticks, for example, 'Action: Final Answer: {}'"
)
REPEATED_ACTION = (
    "The same action has been executed before. Try a different action with correct format. If you are "
    "collecting data with code, please make sure your action is a valid and executable code with correct "
    "syntax based on the API description; " + _FINAL_HINT
)
ERROR_NOTES = {
    "single_function": "Please make sure your action is a valid and executable function call with correct "
    "arguments based on the API description.",
    "code_block": "If you are collecting data with code, please make sure your action is a valid and executable "
    "block of code with correct syntax based on the API description, and use print() for outputs; " + _FINAL_HINT,
}
NO_PRINT = "No print() statement in the action"
# The sandbox reports an exception as "ValueError: message"; MIRAI's loop shows str() of it.
_EXCEPTION_TYPE = re.compile(r"^[A-Za-z_][\w.]*: ")
# Mode mirai, single function: the harness asks the sandbox for the expression's str() (MIRAI's
# observation), or MIRAI's note for an empty list or dict.
_SHOW_VALUE = (
    "_mirai_value = ({expression})\n"
    f"print({EMPTY_VALUE!r} if isinstance(_mirai_value, (list, dict)) and not _mirai_value else _mirai_value)"
)


def invalid_observation(problem: str, action_type: str) -> str:
    """MIRAI's observation of an invalid action: "Invalid action: <the exception's message>. <note>"."""
    return f"Invalid action: {_EXCEPTION_TYPE.sub('', problem, count=1)}. {ERROR_NOTES[action_type]}"


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


def mirai_extraction(client: ChatClient, spec: AgentSpec, text: str, trajectory: Trajectory, tools, first_day) -> None:
    """The episode's answer, always asked for in a separate request, as MIRAI does: it replaces
    whatever answer the episode found itself."""
    step = Step(index=len(trajectory.steps), kind="extraction", reply="")
    messages = extraction_messages(text, _extraction_info(trajectory), tools, first_day)
    trajectory.steps.append(step)
    try:
        reply = client.chat(messages, temperature=EXTRACTION_TEMPERATURE, max_tokens=spec.max_tokens, stop=[])
    except LLMError as exc:
        step.error = str(exc)
        trajectory.failed(llm_failure(exc))
        trajectory.answer, trajectory.answer_source = {}, "none"  # the answer is only ever the extracted one
        return
    record_reply(step, reply)
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
                output = EMPTY_PRINT
            else:
                problem = NO_PRINT
        step.observation = output.rstrip("\n") if action_type == "single_function" else output
    step.action_kind = "invalid" if problem else ("call" if action_type == "single_function" else "code")
    step.error = problem and f"invalid action: {problem}"
    return problem is None


def mirai_turns(client: ChatClient, spec: AgentSpec, env, messages: list[dict], trajectory: Trajectory) -> str:
    """MIRAI's loop (agents/react_agents.py): at most max_steps actions; an empty action is
    told so and not counted; an action taken before is not run again, and its
    (CONSECUTIVE_LIMIT + 1)th occurrence ends the episode; an action containing "final answer"
    ends it; CONSECUTIVE_LIMIT invalid actions in a row end it."""
    invalid = 0
    performed: Counter[str] = Counter()
    for index in range(spec.max_steps):
        step = Step(index=index, kind="react", reply="")
        trajectory.steps.append(step)
        record_reply(step, call_model(client, messages, spec))
        step.thought, step.action = split_reply(step.reply)
        messages.append({"role": "assistant", "content": step.reply.strip()})
        if not step.action:
            step.action_kind = "null"
            feedback = f"Observation: {NULL_ACTION}"
        else:
            performed[step.action] += 1
            seen = performed[step.action]
            if seen > CONSECUTIVE_LIMIT:
                step.action_kind, step.error = "repeated", f"the same action for the {seen}th time"
                return "repeated_actions"
            if seen > 1:
                step.action_kind, step.error = "repeated", "the same action as before; not run again"
                feedback = f"Observation: {REPEATED_ACTION}"
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
                feedback = f"Observation: {invalid_observation(problem, spec.action_type)}"
        messages.append({"role": "user", "content": feedback})
    return "max_steps"
