"""The prompts of the LLM agents (our own wording; MIRAI, arXiv:2407.01231, Appendix I is the model
for what they must convey), and the API description, generated from the Environment's signatures
and docstrings so it never drifts from the functions the sandbox actually offers.

Every system prompt is the same for all queries of an agent: the query-specific text (countries,
dates) is in the first user message. A local model then reuses the system prompt's cached keys
and values from one query to the next instead of re-reading it.
"""

from __future__ import annotations

import dataclasses
import inspect
from datetime import date
from functools import cache

from pipeline.agent_api import types
from pipeline.agent_api.environment import API_FUNCTIONS, Environment
from pipeline.agent_api.sandbox_child import ALLOWED_MODULES

PROMPT_VERSION = "prompts-v1"  # bump on any wording change: it is recorded with every run

_TASK = """\
You forecast how countries will act towards each other. An event is a quadruple (date, subject \
country, relation, object country). Countries are ISO 3166-1 alpha-3 codes such as "USA" or \
"CHN". Relations are CAMEO codes (Conflict and Mediation Event Observations), in two levels: 20 \
first-level codes "01" to "20" (for example "04" = consult), each with second-level codes that \
start with its two digits (for example "042" and "043" under "04"). Recorded events carry \
second-level codes."""

_ANSWER_FORMAT = """\
The answer is a JSON object whose keys are the first-level codes you predict and whose values \
are the lists of second-level codes you predict under each key, for example \
{"03": ["036"], "04": ["040", "042"]}. Both levels are scored by precision and recall, so list \
only the codes you have reason to expect."""

_DIRECT = f"""{_TASK}

{_ANSWER_FORMAT}

Reply with one line and nothing else: Final Answer: <the JSON object>"""

_COT = f"""{_TASK}

{_ANSWER_FORMAT}

First reason step by step about the two countries and how they have been dealing with each \
other. Then end your reply with: Final Answer: <the JSON object>"""

_REACT_INTRO = f"""{_TASK}

You have a database of past events and news articles, queried through this Python API:

```python
<API>
```

Arguments: date_range is a DateRange or None (no limit); head_entities, tail_entities and \
interacted_entities are lists of ISO codes; relations and involved_relations are lists of CAMEO \
codes (a first-level code stands for all its second-level codes); keywords is a list of words. \
Plain strings work wherever a data class is expected. Dates after the last visible day are \
refused.

{_ANSWER_FORMAT}

Work in turns. Each of your replies has exactly two parts:
Thought: what you know so far and what you want to find out next
Action: """

_SINGLE_FUNCTION = """one call of one API function on one line, with no other code or text, \
for example get_relation_distribution(head_entities=["USA"], tail_entities=["CHN"])
Then stop: the next message is the Observation, the value the call returned."""

_CODE_BLOCK = """a Python code block between ```python and ``` that calls the API and print()s \
what you want to see, for example
```python
dist = get_relation_distribution(head_entities=["USA"], tail_entities=["CHN"])
print(list(dist.items())[:10])
```
Then stop: the next message is the Observation, what the block printed. Variables persist from \
one block to the next. Modules you may import: {modules}."""

_REACT_END = """

When the evidence is enough, reply with a Thought that sums it up and the action
Action: Final Answer: <the JSON object>
You have at most {max_steps} actions; the final answer is one of them. Look at both the \
relations between the two countries and their news, and weigh recent events more."""

_QUERY = """\
Which relations will {s_name} ({s}) take towards {o_name} ({o}) on {day:%B} {day.day}, {day:%Y}?
The last day with visible events and news is {cutoff:%B} {cutoff.day}, {cutoff:%Y} ({cutoff}).
In the API's terms: Event(date=Date("{day}"), head_entity=ISOCode("{s}"), relation=?, \
tail_entity=ISOCode("{o}"))."""

_FINAL_REQUEST = """{query}

Your work on this query so far (the most recent part last):
{notes}

You cannot query anything more. Give your forecast now, as one line and nothing else:
Final Answer: <the JSON object>"""

NOTES_CHARS = 6000  # the tail of the work shown in the final-answer request (about 1.5k tokens)


def _annotation(value: object) -> str:
    # Annotations are strings under `from __future__ import annotations`.
    return value if isinstance(value, str) else getattr(value, "__name__", repr(value))


def _signature(function) -> str:
    sig = inspect.signature(function)
    params = []
    for param in sig.parameters.values():
        if param.name == "self":
            continue
        text = param.name
        if param.annotation is not inspect.Parameter.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not inspect.Parameter.empty:
            text += (
                f" = {param.default!r}" if param.annotation is not inspect.Parameter.empty else f"={param.default!r}"
            )
        params.append(text)
    returns = "" if sig.return_annotation is inspect.Signature.empty else f" -> {_annotation(sig.return_annotation)}"
    return f"({', '.join(params)}){returns}"


def _class_line(cls) -> str:
    fields = ", ".join(f"{f.name}: {_annotation(f.type)}" for f in dataclasses.fields(cls))
    doc = inspect.getdoc(cls) or ""
    # A dataclass without a docstring gets its own signature as __doc__: nothing to add then.
    note = "" if doc.startswith(cls.__name__ + "(") else "  # " + " ".join(doc.split())
    return f"class {cls.__name__}({fields}){note}"


@cache
def api_description() -> str:
    """The data classes and functions agents can use, as Python stubs with their docstrings."""
    classes = [
        getattr(types, name)
        for name in ("Date", "DateRange", "ISOCode", "Country", "CAMEOCode", "Relation", "Event", "NewsArticle")
    ]
    lines = ["# Data classes", *(_class_line(cls) for cls in classes), "", "# Functions"]
    for name in API_FUNCTIONS:
        function = getattr(Environment, name)
        lines.append(f"def {name}{_signature(function)}")
        doc = inspect.getdoc(function)
        if doc:
            lines.append("    " + " ".join(doc.split()))
    return "\n".join(lines)


def system_prompt(strategy: str, action_type: str | None = None, max_steps: int | None = None) -> str:
    if strategy == "direct":
        return _DIRECT
    if strategy == "cot":
        return _COT
    if strategy != "react":
        raise ValueError(f"unknown strategy {strategy!r}")
    if action_type == "single_function":
        action = _SINGLE_FUNCTION
    elif action_type == "code_block":
        action = _CODE_BLOCK.format(modules=", ".join(sorted(ALLOWED_MODULES)))
    else:
        raise ValueError(f"unknown action type {action_type!r}")
    # replace, not format: the intro holds the answer format's literal braces.
    return _REACT_INTRO.replace("<API>", api_description()) + action + _REACT_END.format(max_steps=max_steps)


def query_prompt(day: date, s: str, o: str, s_name: str, o_name: str, cutoff: date) -> str:
    return _QUERY.format(day=day, s=s, o=o, s_name=s_name, o_name=o_name, cutoff=cutoff)


def final_request_messages(system: str, query: str, notes: str) -> list[dict[str, str]]:
    """The one extra request made when an episode ends without a final answer: a fresh
    conversation (so it fits whatever context the episode used up) with the episode's system
    prompt (a local model reuses its cached prefix), the query and the tail of the work done."""
    if len(notes) > NOTES_CHARS:
        notes = "[...]\n" + notes[-NOTES_CHARS:]
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": _FINAL_REQUEST.format(query=query, notes=notes or "(nothing)")},
    ]
