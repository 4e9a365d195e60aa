"""Agents that choose actions from observations; `build_agent` makes one from its CLI name.

    scripted  follows the suite's solution plans (solutions.json)
    random    random clicks, keys and text (the floor)
    claude    Claude with the computer-use tool (anthropic SDK)
    openai    a prompting agent on any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang)
    anthropic the same prompting agent on Claude through the anthropic SDK
    demo      the prompting agent with a retrieved demonstration in its prompt
    http      your own policy behind an HTTP endpoint (docs/http_policy.md)
    noisy-scripted  TEST AGENT: the scripted agent failing each task with a known probability,
              for checking the statistics of repeated trials (never for results)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from adapters.registry import Registry
from adapters.secrets import refuse_url_secret

# `arena run --help` reads the table's names: each agent's module loads when it is built.
if TYPE_CHECKING:
    from adapters.benchmark import BenchmarkAgent


class AgentOptions(BaseModel):
    """Everything an agent can be configured with from the CLI or a deployment (no secrets:
    API keys are read from the environment variable named by `api_key_env`)."""

    plans_path: Path | None = None
    seed: int = 0
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    observation: Literal["screenshot", "a11y_tree", "screenshot_a11y_tree", "som"] | None = None
    prices_path: Path | None = None
    tool_version: str | None = None
    demo_library: Path | None = None
    demo_retriever: Literal["lexical", "embedding"] = "lexical"
    demo_backend: Literal["openai", "anthropic"] = "openai"
    # The retriever may hand a task a demo recorded on that very task (a leak in evaluation;
    # meant for checking a library built with `arena demos build`).
    demo_allow_same_task: bool = False
    policy_url: str | None = None
    policy_headers_env: dict[str, str] = Field(default_factory=dict)
    # noisy-scripted (a test agent): each task's success probability, from a JSON/TOML file of
    # task id -> p, and the default for tasks the file does not name.
    success_probability: float | None = Field(default=None, ge=0, le=1)
    success_probabilities_path: Path | None = None

    @field_validator("base_url", "policy_url")
    @classmethod
    def _no_secret_in_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A key in the URL would be shown in the Prefect UI and stored with the run.
        option = "--base-url" if info.field_name == "base_url" else "--policy-url"
        if value is not None:
            refuse_url_secret(value, option, "pass keys through the variable --api-key-env (or --policy-header-env) "
                              "names instead")
        return value


def _model_overrides(options: AgentOptions) -> dict[str, Any]:
    fields = {
        "model": options.model,
        "base_url": options.base_url,
        "api_key_env": options.api_key_env,
        "prices": str(options.prices_path) if options.prices_path else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _prompting_agent(backend: str, options: AgentOptions) -> BenchmarkAgent:
    from adapters.agents.prompting import PromptingAgent

    overrides = _model_overrides(options)
    if options.observation:
        overrides["observation"] = options.observation
    return PromptingAgent(backend=backend, **overrides)


AGENTS: Registry[Callable[[AgentOptions], BenchmarkAgent]] = Registry("agent")
"""Agent builders by CLI name; a new agent registers one here (and lives in its own module)."""


@AGENTS.register("scripted")
def _scripted(options: AgentOptions) -> BenchmarkAgent:
    from adapters.agents.scripted import ScriptedAgent, load_plans

    if options.plans_path is None:
        raise ValueError("the scripted agent needs a plans file (solutions.json)")
    return ScriptedAgent(load_plans(options.plans_path))


@AGENTS.register("random")
def _random(options: AgentOptions) -> BenchmarkAgent:
    from adapters.agents.random_agent import RandomAgent

    return RandomAgent(seed=options.seed)


@AGENTS.register("claude")
def _claude(options: AgentOptions) -> BenchmarkAgent:
    from adapters.agents.claude_computer_use import ClaudeComputerUseAgent

    overrides = _model_overrides(options)
    if options.tool_version:
        overrides["tool_version"] = options.tool_version
    return ClaudeComputerUseAgent(**overrides)


@AGENTS.register("openai")
def _openai(options: AgentOptions) -> BenchmarkAgent:
    return _prompting_agent("openai", options)


@AGENTS.register("anthropic")
def _anthropic(options: AgentOptions) -> BenchmarkAgent:
    return _prompting_agent("anthropic", options)


@AGENTS.register("demo")
def _demo(options: AgentOptions) -> BenchmarkAgent:
    from adapters.agents.demo_conditioned import DemoConditionedAgent
    from adapters.agents.demos import DEFAULT_DEMO_LIBRARY, EmbeddingDemoRetriever, LexicalDemoRetriever

    library = options.demo_library or DEFAULT_DEMO_LIBRARY
    retriever_class = LexicalDemoRetriever if options.demo_retriever == "lexical" else EmbeddingDemoRetriever
    retriever = retriever_class.from_directory(library, allow_same_task=options.demo_allow_same_task)
    return DemoConditionedAgent(_prompting_agent(options.demo_backend, options), retriever)


@AGENTS.register("http")
def _http(options: AgentOptions) -> BenchmarkAgent:
    from adapters.agents.http_policy import HttpPolicyAgent

    if not options.policy_url:
        raise ValueError("the http agent needs --policy-url")
    return HttpPolicyAgent(options.policy_url, headers_from_env=options.policy_headers_env or None)


@AGENTS.register("noisy-scripted")
def _noisy_scripted(options: AgentOptions) -> BenchmarkAgent:
    """TEST AGENT for the statistics of repeated trials (adapters/agents/noisy_scripted.py)."""
    from adapters.agents.noisy_scripted import DEFAULT_SUCCESS_PROBABILITY, NoisyScriptedAgent, load_probabilities
    from adapters.agents.scripted import load_plans

    if options.plans_path is None:
        raise ValueError("the noisy-scripted test agent needs a plans file (solutions.json)")
    probabilities = load_probabilities(options.success_probabilities_path) if options.success_probabilities_path else {}
    default = DEFAULT_SUCCESS_PROBABILITY if options.success_probability is None else options.success_probability
    return NoisyScriptedAgent(load_plans(options.plans_path), probabilities, default, seed=options.seed)


AGENT_NAMES: tuple[str, ...] = tuple(AGENTS)
# The agents that call a model (their `model` and `base_url` options mean something): only these
# can be pointed at a new checkpoint.
MODEL_AGENTS: frozenset[str] = frozenset({"claude", "openai", "anthropic", "demo"})

DETERMINISTIC_AGENTS: frozenset[str] = frozenset({"scripted", "random"})
"""Agents whose actions are fixed by their configuration (plans; seed per task): when one of them
gets different outcomes on the same task version, the environment varied, not the agent."""


def build_agent(name: str, options: AgentOptions | None = None) -> BenchmarkAgent:
    """An agent by its CLI name; unknown names or missing settings raise ValueError naming them."""
    return AGENTS.lookup(name)(options or AgentOptions())
