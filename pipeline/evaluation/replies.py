"""A model's reply read: its thought and action (split_reply), a native ReAct action parsed into a
call, a code block, a final answer or an invalid action with what was wrong (parse_action), the
JSON answer in a text (read_answer), and the error the sandbox reported in an observation
(execution_error). Nothing here runs what a model wrote: calls are only checked with ``ast``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from pipeline.agent_api.environment import API_FUNCTIONS
from pipeline.evaluation.metrics import parse_answer

_FINAL = re.compile(r"final\s+answer\s*:", re.IGNORECASE)
_ACTION = re.compile(r"^\s*\**action\**\s*:\s*", re.IGNORECASE | re.MULTILINE)
_THOUGHT = re.compile(r"^\s*\**thought\**\s*:\s*", re.IGNORECASE)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_BACKTICKS = re.compile(r"^`+|`+$")
_EMPTY_OBJECT = re.compile(r"\{\s*\}")
# How the sandbox reports an exception: "ErrorType: message" at the start of a line.
_ERROR_LINE = re.compile(r"^[A-Z][A-Za-z]*(?:Error|Exception): ", re.MULTILINE)


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
