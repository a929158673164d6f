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
from pipeline.agent_api.environment import TOOL_SUBSETS, Environment
from pipeline.agent_api.sandbox_child import ALLOWED_MODULES

PROMPT_VERSION = "prompts-v2"  # bump on any wording change: it is recorded with every run

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

You have a database of <CONTENT>. It starts on <FIRST_DAY>: nothing earlier is recorded, and \
earlier dates are refused. Each query says the last day you can see. You query the database \
through this Python API:

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
for example {call}
Then stop: the next message is the Observation, the value the call returned."""

_CODE_BLOCK = """a Python code block between ```python and ``` that calls the API and print()s \
what you want to see, for example
```python
found = {call}
print({shown})
```
Then stop: the next message is the Observation, what the block printed. Variables persist from \
one block to the next. Modules you may import: {modules}."""

_REACT_END = """

When the evidence is enough, reply with a Thought that sums it up and the action
Action: Final Answer: <the JSON object>
You have at most {max_steps} actions; the final answer is one of them. {evidence} Use \
different functions to look from several sides: what the CAMEO codes mean, how each country deals \
with third countries, counts and distributions over time. Weigh how recent the evidence is, not \
only how frequent."""

# What the database holds and what evidence to gather, for each API subset (MIRAI's
# agent_prompts/prompts_react_func_{full,kg,news}.py differ in these two points).
_CONTENT = {
    "full": "news articles and the events extracted from them",
    "kg": "events (the news articles they come from are not available to you)",
    "news": "news articles (the events extracted from them are not available to you)",
}
# The examples call a function the subset has.
_EXAMPLE_CALL = {
    "full": 'get_relation_distribution(head_entities=["USA"], tail_entities=["CHN"])',
    "kg": 'get_relation_distribution(head_entities=["USA"], tail_entities=["CHN"])',
    "news": 'get_news_articles(head_entities=["USA"], tail_entities=["CHN"])',
}
_EXAMPLE_SHOWN = {"full": "list(found.items())[:10]", "kg": "list(found.items())[:10]", "news": "found[:5]"}
_EVIDENCE = {
    "full": "Collect both relational evidence (events and their statistics) and news before you forecast.",
    "kg": "Collect enough evidence from the events and their statistics before you forecast.",
    "news": "Collect enough evidence from the news before you forecast.",
}

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

# Mode mirai: MIRAI's separate answer-extraction request (agent_prompts/prompt_extraction.py), in
# our words: the query, what the database holds, the latest work, and the answer in <answer> tags.
_EXTRACTION = """Extract the final forecast for this query.

{query}

{database}

The latest work on the query (thoughts, actions and observations; it may already end with a \
forecast after "Final Answer:"):
{info}

{answer_format}

If the work above already gives a final forecast, only rewrite that forecast. Otherwise reason \
from the information above and make the most confident forecast it supports. Either way, end \
with the forecast as a JSON object inside XML tags, for example \
<answer>{{"03": ["036"], "04": ["040", "042"]}}</answer>."""


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


def first_day_text(day: date) -> str:
    return f"{day:%B} {day.day}, {day:%Y} ({day})"


@cache
def api_description(tools: str = "full") -> str:
    """The data classes and functions agents can use, as Python stubs with their docstrings:
    the functions of the ``tools`` subset only (without news, no NewsArticle class either, as in
    MIRAI's APIs/api_description_kg.py)."""
    names = ["Date", "DateRange", "ISOCode", "Country", "CAMEOCode", "Relation", "Event", "NewsArticle"]
    if tools == "kg":
        names.remove("NewsArticle")
    classes = [getattr(types, name) for name in names]
    lines = ["# Data classes", *(_class_line(cls) for cls in classes), "", "# Functions"]
    for name in TOOL_SUBSETS[tools]:
        function = getattr(Environment, name)
        lines.append(f"def {name}{_signature(function)}")
        doc = inspect.getdoc(function)
        if doc:
            lines.append("    " + " ".join(doc.split()))
    return "\n".join(lines)


def system_prompt(
    strategy: str,
    action_type: str | None = None,
    max_steps: int | None = None,
    *,
    tools: str = "full",
    first_day: date | None = None,
    libraries: tuple[str, ...] = (),
) -> str:
    """The agent's system prompt. A ReAct prompt needs the database's ``first_day`` (it tells the
    model where the history starts) and lists only the ``tools`` subset's functions; a code-block
    prompt lists the standard-library modules and the ``libraries`` its sandbox loads."""
    if strategy == "direct":
        return _DIRECT
    if strategy == "cot":
        return _COT
    if strategy != "react":
        raise ValueError(f"unknown strategy {strategy!r}")
    if first_day is None:
        raise ValueError("a react prompt needs the database's first day")
    if action_type == "single_function":
        action = _SINGLE_FUNCTION.format(call=_EXAMPLE_CALL[tools])
    elif action_type == "code_block":
        action = _CODE_BLOCK.format(
            call=_EXAMPLE_CALL[tools],
            shown=_EXAMPLE_SHOWN[tools],
            modules=", ".join([*sorted(ALLOWED_MODULES), *libraries]),
        )
    else:
        raise ValueError(f"unknown action type {action_type!r}")
    # replace, not format: the intro holds the answer format's literal braces.
    intro = (
        _REACT_INTRO.replace("<CONTENT>", _CONTENT[tools])
        .replace("<FIRST_DAY>", first_day_text(first_day))
        .replace("<API>", api_description(tools))
    )
    return intro + action + _REACT_END.format(max_steps=max_steps, evidence=_EVIDENCE[tools])


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


def extraction_messages(query: str, info: str, tools: str | None, first_day: date | None) -> list[dict[str, str]]:
    """Mode mirai: the request that extracts the answer from the end of an episode (one user
    message, as MIRAI sends it). ``tools`` None: a Direct/CoT episode, which had no database."""
    if tools is None:
        database = "No database was used: the forecast comes from the model's own knowledge."
    else:
        database = f"The database holds {_CONTENT[tools]} from {first_day_text(first_day)} up to the last visible day."
    text = _EXTRACTION.format(query=query, database=database, info=info or "(nothing)", answer_format=_ANSWER_FORMAT)
    return [{"role": "user", "content": text}]
