"""Before a run: `arena plan` (time and cost), `arena doctor` (checks with fixes) and `arena probe`
(a WAA server layer by layer). They read and check; none of them runs a flow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from flows.cli.common import (AGENT_CHOICES, CLOUD_CONFIG_HELP, DB_HELP, EXIT_FAILED, EXIT_OVER_BUDGET, default_db,
                              invoked_as, store_location)
from flows.cli.deployments import SERVED_DEPLOYMENTS


def _plan(args: argparse.Namespace) -> int:
    from adapters.results.plan import make_plan
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

    suite = args.suite or bundled_suite_dir()
    if not suite.is_dir():
        raise ValueError(f"--suite {suite}: not a directory")
    catalog = WAATaskCatalog(suite, difficulty=args.difficulty)
    tasks = catalog.tasks(domains=args.domain or None, ids=args.task or None)
    if not tasks:
        raise ValueError(f"no task of {suite} matches the selection")
    ids = [t.task_id for t in tasks]
    if args.trials is not None and args.trials < 1:
        raise ValueError(f"--trials {args.trials}: must be at least 1")
    if args.baseline_rate is not None and not 0 <= args.baseline_rate <= 1:
        raise ValueError(f"--baseline-rate {args.baseline_rate}: must be between 0 and 1")
    expected: dict[str, float] = {}
    costs: dict[str, float] = {}
    history = None
    if isinstance(args.db, str) or args.db.exists():  # no results file yet: nothing is known
        from adapters.store.duckdb_store import ResultStore

        with ResultStore(args.db, read_only=True) as store:
            expected, costs = store.expected_seconds(ids, args.agent), store.expected_cost(ids, args.agent)
            if args.trials is not None:
                from adapters.results.trials.history import planning_history

                history = planning_history(store, ids, args.agent)
    trials = args.trials or 1  # every trial is one more episode of its task: time and cost scale with them
    plan = make_plan(ids, expected, costs, args.pool_size, args.vm_hour_price, trials)
    print(plan.render())
    if args.trials is not None:
        print(_detectable_difference(len(ids), args.trials, args.baseline_rate, history))
    if args.max_cost is not None and plan.cost_usd > args.max_cost:
        print(f"refused: the estimated cost ${plan.cost_usd:.2f} is above --max-cost ${args.max_cost:.2f}",
              file=sys.stderr)
        return EXIT_OVER_BUDGET
    return 0


def _detectable_difference(tasks: int, trials: int, baseline_rate: float | None, history: Any) -> str:
    """The plan's line for `--trials`: the smallest difference the design detects at 80 % power
    (adapters/results/trials/planning.py), from the baseline's rate and the trial-to-trial
    variance earlier runs of the agent showed, or stated defaults."""
    from adapters.results.trials.planning import plan_mde

    rate, source = baseline_rate, "--baseline-rate"
    if rate is None and history is not None and history.baseline_rate is not None:
        rate, source = history.baseline_rate, f"earlier runs of the agent ({history.runs})"
    if rate is None:
        rate, source = 0.5, "the default 0.5 (no earlier run of the agent on these tasks; set --baseline-rate)"
    planned = plan_mde(tasks, trials, rate, None if history is None else history.variance)
    return f"  {planned.render()}; baseline rate from {source}"


def _doctor(args: argparse.Namespace) -> int:
    """Preflight checks, one line each; exit 1 when any fails."""
    from prefect.settings import PREFECT_API_URL

    from adapters.agents import AgentOptions
    from flows.doctor import (check_cloud, check_model, check_prefect, check_store, check_store_role,
                              check_waa_server, find_running_servers, local_server_lines, stop_local_servers)

    from prefect.settings import PREFECT_HOME

    home = Path(PREFECT_HOME.value())
    if args.stop_local_servers is not None:
        lines, stopped = stop_local_servers(args.stop_local_servers, home)
        print("\n".join(lines))
        return 0 if stopped else EXIT_FAILED
    options = AgentOptions(**{k: v for k, v in {
        "model": args.model, "base_url": args.base_url, "api_key_env": args.api_key_env,
    }.items() if v is not None})
    checks = [check_store(args.db), *check_store_role(args.db),
              *check_prefect(PREFECT_API_URL.value(), SERVED_DEPLOYMENTS)]
    arena = invoked_as()
    checks += [check_waa_server(url, arena) for url in args.waa_url or []]
    checks += check_model(args.agent, options) if args.agent else []
    if args.provider:
        checks += check_cloud(args.provider, args.config, args.pool_size, args.warm_pool, args.egress_url, arena=arena)
    for check in checks:
        print(check.line(), flush=True)
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    print("\n".join(local_server_lines(find_running_servers(), arena=arena,
                                        home=None if args.all_local_servers else home)))
    return EXIT_FAILED if failed else 0


def _probe(args: argparse.Namespace) -> int:
    from adapters.secrets import redact_url, refuse_url_secret
    from adapters.waa.client import WAAClient
    from adapters.waa.probe import format_probe, probe_server

    refuse_url_secret(args.url, f"the WAA server URL {redact_url(args.url)!r}", "leave it out")
    client = WAAClient(args.url, read_retries=1)
    results = probe_server(client, ready_deadline=args.wait)
    print(format_probe(args.url, results))
    return 0 if all(r.ok for r in results) else 1


def add_probe(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena probe URL`."""
    probe = sub.add_parser("probe", help="check a WAA server layer by layer")
    probe.add_argument("url", help="the WAA server, e.g. http://127.0.0.1:5000")
    probe.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the server to become ready")
    probe.set_defaults(func=_probe)


