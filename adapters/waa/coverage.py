"""Which tasks of a suite this product can run end to end: setup steps, getters and metrics."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.benchmark import BenchmarkTask
from adapters.waa.evaluator import unsupported_names
from adapters.waa.setup_steps import STEP_HANDLERS


@dataclass(frozen=True)
class TaskCoverage:
    task_id: str
    domain: str
    missing_steps: tuple[str, ...]
    missing_evaluator: tuple[str, ...]

    @property
    def supported(self) -> bool:
        return not self.missing_steps and not self.missing_evaluator

    @property
    def reason(self) -> str:
        parts = []
        if self.missing_steps:
            parts.append("setup steps " + ", ".join(self.missing_steps))
        if self.missing_evaluator:
            parts.append("getters/metrics " + ", ".join(self.missing_evaluator))
        return "unsupported " + "; ".join(parts) if parts else "supported"


def task_coverage(task: BenchmarkTask) -> TaskCoverage:
    """What a task needs that is not implemented (config and postconfig steps, evaluator names)."""
    steps = task.setup_steps + list(task.evaluation_spec.get("postconfig") or [])
    missing_steps = dict.fromkeys(
        str(s.get("type")) for s in steps if isinstance(s, dict) and s.get("type") not in STEP_HANDLERS
    )
    return TaskCoverage(
        task_id=task.task_id,
        domain=task.domain,
        missing_steps=tuple(missing_steps),
        missing_evaluator=tuple(unsupported_names(task.evaluation_spec)),
    )


def format_coverage(coverages: list[TaskCoverage], *, per_task: bool = False) -> str:
    """Totals by domain, then (with per_task, or for every unsupported task) the reasons."""
    domains: dict[str, list[TaskCoverage]] = {}
    for c in coverages:
        domains.setdefault(c.domain, []).append(c)
    lines = [f"{'domain':<22} {'tasks':>5} {'supported':>9}"]
    for domain, items in domains.items():
        lines.append(f"{domain:<22} {len(items):>5} {sum(c.supported for c in items):>9}")
    supported = sum(c.supported for c in coverages)
    lines.append(f"{'total':<22} {len(coverages):>5} {supported:>9}")
    shown = [c for c in coverages if per_task or not c.supported]
    if shown:
        lines.append("")
        lines.extend(f"{c.domain}/{c.task_id}: {c.reason}" for c in shown)
    return "\n".join(lines)
