"""What an LLM agent's episode is made of: the query it answers, the spec it runs by (AgentSpec),
each model call as a Step and the episode as a Trajectory (what trajectories.jsonl stores), and
the one way a step's model call is made and recorded. Direct/CoT, native ReAct
(pipeline/evaluation/agents.py) and mode mirai (pipeline/evaluation/mirai_mode.py) all build on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import date

from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB
from pipeline.evaluation.llm import ChatClient, LLMError, Reply

# What cost an episode (part of) its work, its ``failure`` (docs/evaluate-your-agent.md, "Failed
# episodes"): "transport", no completion came through (LLMError.transport: connection refused or
# reset, a timeout, 429 or 5xx after the retries), which every later run of the same command runs
# again; "request", the endpoint refused a request (another 4xx); "environment", the code sandbox
# failed or the query's cutoff has no database; "harness", an exception in the harness itself.
FAILURES = ("transport", "request", "environment", "harness")
CONSECUTIVE_LIMIT = 3  # MIRAI D.1: three consecutive invalid (or repeated) actions end an episode
STOP = ["Observation:"]  # the model must not write the environment's reply itself


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
    failure: str | None = None  # the first of FAILURES the episode met; None: none

    def failed(self, kind: str) -> None:
        """Note a failure of FAILURES; the first one met is the episode's."""
        self.failure = self.failure or kind

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


def call_model(client: ChatClient, messages: list[dict], spec: AgentSpec) -> Reply:
    """One model call of an episode, at the spec's temperature and token limit, stopped at STOP."""
    return client.chat(messages, temperature=spec.temperature, max_tokens=spec.max_tokens, stop=STOP)


def record_reply(step: Step, reply: Reply) -> None:
    """The reply's text, token counts and latency on its step."""
    step.reply, step.tokens_in, step.tokens_out, step.latency_s = (
        reply.text,
        reply.tokens_in,
        reply.tokens_out,
        reply.latency_s,
    )


def llm_failure(exc: LLMError) -> str:
    """The FAILURES kind of a model call that failed."""
    return "transport" if exc.transport else "request"


def run_again(record: dict, retry_failed: bool) -> bool:
    """Whether an episode's stored record is run again rather than reused: a transport failure
    always; any failure with ``retry_failed`` (end state "error" in records from before
    ``failure`` was recorded)."""
    failure = record.get("failure")
    return failure == "transport" or (retry_failed and (failure is not None or record.get("end_state") == "error"))
