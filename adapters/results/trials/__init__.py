"""Statistics of repeated trials (the same task run several times per run): estimates, paired
comparisons, planning, the adaptive model-update design and flaky tasks. Estimands, methods and
citations: docs/statistics.md. Needs SciPy (the `stats` extra), imported when first used.

    estimates.py   group_trials, suite_rate (two estimands), pass_at_k, pass_hat_k
    paired.py      compare_trials / compare_trial_rows: per-task differences, interval, test, MDE
    planning.py    trial_variance, plan_mde, design_mde: the MDE of a design before a run (`arena plan`)
                   and of one that was run, by simulating the verdict the product runs
    adaptive.py    AdaptiveState, next_batch, record, decide, fixed_design_cost (needs numpy)
    adaptive_limits.py  the adaptive design's smallest batch (2) and why, without numpy
    report.py      the run's K, headline and pass@K / pass^K lines for summaries and reports
    flaky.py       task_stability, flaky_tasks
    simulation.py  simulated outcomes with known probabilities (tests and bench/)
"""

from adapters.results.trials._scipy import StatsExtraMissing
from adapters.results.trials.estimates import (
    ESTIMANDS,
    Estimand,
    PassAtK,
    SuiteRate,
    TaskTrials,
    TrialRowError,
    group_trials,
    pass_at_k,
    pass_hat_k,
    suite_rate,
)
from adapters.results.trials.flaky import TaskStability, flaky_tasks, task_stability
from adapters.results.trials.paired import TrialComparison, compare_trial_rows, compare_trials
from adapters.results.trials.planning import PlannedMDE, TrialVariance, plan_mde, trial_variance

__all__ = [
    "ESTIMANDS", "Estimand", "PassAtK", "PlannedMDE", "StatsExtraMissing", "SuiteRate", "TaskStability", "TaskTrials",
    "TrialComparison", "TrialRowError", "TrialVariance", "compare_trial_rows", "compare_trials", "flaky_tasks",
    "group_trials", "pass_at_k", "pass_hat_k", "plan_mde", "suite_rate", "task_stability", "trial_variance",
]