def add_doctor(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena doctor`."""
    from adapters.vms.defaults import DEFAULT_EGRESS_URL


    doctor = sub.add_parser("doctor", help="preflight checks with fixes: store, Prefect server and deployments, "
                            "WAA servers, model endpoint, cloud (credentials, quota, image, address)")
    doctor.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    doctor.add_argument("--waa-url", action="append", help="a WAA server to check (repeatable)")
    doctor.add_argument("--agent", choices=AGENT_CHOICES, help="check this agent's model endpoint and API key")
    doctor.add_argument("--model", help="the model the endpoint must serve")
    doctor.add_argument("--base-url", help="model API base URL (default: the vendor's)")
    doctor.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    doctor.add_argument("--provider", choices=["aws", "azure"],
                        help="check this cloud: credentials, sizes and quota, image, controller address")
    doctor.add_argument("--config", type=Path, help=CLOUD_CONFIG_HELP)
    doctor.add_argument("--pool-size", type=int, default=4, help="the pool the quota must hold (default 4)")
    doctor.add_argument("--warm-pool", metavar="NAME", help="also check that this warm pool's running VMs answer")
    doctor.add_argument("--egress-url", default=DEFAULT_EGRESS_URL,
                        help=f"a service answering with this host's public IP (default {DEFAULT_EGRESS_URL})")
    doctor.add_argument("--stop-local-servers", nargs="*", type=int, metavar="PORT",
                        help="stop the local Prefect servers arena run started on these ports (without a port: "
                        "the one of this PREFECT_HOME), then exit; runs using them lose their server")
    doctor.add_argument("--all-local-servers", action="store_true",
                        help="list the local servers of every Prefect home of this user, not only this one's")
    doctor.set_defaults(func=_doctor)


def add_plan(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena plan`."""
    plan = sub.add_parser("plan", help="estimated wall time and cost of a run, from recorded durations, before it starts")
    plan.add_argument("--suite", type=Path, help="a WAA task directory (default: the bundled suite)")
    plan.add_argument("--difficulty", choices=["normal", "hard"], default="normal")
    plan.add_argument("--domain", action="append", help="only this domain (repeatable)")
    plan.add_argument("--task", action="append", help="only this task id (repeatable)")
    plan.add_argument("--agent", choices=AGENT_CHOICES, default="scripted", help="whose recorded durations to prefer")
    plan.add_argument("--pool-size", type=int, default=4, help="number of VMs (default 4)")
    plan.add_argument("--vm-hour-price", type=float, default=0.0, help="USD per VM-hour (default 0)")
    plan.add_argument("--max-cost", type=float, help="USD: exit 4 when the estimate is above it")
    plan.add_argument(
        "--trials", type=int, metavar="K",
        help="plan K trials per task: time and cost for every trial, and the smallest difference such a comparison "
        "detects at 80%% power (baseline rate and trial-to-trial variance from earlier runs of --agent)",
    )
    plan.add_argument("--baseline-rate", type=float, metavar="P",
                      help="with --trials: the baseline's success rate to plan with (default: from earlier runs)")
    plan.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    plan.set_defaults(func=_plan)
