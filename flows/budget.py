"""The run budget: wall time, cost (model plus VM-hours) and tokens, shared by the lanes."""

from __future__ import annotations

import threading
import time
from adapters.benchmark import BenchmarkResult
from adapters.store.duckdb_store import ResultStore
from adapters.vms.pool import VMPool
from flows.run_config import SuiteRunConfig


class RunBudget:
    """The run's spending so far, shared by the lanes; `exhausted()` says whether to stop.

    Once a limit is reached the reason sticks: the run stays stopped even if, say, a later
    reading would differ.
    """

    def __init__(self, config: SuiteRunConfig, *, prior_cost_usd: float = 0.0, prior_tokens: int = 0) -> None:
        self.config = config
        self.started = time.monotonic()
        self.model_cost_usd = prior_cost_usd
        self.tokens = prior_tokens
        self.pool: VMPool | None = None
        self.reason: str | None = None
        self.unpriced: list[str] = []  # models called without a known price: the cost is then not known
        self._lock = threading.Lock()

    @classmethod
    def for_run(cls, config: SuiteRunConfig, store: ResultStore, run_id: str) -> RunBudget:
        """A budget that counts the cost and tokens of the run's attempts already stored."""
        cost, tokens, unpriced = 0.0, 0, False
        for row in store.results(run_id):
            cost += row.get("cost_usd") or 0.0
            cost += (row.get("vm_seconds") or 0.0) / 3600.0 * config.vm_hour_price_usd
            tokens += (row.get("input_tokens") or 0) + (row.get("output_tokens") or 0)
            unpriced = unpriced or (bool(row.get("model_calls")) and row.get("cost_usd") is None)
        budget = cls(config, prior_cost_usd=cost, prior_tokens=tokens)
        if unpriced:
            budget.unpriced.append(config.agent_options.model or config.agent)
        return budget

    def add(self, result: BenchmarkResult) -> None:
        usage = result.usage
        if usage is None:
            return
        with self._lock:
            self.model_cost_usd += usage.cost_usd
            self.tokens += usage.input_tokens + usage.output_tokens
            self.unpriced.extend(m for m in usage.unpriced if m not in self.unpriced)

    def cost_usd(self) -> float:
        vm_seconds = self.pool.usage.billed_seconds() if self.pool is not None else 0.0
        return self.model_cost_usd + vm_seconds / 3600.0 * self.config.vm_hour_price_usd

    def exhausted(self) -> str | None:
        """Why the run must stop taking work, or None while it is within budget."""
        with self._lock:
            if self.reason is not None:
                return self.reason
            c = self.config
            elapsed = time.monotonic() - self.started
            cost = self.cost_usd()
            if c.max_wall_seconds is not None and elapsed >= c.max_wall_seconds:
                self.reason = f"wall-clock budget of {c.max_wall_seconds:g} s reached ({elapsed:.1f} s)"
            elif c.max_cost_usd is not None and cost >= c.max_cost_usd:
                self.reason = f"cost budget of ${c.max_cost_usd:g} reached (${cost:.4f})"
            elif c.max_tokens is not None and self.tokens >= c.max_tokens:
                self.reason = f"token budget of {c.max_tokens} reached ({self.tokens})"
            return self.reason
